"""Which FCS keywords can identify a person, and how exports leave them out.

The library keeps every keyword of an imported file (the lab may need them to trace a sample),
but anything that leaves the library drops the keywords listed here unless the user asks for
them. The list errs on the side of dropping: losing an operator name in an export costs
nothing, leaking a patient name costs a lot.

Matching ignores case, a leading ``$`` and any spaces, underscores, dashes or dots, so that
``$PATIENTID``, ``PATIENT ID`` and ``Patient_Id`` are one keyword.
"""

from __future__ import annotations

import re

# Standard FCS keywords (FCS 3.1 table of keywords) that name a person, a place, a free-text
# note, or a file name (file names are often built from patient names or record numbers).
STANDARD_IDENTIFYING = (
    "$SRC",          # specimen source: often the patient name or number
    "$FIL",          # original file name
    "$SMNO",         # specimen (sample) number
    "$OP",           # operator name
    "$EXP",          # investigator name
    "$INST",         # institution (with a date, narrows a patient down)
    "$COM",          # free-text comment
    "$DATE",         # date of acquisition (a date of service under HIPAA)
    "$LAST_MODIFIER",
    "$CELLS",        # free-text description of the specimen
    "$PROJ",         # project names often carry study or subject codes
)

# Vendor and lab keywords seen in the wild (BD FACSDiva, Beckman Kaluza, Cytek, custom LIMS
# exports) whose name says what they hold.
VENDOR_IDENTIFYING = (
    "PATIENT ID", "PATIENTID", "PATIENT", "PATIENT NAME", "$PATIENTID", "$PATIENT",
    "SAMPLE ID", "SAMPLE NAME", "SUBJECT", "SUBJECT ID", "DONOR", "DONOR ID",
    "$EXPFILENAME", "EXPORT USER NAME", "USER", "USERNAME", "OPERATOR",
    "TUBE NAME", "EXPERIMENT NAME", "CASE ID", "CASE NUMBER", "ACCESSION", "MRN",
    "DOB", "BIRTHDATE", "DATE OF BIRTH", "FILENAME", "ORIGINAL FILENAME", "$ORIGINALFILENAME",
)

# Any keyword whose normalised name contains one of these is treated as identifying too.
IDENTIFYING_FRAGMENTS = (
    "PATIENT", "SUBJECT", "DONOR", "BIRTH", "MRN", "ACCESSION", "OPERATOR", "USER",
    "FILENAME", "PHYSICIAN", "DOCTOR", "ADDRESS", "PHONE", "EMAIL", "SSN", "INSURANCE",
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
