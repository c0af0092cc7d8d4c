"""The persistent patient library: SQLite catalog (WAL) + Parquet files + audit log.

    from gating_core.library import PatientLibrary
    lib = PatientLibrary("workspace")          # or $GATING_LIBRARY, default ./workspace
    lib.import_files(["p1.fcs", "p2.gated.csv"])
    samples, labels = lib.load_training_set()

See :mod:`gating_core.library.patient_library` for how changes stay atomic and which module
holds which part (patients, importing, labels, gates, models, results, audit).
"""

from gating_core.library.common import (
    ConflictError,
    DEFAULT_LIBRARY,
    LIBRARY_ENV,
    LibraryError,
    Provenance,
    default_library_path,
    normalise_name,
)
from gating_core.library.models import ModelInfo
from gating_core.library.patient_library import PatientLibrary
from gating_core.library.patients import PatientInfo
from gating_core.library.results import GateResultRecord
from gating_core.library.privacy import identifying_keys, is_allowed, is_identifying, strip_identifying

__all__ = [
    "ConflictError", "DEFAULT_LIBRARY", "LIBRARY_ENV", "GateResultRecord", "LibraryError", "ModelInfo",
    "PatientInfo", "PatientLibrary", "Provenance", "default_library_path", "normalise_name", "identifying_keys",
    "is_allowed", "is_identifying", "strip_identifying",
]
