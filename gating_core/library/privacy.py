"""Which FCS keywords can identify a person, and how exports leave them out.

The library keeps every keyword of an imported file (the lab may need them to trace a sample),
but anything that leaves the product -- ``library export``, the app's download buttons and its
zip, the Python API's :func:`gating_core.export.export_sample` -- drops the keywords listed here
unless the caller asks for them (``include_identifying=True``, ``--include-identifying``). The
list errs on the side of dropping: losing an operator name in an export costs nothing, leaking
a patient name costs a lot. The yardstick is the HIPAA Safe Harbor list of identifiers (names,
dates other than the year, record / account / device numbers, any other unique code) applied to
what instruments and LIMS actually write into FCS files.

Left out of exports, and why:

* names and free text that labs fill with patient or study data: ``$SRC`` (specimen source),
  ``$SMNO`` (specimen number), ``$CELLS``, ``$COM``, ``$PROJ``, ``$EXP`` (investigator),
  ``$OP`` / operator / user names (``EXPORT USER NAME``), ``$INST`` (institution),
  ``$LAST_MODIFIER``; vendor keywords such as ``SAMPLE ID``, ``SAMPLE NAME``, ``PATIENT ID``,
  ``CASE NUMBER``, ``TUBE NAME``, ``EXPERIMENT NAME``, accession numbers, MRN, birth dates;
* file names (``$FIL``, ``FILENAME``, ``$EXPFILENAME``): often built from patient names or
  record numbers;
* dates and times of acquisition or export: ``$DATE``, ``$BTIM``, ``$ETIM``,
  ``$LAST_MODIFIED``, ``EXPORT TIME`` and any keyword whose name contains ``DATE`` (a date of
  service is an identifier; a start time pins the sample to one run of one instrument);
* instrument and plate identifiers: ``$CYTSN`` (serial number: a device identifier that,
  with a date, narrows the sample down to one lab and one run), ``$PLATENAME``, ``$PLATEID``,
  ``$WELLID`` (plate maps in the LIMS link a well to a patient), file ``GUID`` s.

Kept: instrument model (``$CYT``), software (``CREATOR``, ``$SYS``), acquisition settings
(voltages, lasers, ``$TIMESTEP``, spillover), which describe the measurement, not the person.

Matching ignores case, a leading ``$`` and any spaces, underscores, dashes or dots, so that
``$PATIENTID``, ``PATIENT ID`` and ``Patient_Id`` are one keyword; a keyword whose normalised
name contains one of :data:`IDENTIFYING_FRAGMENTS` (``PATIENT``, ``SAMPLE``, ``TUBE``, ``DATE``,
...) is identifying too, so a vendor's variant of a listed keyword is caught as well.
"""

from __future__ import annotations

import re

# Standard FCS keywords (FCS 3.1 table of keywords) that name a person, a place, a free-text
# note, a file name, a date or time, or an instrument or plate identifier.
STANDARD_IDENTIFYING = (
    "$SRC",          # specimen source: often the patient name or number
    "$FIL",          # original file name
    "$SMNO",         # specimen (sample) number
    "$OP",           # operator name
    "$EXP",          # investigator name
    "$INST",         # institution (with a date, narrows a patient down)
    "$COM",          # free-text comment
    "$DATE",         # date of acquisition (a date of service under HIPAA)
    "$BTIM",         # clock time acquisition began (with $DATE: one run)
    "$ETIM",         # clock time acquisition ended
    "$LAST_MODIFIED",  # date and time of the last change
    "$LAST_MODIFIER",  # person who changed the file
    "$CELLS",        # free-text description of the specimen
    "$PROJ",         # project names often carry study or subject codes
    "$CYTSN",        # instrument serial number (a device identifier)
    "$PLATENAME",    # plate name: plate maps link wells to patients
    "$PLATEID",
    "$WELLID",       # well of the plate the sample was in
)

# Vendor and lab keywords seen in the wild (BD FACSDiva, Beckman Kaluza, Cytek, custom LIMS
# exports) whose name says what they hold.
VENDOR_IDENTIFYING = (
    "PATIENT ID", "PATIENTID", "PATIENT", "PATIENT NAME", "$PATIENTID", "$PATIENT",
    "SAMPLE ID", "SAMPLE NAME", "SUBJECT", "SUBJECT ID", "DONOR", "DONOR ID",
    "$EXPFILENAME", "EXPORT USER NAME", "EXPORT TIME", "USER", "USERNAME", "OPERATOR",
    "TUBE NAME", "EXPERIMENT NAME", "CASE ID", "CASE NUMBER", "ACCESSION", "MRN",
    "DOB", "BIRTHDATE", "DATE OF BIRTH", "FILENAME", "ORIGINAL FILENAME", "$ORIGINALFILENAME",
    "GUID", "$GUID", "SPECIMEN", "BARCODE",
)

# Any keyword whose normalised name contains one of these is treated as identifying too.
IDENTIFYING_FRAGMENTS = (
    "PATIENT", "SUBJECT", "DONOR", "BIRTH", "MRN", "ACCESSION", "OPERATOR", "USER",
    "FILENAME", "PHYSICIAN", "DOCTOR", "ADDRESS", "PHONE", "EMAIL", "SSN", "INSURANCE",
    "SAMPLE", "SPECIMEN", "CASE", "TUBE", "EXPERIMENT", "DATE", "PLATE", "WELL", "BARCODE",
)


def _normalise(keyword: str) -> str:
    return re.sub(r"[\s_.\-]+", "", keyword.lstrip("$")).upper()


_EXACT = frozenset(_normalise(k) for k in STANDARD_IDENTIFYING + VENDOR_IDENTIFYING)


def is_identifying(keyword: str) -> bool:
    """True when an FCS keyword may identify a person (see the module docstring)."""
    key = _normalise(keyword)
    if key in _EXACT:
        return True
    return any(fragment in key for fragment in IDENTIFYING_FRAGMENTS)


def strip_identifying(keywords: dict[str, str]) -> dict[str, str]:
    """Copy of ``keywords`` without the identifying ones."""
    return {k: v for k, v in keywords.items() if not is_identifying(k)}


def identifying_keys(keywords: dict[str, str]) -> list[str]:
    """The keys of ``keywords`` that :func:`is_identifying` flags, in their order."""
    return [k for k in keywords if is_identifying(k)]
