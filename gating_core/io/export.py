"""Writing gating results: gated CSV, FCS 3.1 with a population channel, Parquet and h5ad.

The gated tables (CSV, Parquet; :class:`GatedTableWriter` chunk by chunk) are written by
:mod:`gating_core.io.gated_table`, h5ad by :mod:`gating_core.io.anndata_interop`; their names are
importable from here too.

FCS with populations: the events plus a ``population`` channel of integer codes; the keywords
``GATING_POPULATION_CHANNEL`` (the channel's name), ``GATING_POPULATION_COUNT`` (k) and
``GATING_POPULATION_<code>`` (the name of each code 0..k-1) map codes back to names. Every
exported FCS also says how many of the source's keywords the keyword policy left out
(``GATING_DROPPED_KEYWORDS``) and the policy in words (``GATING_KEYWORD_POLICY``).

Every export -- library, command line, the app's download buttons and zip -- goes through
:func:`export_sample` (or :func:`export_bytes`, its in-memory twin), so there is one keyword
policy (:func:`export_keywords`) and one guarantee: reading an exported FCS gives back exactly
the events and channels the source read gave (``read(export(read(f))) == read(f)``).
"""

from __future__ import annotations

import math
import os
import re
import uuid
from pathlib import Path
from urllib.parse import unquote

import numpy as np

from gating_core.fcs import FCSError, Sample, read_fcs, write_fcs
from gating_core.io.anndata_interop import write_gated_h5ad
from gating_core.io.gated_table import (CONFIDENCE_COLUMN, GatedTableWriter, _check_lengths, read_gated_csv,
                                        write_gated_csv, write_gated_parquet)
from gating_core.io.labels import POPULATION_COLUMN
from gating_core.library.privacy import DROPPED_KEYWORD, POLICY_KEYWORD, keep_names, policy_note, split_keywords

__all__ = ["export_sample", "export_bytes", "export_keywords", "dropped_keyword_count", "write_fcs_with_populations",
           "populations_from_sample", "read_fcs_with_populations", "POPULATION_KEYWORD",
           # the gated tables, from gating_core.io.gated_table and gating_core.io.anndata_interop
           "write_gated_csv", "read_gated_csv", "GatedTableWriter", "write_gated_parquet", "write_gated_h5ad",
           "CONFIDENCE_COLUMN"]

POPULATION_KEYWORD = "GATING_POPULATION_CHANNEL"
POPULATION_COUNT_KEYWORD = "GATING_POPULATION_COUNT"
POPULATION_NAME_KEYWORD = "GATING_POPULATION_{}"
EXPORT_FORMATS = ("csv", "fcs", "parquet", "h5ad")
# File suffix of each export format, for callers that name files (``<stem>.gated.<suffix>``).
EXPORT_SUFFIXES = {"csv": ".csv", "fcs": ".fcs", "parquet": ".parquet", "h5ad": ".h5ad"}

# Keywords an exported FCS never copies from its source: the writer sets the layout and the
# channel keywords itself ($PnG, $PnE and $PnR included: the events are written linear, gain
# already divided out, so the file declares gain 1 and no log amplification; $PnDATATYPE too:
# every channel is written in one data type); $TIMESTEP, the spillover, the population keywords
# and the keyword policy's own are rewritten from the sample.
_NOT_CARRIED = re.compile(r"^\$?((BEGIN|END)(DATA|ANALYSIS|STEXT)|BYTEORD|DATATYPE|MODE|NEXTDATA|PAR|TOT"
                          r"|P\d+([BENRSG]|DATATYPE)|TIMESTEP|SPILLOVER|SPILL|GATING_POPULATION_.*"
                          r"|GATING_DROPPED_KEYWORDS|GATING_KEYWORD_POLICY)$", re.IGNORECASE)
_CHANNEL_KEYWORD = re.compile(r"^\$?P(\d+)[A-Z]", re.IGNORECASE)


def _encode_name(name: str) -> str:
    # FlowIO's TEXT tokenizer (this project's too) drops every '$': percent-encode it (and '%'
    # itself) so every name survives exactly. '/' stays encoded as files written before the
    # writer chose its delimiter did, so readers of either kind of file decode the same way.
    return name.replace("%", "%25").replace("/", "%2F").replace("$", "%24")


