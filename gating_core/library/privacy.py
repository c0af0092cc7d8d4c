"""Which FCS keywords an export keeps: an allow-list of what is needed to read the data.

The library keeps every keyword of an imported file (the lab may need them to trace a sample),
but anything that leaves the product -- ``library export``, ``gate --format fcs / h5ad``, the
app's download buttons, a FlowJo workspace, the Python API's
:func:`gating_core.io.export.export_sample` -- keeps only the keywords listed here. Everything else
is left out unless the caller asks: ``include_identifying=True`` (``--include-identifying``)
keeps every keyword, ``keep_keywords=[...]`` (``--keep-keyword NAME``) keeps the named ones.

Why an allow-list: instruments, LIMS and labs write whatever they like into FCS files
(``CD SEROCONVERSION DATAE``, ``CD AGE``, ``VIAL ID``, ``FINAL PIN``, ``NAME``, ``HOSPITAL
NUMBER``, ``COLLECTED``, ...). No list of identifying names can foresee them all; a list of the
keywords needed to read and interpret the events can be complete. Losing a harmless keyword in
an export costs a ``--keep-keyword``; leaking a patient's record number costs a lot.

Kept, and why:

* the data layout (``$BEGINDATA``, ``$ENDDATA``, ``$BEGINANALYSIS``, ``$ENDANALYSIS``,
  ``$BEGINSTEXT``, ``$ENDSTEXT``, ``$BYTEORD``, ``$DATATYPE``, ``$MODE``, ``$NEXTDATA``, ``$PAR``,
  ``$TOT``): needed to read the file at all (an exported FCS gets them fresh from the writer; an
  h5ad file drops the byte offsets, which would point into a file it is not);
* per channel ``$PnN`` (name), ``$PnS`` (marker), ``$PnB``, ``$PnE``, ``$PnR``, ``$PnG`` (how the
  values are stored and scaled), ``$PnV`` (voltage), ``$PnD`` (display hint), ``$PnT`` (detector
  type), ``$PnF`` (filter), ``$PnO`` (laser power), ``$PnL`` (wavelength), ``$PnP`` (percent
  light), ``$PnCALIBRATION`` (conversion to units such as MESF) and FCS 3.2's ``$PnTYPE``,
  ``$PnFEATURE``, ``$PnANALYTE``, ``$PnTAG``, ``$PnDET``: what each channel measures and the
  instrument settings it was measured with -- they describe the measurement, not the person;
* ``$TIMESTEP``: the time channel's unit;
* spillover (``$SPILLOVER``, ``SPILL``, ``$SPILL``, ``$COMP``): needed to compensate;
* ``$CYT``: the cytometer model (a product name, shared by every lab that owns one);
* ``$VOL``: the volume measured, needed to turn counts into cells per microlitre;
* ``$UNSTAINEDCENTERS``: the autofluorescence already subtracted from each channel, needed to
  interpret the values (numbers only; its free-text companion ``$UNSTAINEDINFO`` is left out);
* the product's own keywords: ``GATING_POPULATION_CHANNEL``, ``GATING_POPULATION_COUNT`` and
  ``GATING_POPULATION_<code>`` (the population channel's codes and names) and
  ``GATING_DROPPED_KEYWORDS`` / ``GATING_KEYWORD_POLICY`` (what this policy left out, below).

Left out by default, among others: ``$CYTSN`` (instrument serial number), ``$DATE``, ``$BTIM``,
``$ETIM``, ``$LAST_MODIFIED``, ``$LAST_MODIFIER``, ``$FIL``, ``$SRC``, ``$OP``, ``$INST``,
``$COM``, ``$PROJ``, ``$SMNO``, ``$EXP``, ``$CELLS``, ``$PLATEID``, ``$PLATENAME``, ``$WELLID``,
``$SYS``, ``CREATOR``, every vendor or lab keyword, and channel keywords not named above.

An export says what it left out by a COUNT only (``GATING_DROPPED_KEYWORDS`` in an FCS file,
``uns["dropped_keywords"]`` in an h5ad file, a line from the command line and the app), never by
the names: a name can identify or disclose as much as a value (``PATIENT JANE DOE``, or
``CD SEROCONVERSION DATAE``, which discloses an infection).

Matching ignores case and a leading ``$`` (FCS readers fold both: ``$CYT`` and ``cyt`` are one
keyword); nothing else is folded, so ``$CYT SN`` is not ``$CYT``.
"""

from __future__ import annotations

import re
from typing import Callable, Iterable

# Standard keywords an export keeps (names without the '$', upper case).
LAYOUT_KEYWORDS = ("BEGINANALYSIS", "ENDANALYSIS", "BEGINSTEXT", "ENDSTEXT", "BEGINDATA", "ENDDATA",
                   "BYTEORD", "DATATYPE", "MODE", "NEXTDATA", "PAR", "TOT")
# The layout keywords that are byte offsets into the FCS file they came from.
FILE_OFFSET_KEYWORDS = ("BEGINANALYSIS", "ENDANALYSIS", "BEGINSTEXT", "ENDSTEXT", "BEGINDATA", "ENDDATA",
                        "NEXTDATA")
MEASUREMENT_KEYWORDS = ("TIMESTEP", "SPILLOVER", "SPILL", "COMP", "CYT", "VOL", "UNSTAINEDCENTERS")
# Per-channel keywords $Pn<suffix> an export keeps.
CHANNEL_SUFFIXES = ("N", "S", "B", "E", "R", "G", "V", "D", "T", "F", "O", "L", "P", "CALIBRATION",
                    "TYPE", "FEATURE", "ANALYTE", "TAG", "DET")

