"""Model files in and out of the app (npz + JSON, never pickle)."""

from __future__ import annotations

import uuid
from pathlib import Path


def model_bytes(model, work_dir) -> bytes:
    """The model as the bytes of its .npz file (same format as the command line writes)."""
    path = Path(work_dir) / f"model-{uuid.uuid4().hex}.npz"
    try:
        model.save(path)
        return path.read_bytes()
    finally:
        path.unlink(missing_ok=True)


def load_model_bytes(data: bytes, work_dir, name: str | None = None):
    """A GatingModel or an IWNystroemGatingModel (whichever the file holds, read by
    :func:`gating_core.model.iw_model.load_any_model`: checked, no pickle) from uploaded bytes,
    written under a generated name first. A problem is a ModelFileError naming ``name`` (the
    uploaded file's name, shown only; never a path) rather than the generated one."""
    from gating_core.model.file_checks import ModelFileError
    from gating_core.model.iw_model import load_any_model

    path = Path(work_dir) / f"upload-{uuid.uuid4().hex}.npz"
    path.write_bytes(data)
    try:
        return load_any_model(path)
    except ModelFileError as exc:
        if name is None:
            raise
        raise ModelFileError(Path(str(name)).name or "model file", exc.problem) from None
    finally:
        path.unlink(missing_ok=True)


def model_channel_labels(model) -> list[str]:
    """The model's channels as people name them: marker with detector ("CD4 (FL3-A)")."""
    from gating_core.reports.plotting import channel_label

    markers = list(getattr(model, "channel_markers_", None) or [])
    markers += [""] * (len(model.channels_) - len(markers))
    return [channel_label(pnn, pns) for pnn, pns in zip(model.channels_, markers)]