def export_keywords(sample: Sample, *, include_identifying: bool = False, keep_keywords=()) -> dict[str, str]:
    """The TEXT keywords an exported FCS of ``sample`` carries (the one export policy).

    * Only the keywords needed to read and interpret the data are carried
      (:func:`gating_core.library.privacy.is_allowed`: layout, channel descriptions and settings,
      $TIMESTEP, spillover, $CYT, $VOL, $UNSTAINEDCENTERS), plus those named in
      ``keep_keywords`` (case-insensitive; ``$PnV`` for every channel's), or every keyword with
      ``include_identifying``. ``GATING_DROPPED_KEYWORDS`` holds how many were left out (the
      names are not listed: they can identify a person too) and ``GATING_KEYWORD_POLICY`` the
      policy in words.
    * Layout and channel keywords are the writer's ($PnB, $PnE, $PnG, $PnN, $PnR, $PnS, ...):
      the events are written as the reader returned them -- linear, gain divided out -- so the
      file declares $PnE 0,0 and no gain, and a reader gets the same values back. Other
      channel keywords ($PnV, $PnD, ...) are carried for the sample's own channels.
    * A time channel's values are in seconds already ($TIMESTEP applied on reading): the file
      says ``$TIMESTEP 1`` when the source had a usable $TIMESTEP, so no reader scales twice.
    * The spillover matrix is written as ``$SPILLOVER`` from the sample, and left out when the
      events are already compensated (a reader would compensate twice).
    * Empty values are dropped (FCS forbids them).
    """
    keep, dropped = _carried_keywords(sample, include_identifying, keep_keywords)
    timestep = next((str(v) for k, v in sample.keywords.items() if k.lstrip("$").upper() == "TIMESTEP"), "")
    has_time = any(c.pnn.strip().lower() == "time" for c in sample.channels)
    if has_time and _usable_timestep(timestep):
        keep["$TIMESTEP"] = "1"
    if sample.spillover is not None and not sample.compensated:
        values = ",".join(repr(float(v)) for v in np.asarray(sample.spillover, dtype=np.float64).ravel())
        keep["$SPILLOVER"] = f"{len(sample.spillover_channels)}," + ",".join(sample.spillover_channels) \
            + "," + values
    keep[DROPPED_KEYWORD] = str(len(dropped))
    keep[POLICY_KEYWORD] = policy_note(include_identifying=include_identifying, keep_keywords=keep_keywords)
    return keep


def _carried_keywords(sample: Sample, include_identifying: bool, keep_keywords) -> tuple[dict[str, str], list[str]]:
    """(the source keywords an exported FCS copies, the names the keyword policy left out)."""
    d = len(sample.channels)
    candidates: dict[str, str] = {}
    for key, value in sample.keywords.items():
        key, value = str(key), "" if value is None else str(value)
        if value == "" or _NOT_CARRIED.match(key):
            continue
        if sample.compensated and key.lstrip("$").upper() == "COMP":
            continue
        channel = _CHANNEL_KEYWORD.match(key)
        if channel and not 1 <= int(channel.group(1)) <= d:
            continue  # describes a channel the sample does not have
        candidates[key] = value
    return split_keywords(candidates, include_identifying=include_identifying, keep_keywords=keep_keywords)


def dropped_keyword_count(sample: Sample, *, format: str = "fcs", include_identifying: bool = False,
                          keep_keywords=()) -> int | None:
    """How many of ``sample``'s keywords an export in ``format`` leaves out under the keyword
    policy: what an FCS file's ``GATING_DROPPED_KEYWORDS`` (``"fcs"``) or an h5ad file's
    ``uns["dropped_keywords"]`` (``"h5ad"``) says. None for CSV and Parquet, which carry no
    keywords at all."""
    if format == "fcs":
        return len(_carried_keywords(sample, include_identifying, keep_keywords)[1])
    if format == "h5ad":
        return len(split_keywords(sample.keywords, include_identifying=include_identifying,
                                  keep_keywords=keep_keywords)[1])
    if format in ("csv", "parquet"):
        return None
    raise ValueError(f"export format must be one of {EXPORT_FORMATS}, not {format!r}")