#: The keywords an FCS export adds to say what it left out.
DROPPED_KEYWORD = "GATING_DROPPED_KEYWORDS"
POLICY_KEYWORD = "GATING_KEYWORD_POLICY"
# The product's own keywords (population channel of gating_core.io.export, the two above).
PRODUCT_KEYWORDS = re.compile(r"GATING_(POPULATION_(CHANNEL|COUNT|\d+)|DROPPED_KEYWORDS|KEYWORD_POLICY)")

#: What the default policy keeps, in words (an export's GATING_KEYWORD_POLICY; no '$' or '/':
#: some readers drop or split on them).
POLICY_NOTE = ("keywords not needed to read the data are left out (kept: data layout, channel "
               "descriptions and settings, time step, spillover, cytometer model, volume); "
               "the count is in GATING_DROPPED_KEYWORDS, the names are not listed")
ALL_KEPT_NOTE = "every keyword kept on request"
KEPT_ON_REQUEST_NOTE = "; keywords named by the user kept on request"

_ALLOWED = frozenset(LAYOUT_KEYWORDS + MEASUREMENT_KEYWORDS)
_CHANNEL = re.compile(r"P\d+(" + "|".join(sorted(CHANNEL_SUFFIXES, key=len, reverse=True)) + r")")


def _fold(keyword: str) -> str:
    return str(keyword).lstrip("$").upper()


def is_allowed(keyword: str) -> bool:
    """True when an export keeps ``keyword`` by default (see the module docstring)."""
    key = _fold(keyword)
    return key in _ALLOWED or bool(_CHANNEL.fullmatch(key)) or bool(PRODUCT_KEYWORDS.fullmatch(key))


def is_file_offset(keyword: str) -> bool:
    """True when ``keyword`` is a byte offset into the FCS file it was read from (``$BEGINDATA``,
    ...): meaningless once the events leave that file in another format."""
    return _fold(keyword) in FILE_OFFSET_KEYWORDS


def is_identifying(keyword: str) -> bool:
    """True when ``keyword`` may identify a person: every keyword that is not on the allow-list."""
    return not is_allowed(keyword)


def keep_names(keep_keywords: Iterable[str] | str | None) -> tuple[str, ...]:
    """``keep_keywords`` as a tuple of names (one name given as a string is one name)."""
    if keep_keywords is None:
        return ()
    if isinstance(keep_keywords, str):
        return (keep_keywords,)
    return tuple(str(k) for k in keep_keywords)


def keep_matcher(keep_keywords: Iterable[str] | str | None = ()) -> Callable[[str], bool]:
    """A test for the keywords a caller asked to keep (``keep_keywords``).

    Names match ignoring case and a leading ``$``; ``$PnX`` (``n`` for the channel number, e.g.
    ``$PnV`` or ``PnDET``) matches that keyword of every channel as well as the literal name.
    Raises ValueError for an empty name.
    """
    names: set[str] = set()
    suffixes: set[str] = set()
    for name in keep_names(keep_keywords):
        key = _fold(name.strip())
        if not key:
            raise ValueError(f"keyword to keep {name!r} is empty")
        names.add(key)
        channel = re.fullmatch(r"\$?P[nN]([A-Za-z][A-Za-z0-9_]*)", str(name).strip())
        if channel:
            suffixes.add(channel.group(1).upper())
    pattern = re.compile(r"P\d+(" + "|".join(map(re.escape, sorted(suffixes))) + ")") if suffixes else None

    def wanted(keyword: str) -> bool:
        key = _fold(keyword)
        return key in names or (pattern is not None and pattern.fullmatch(key) is not None)

    return wanted


def split_keywords(keywords: dict, *, include_identifying: bool = False,
                   keep_keywords: Iterable[str] | str | None = ()) -> tuple[dict, list[str]]:
    """``(kept, dropped names)``: ``keywords`` split by the export policy.

    ``include_identifying`` keeps every keyword; ``keep_keywords`` keeps the named ones (see
    :func:`keep_matcher`) beside the allow-list.
    """
    if include_identifying:
        return dict(keywords), []
    wanted = keep_matcher(keep_keywords)
    kept, dropped = {}, []
    for key, value in keywords.items():
        if is_allowed(key) or wanted(key):
            kept[key] = value
        else:
            dropped.append(key)
    return kept, dropped


def policy_note(*, include_identifying: bool = False, keep_keywords: Iterable[str] | str | None = ()) -> str:
    """The policy in words, as an export records it (``GATING_KEYWORD_POLICY``)."""
    if include_identifying:
        return ALL_KEPT_NOTE
    return POLICY_NOTE + (KEPT_ON_REQUEST_NOTE if keep_names(keep_keywords) else "")


def dropped_note(count: int) -> str:
    """The one line the command line prints for an export that left ``count`` keywords out."""
    noun = "keyword" if count == 1 else "keywords"
    return (f"dropped {count} {noun} not needed to read the data; "
            f"--include-identifying or --keep-keyword NAME to keep them")


def strip_identifying(keywords: dict[str, str]) -> dict[str, str]:
    """Copy of ``keywords`` with only the allowed ones."""
    return split_keywords(keywords)[0]


def identifying_keys(keywords: dict[str, str]) -> list[str]:
    """The keys of ``keywords`` an export leaves out by default, in their order."""
    return split_keywords(keywords)[1]