def _usable_timestep(text: str) -> bool:
    try:
        return math.isfinite(float(text.strip()))
    except ValueError:
        return False


def _write_fcs_export(path: Path, sample: Sample, populations, include_identifying: bool, keep_keywords) -> None:
    keywords = export_keywords(sample, include_identifying=include_identifying, keep_keywords=keep_keywords)
    ranges = [c.range for c in sample.channels]
    if populations is None:
        write_fcs(path, sample.events, sample.pnn, sample.pns, keywords, ranges=ranges, datatype="auto")
        return
    populations, _ = _check_lengths(sample, populations, None, path)
    names, codes = np.unique(populations, return_inverse=True)
    if any(n.strip() == "" for n in names):
        raise ValueError(f"{path.name}: population names must not be empty")
    channel = POPULATION_COLUMN
    k = 2
    while channel in sample.pnn:
        channel = f"{POPULATION_COLUMN}_{k}"
        k += 1
    dtype = sample.events.dtype if sample.events.dtype in (np.float32, np.float64) else np.float64
    events = np.empty((sample.n_events, len(sample.channels) + 1), dtype=dtype)
    events[:, :-1] = sample.events
    events[:, -1] = codes
    keywords[POPULATION_KEYWORD] = channel
    keywords[POPULATION_COUNT_KEYWORD] = str(len(names))
    for code, name in enumerate(names):
        keywords[POPULATION_NAME_KEYWORD.format(code)] = _encode_name(str(name))
    write_fcs(path, events, sample.pnn + [channel], sample.pns + ["population code"], keywords,
              ranges=ranges + [max(len(names), 1)], datatype="auto")


def export_sample(path: str | os.PathLike, sample: Sample, populations=None, confidence=None, *,
                  format: str | None = None, include_identifying: bool = False, keep_keywords=(),
                  result=None) -> Path:
    """Write one patient for use outside the product: the single export path.

    Parameters
    ----------
    path : output file.
    sample : the events as read (linear scale).
    populations : array-like of str, shape (n_events,), or None (FCS only: events alone).
    confidence : array-like of float in [0, 1] (gated CSV only), or None.
    format : ``"csv"`` (gated CSV), ``"fcs"`` (FCS 3.1 with a population channel when
        ``populations`` is given), ``"parquet"`` (the gated CSV's columns, typed) or ``"h5ad"``
        (AnnData, :func:`gating_core.io.interop.to_anndata`; needs the anndata package); default
        from the suffix (``.fcs``, ``.parquet``, ``.h5ad``), else CSV.
    include_identifying : keep every keyword. By default an FCS or h5ad export keeps only
        those needed to read and interpret the data (an allow-list, see
        :mod:`gating_core.library.privacy`) and records how many it left out
        (``GATING_DROPPED_KEYWORDS``; h5ad ``uns["dropped_keywords"]``). A gated CSV or
        Parquet file carries no keywords at all.
    keep_keywords : names of further keywords to keep (case-insensitive, a leading ``$``
        optional; ``$PnV`` stands for that keyword of every channel).
    result : a GateResult of this sample, or None. Without ``populations`` / ``confidence``,
        its own are written, in every format. An h5ad file also holds its gating
        (``uns["gating"]``: the model's populations and the patient's novelty), as
        :func:`~gating_core.io.interop.to_anndata` writes it.

    An exported FCS reads back (this project's reader, FlowIO, FlowKit) with exactly the
    source sample's events on every channel: float32 when the values are float32, else
    float64. Raises FCSError (FCS), ValueError (lengths, names), ImportError (h5ad without
    anndata) or OSError.
    """
    path = Path(path)
    own = getattr(result, "populations", None)  # a streamed gating keeps none, only its count
    size = len(own) if own is not None else getattr(result, "n_events", None)
    if size is not None and size != sample.n_events:
        raise ValueError(f"{sample.name}: the gating result holds {size} events, "
                         f"the sample {sample.n_events}: it is another patient's")
    if own is not None and populations is None:
        populations = own
        confidence = result.confidence if confidence is None else confidence
    by_suffix = {suffix: name for name, suffix in EXPORT_SUFFIXES.items()}
    format = format or by_suffix.get(path.suffix.lower(), "csv")
    if format not in EXPORT_FORMATS:
        raise ValueError(f"export format must be one of {EXPORT_FORMATS}, not {format!r}")
    if format in ("csv", "parquet") and populations is None:
        raise ValueError(f"{path.name}: a gated {format.upper() if format == 'csv' else 'Parquet'} file needs populations")
    keep_keywords = keep_names(keep_keywords)
    if format == "csv":
        write_gated_csv(path, sample, populations, confidence)
    elif format == "parquet":
        write_gated_parquet(path, sample, populations, confidence)
    elif format == "h5ad":
        write_gated_h5ad(path, sample, populations, confidence, include_identifying=include_identifying,
                         keep_keywords=keep_keywords, result=result)
    else:
        _write_fcs_export(path, sample, populations, include_identifying, keep_keywords)
    return path


def export_bytes(sample: Sample, populations=None, confidence=None, *, format: str,
                 include_identifying: bool = False, keep_keywords=(),
                 work_dir: str | os.PathLike | None = None) -> bytes:
    """:func:`export_sample` into memory (for downloads): the file's bytes.

    The file is written in ``work_dir`` (default: the system temp folder) and removed.
    """
    import tempfile

    folder = Path(work_dir) if work_dir is not None else Path(tempfile.gettempdir())
    path = folder / f"export-{uuid.uuid4().hex}.{format}"
    try:
        export_sample(path, sample, populations, confidence, format=format,
                      include_identifying=include_identifying, keep_keywords=keep_keywords)
        return path.read_bytes()
    finally:
        path.unlink(missing_ok=True)


def write_fcs_with_populations(path: str | os.PathLike, sample: Sample, populations, *,
                               include_identifying: bool = False, keep_keywords=()) -> None:
    """Write the sample as FCS 3.1 with an extra channel of population codes.

    Codes are 0..k-1 in sorted order of the population names; keywords
    ``GATING_POPULATION_<code>`` hold the names. Readable by FlowIO and FlowKit. Same file as
    ``export_sample(path, sample, populations, format="fcs")``.
    """
    export_sample(path, sample, populations, format="fcs", include_identifying=include_identifying,
                  keep_keywords=keep_keywords)


def populations_from_sample(sample: Sample):
    """Split a sample read from :func:`write_fcs_with_populations` output.

    Returns (sample without the population channel, populations ndarray[str]).
    Raises FCSError when the keywords or codes are inconsistent.
    """
    where = sample.path or sample.name
    channel = sample.keywords.get(POPULATION_KEYWORD)
    if channel is None:
        raise FCSError(where, f"has no {POPULATION_KEYWORD} keyword: no population channel")
    try:
        index = sample.pnn.index(channel)
        count = int(sample.keywords[POPULATION_COUNT_KEYWORD])
        names = np.array([unquote(sample.keywords[POPULATION_NAME_KEYWORD.format(c)])
                          for c in range(count)], dtype=str)
    except (ValueError, KeyError) as exc:
        raise FCSError(where, f"population keywords are incomplete ({exc})") from None
    codes = sample.events[:, index]
    if codes.size and (codes.min() < 0 or codes.max() >= count or np.any(codes != np.round(codes))):
        raise FCSError(where, f"population channel {channel!r} holds codes outside 0..{count - 1}")
    keep = [i for i in range(len(sample.channels)) if i != index]
    rest = Sample(sample.name, np.ascontiguousarray(sample.events[:, keep]),
                  [sample.channels[i] for i in keep], dict(sample.keywords), sample.spillover,
                  list(sample.spillover_channels), sample.version, sample.path,
                  sample.compensated, list(sample.notes))
    return rest, names[codes.astype(np.intp)]


def read_fcs_with_populations(path: str | os.PathLike, compensate: bool = False):
    """(Sample without the population channel, populations) from such an FCS file."""
    return populations_from_sample(read_fcs(path, compensate=compensate))
