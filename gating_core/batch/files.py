"""Work on files: the serial paths that batch and cluster runs share.

``gate_file`` gates an FCS file with a trained model; ``digest_file`` reduces a labeled
training INPUT to what training needs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gating_core.errors import PathError, describe_error
from gating_core.fcs import FCSError, read_fcs_all, stream_fcs_all
from gating_core.io.export import EXPORT_SUFFIXES, GatedTableWriter, dropped_keyword_count, export_sample
from gating_core.model.digest import PatientDigest
from gating_core.model.estimator import GatingModel
from gating_core.model.result import ChannelMismatchError

def output_stem(sample_name: str) -> str:
    """File-system-safe stem for a patient (:func:`gating_core.gates.names.safe_name`): Unicode
    letters and digits kept, every other run of characters one ``_``: ``"Guava Muse#2"`` ->
    ``"Guava_Muse_2"``, ``"patient ü 東京 03"`` -> ``"patient_ü_東京_03"``."""
    from gating_core.gates.names import safe_name

    return safe_name(sample_name, "patient")


def gated_name(sample_name: str, format: str = "csv", part=None) -> str:
    """The output file name of a gated patient: ``<stem>.gated.csv`` (``.parquet`` / ``.fcs`` /
    ``.h5ad``), ``<stem>.<part>.gated.csv`` when one part of the model gated it alone, so that
    gating with a part never replaces the model's gating it is compared with."""
    return f"{output_stem(sample_name)}{'' if part is None else f'.{part}'}.gated{EXPORT_SUFFIXES[format]}"


def output_name_clashes(fcs_paths, format: str = "csv", part=None) -> list[list[str]]:
    """Groups of inputs whose data sets would write the same output file in one folder (the
    same name, or names that differ only in case, which many file systems do not tell apart).

    The data sets of each file are named from its TEXT segments, as :func:`gate_file` names
    them; each clash lists ``"<file>"`` or ``"<file> (data set <name>)"``."""
    from gating_core.fcs.reader import data_set_names

    writers: dict[str, list[str]] = {}
    for path in fcs_paths:
        names = data_set_names(path) or [Path(path).stem]
        for name in names:
            output = gated_name(name, format, part).casefold()
            label = str(path) if len(names) == 1 else f"{path} (data set {name})"
            writers.setdefault(output, []).append(label)
    return [labels for labels in writers.values() if len(labels) > 1]


#: Output formats :func:`gate_file` writes chunk by chunk (the others need the whole patient).
STREAMED_FORMATS = ("csv", "parquet")


def gate_file(model: GatingModel, fcs_path, out_dir, chunk_size: int = 50_000, format: str = "csv", *,
              include_identifying: bool = False, keep_keywords=(), part=None) -> list[dict]:
    """Gate every data set of one FCS file; write ``<out_dir>/<stem>.gated.csv`` for each
    (``.gated.parquet`` / ``.gated.fcs`` / ``.gated.h5ad`` for the other ``format`` values of
    :func:`~gating_core.io.export.export_sample`; ``<stem>.<part>.gated.csv`` with ``part``:
    :func:`gated_name`).

    CSV and Parquet are streamed: the DATA segment is read in windows of ``chunk_size``
    events, twice (the content-hashed embedding cells, then scoring), and each window is
    compensated, scored and written before the next is read, so memory stays bounded
    whatever the file size; the gated CSV is byte-identical to
    ``export_sample(..., model.gate(read_fcs(...)))``. FCS and h5ad outputs need every
    population before the first byte (codes, data type) and read the patient whole; they keep
    the keywords of :func:`~gating_core.io.export.export_sample`'s policy (``include_identifying``,
    ``keep_keywords``). ``part``: None for the model's gating, or one of ``model.gating_parts()``
    for that part alone (:meth:`GatingModel.gate`; any other raises ValueError before a file is read).

    Returns one record per data set: ``file``, ``patient``, ``events``, ``counts``,
    ``novelty`` (dict), ``output`` (path), ``part`` (when given), for FCS and h5ad ``dropped_keywords`` (how many
    keywords the export left out) or, when the file cannot be gated, ``error`` (the
    message naming the file and the problem). Never raises for a bad input file; a file that
    fails part way leaves no output file behind.
    """
    if part is not None:
        model._check_part(part)  # a wrong part is the caller's error, not each file's
    if format not in STREAMED_FORMATS:
        return _gate_file_whole(model, fcs_path, out_dir, chunk_size, format,
                                include_identifying=include_identifying, keep_keywords=keep_keywords, part=part)
    fcs_path = Path(fcs_path)
    out_dir = Path(out_dir)
    try:
        streams = stream_fcs_all(fcs_path, compensate=model.compensate)
    except FCSError as exc:
        return [{"file": str(fcs_path), "patient": fcs_path.stem, "error": describe_error(exc)}]
    records = []
    for stream in streams:
        sample = stream.sample
        record = {"file": str(fcs_path), "patient": sample.name}
        output = out_dir / gated_name(sample.name, format, part)
        if output.is_dir():
            record["error"] = _in_the_way(fcs_path, output)
            records.append(record)
            continue
        try:
            populations = np.asarray(model.gated_populations(), dtype=object)
            with GatedTableWriter(output, sample, format, categories=populations) as writer:

                def sink(start, events, codes, confidence):
                    writer.write(events, populations[codes], confidence)

                result = model.gate_chunks(sample, stream.chunks, chunk_size=chunk_size, sink=sink, **_part(part))
            record.update(events=result.n_events, counts=result.counts, novelty=result.novelty.to_dict(),
                          output=str(output), mean_confidence=float(result.mean_confidence))
            _add_part(record, part)
            _add_fit_cost(record, model)
        except FCSError as exc:
            message = describe_error(exc)
            if len(streams) > 1:
                message = _unreadable(fcs_path, sample.name, exc.problem)
            record["error"] = message
        except (ChannelMismatchError, ValueError, OSError) as exc:
            record["error"] = naming_the_file(fcs_path, exc)
        records.append(record)
    return records + _skipped_records(fcs_path, streams)


def _part(part) -> dict:
    """``part=`` for a model's gate / gate_chunks, given only when a part is asked for (a model of
    one part need not take it)."""
    return {} if part is None else {"part": part}


def _add_part(record: dict, part) -> None:
    if part is not None:
        record["part"] = str(part)


def _add_fit_cost(record: dict, model) -> None:
    """A transductive model (``gating_core.model.iw_model``) refits for each patient: its cost, in
    seconds, joins the patient's record as ``fit_seconds``."""
    seconds = getattr(model, "last_fit_seconds_", None)
    if seconds is not None:
        record["fit_seconds"] = float(seconds)


# Records name the input by its path as given (two inputs of one name in different folders are
# told apart), as the command line's other errors do (gating_core.errors.describe_error).

def _in_the_way(fcs_path: Path, output: Path) -> str:
    return f"{fcs_path}: cannot write {output}: a folder of that name is in the way"


def naming_the_file(fcs_path: Path, exc: BaseException) -> str:
    """``exc``'s message for a record of the input ``fcs_path``, naming it by the path given."""
    message = describe_error(exc) if isinstance(exc, (PathError, OSError)) else (str(exc) or type(exc).__name__)
    if message.startswith(f"{fcs_path.name}: "):
        return f"{fcs_path}: {message[len(fcs_path.name) + 2:]}"
    return message if str(fcs_path) in message else f"{fcs_path}: {message}"


def _unreadable(fcs_path: Path, name: str, problem: str) -> str:
    return f"{fcs_path}: data set {name} cannot be read: {problem}"


def _skipped_records(fcs_path: Path, data_sets) -> list[dict]:
    """A record for each data set of the file that could not be read."""
    return [{"file": str(fcs_path), "patient": name, "error": _unreadable(fcs_path, name, problem)}
            for name, problem in getattr(data_sets, "skipped", [])]


def _gate_file_whole(model: GatingModel, fcs_path, out_dir, chunk_size: int = 50_000, format: str = "csv", *,
                     include_identifying: bool = False, keep_keywords=(), part=None) -> list[dict]:
    """:func:`gate_file` reading each data set whole (FCS and h5ad outputs; the reference the
    streamed path is tested against)."""
    fcs_path = Path(fcs_path)
    out_dir = Path(out_dir)
    try:
        samples = read_fcs_all(fcs_path, compensate=model.compensate)
    except FCSError as exc:
        return [{"file": str(fcs_path), "patient": fcs_path.stem, "error": describe_error(exc)}]
    records = []
    for sample in samples:
        record = {"file": str(fcs_path), "patient": sample.name}
        try:
            output = out_dir / gated_name(sample.name, format, part)
            if output.is_dir():
                record["error"] = _in_the_way(fcs_path, output)
                records.append(record)
                continue
            result = model.gate(sample, chunk_size=chunk_size, **_part(part))
            export_sample(output, sample, result.populations, result.confidence, format=format,
                          include_identifying=include_identifying, keep_keywords=keep_keywords, result=result)
            record.update(events=sample.n_events, counts=result.counts, novelty=result.novelty.to_dict(),
                          output=str(output), mean_confidence=float(result.confidence.mean()) if sample.n_events else 0.0)
            dropped = dropped_keyword_count(sample, format=format, include_identifying=include_identifying,
                                            keep_keywords=keep_keywords)
            if dropped is not None:
                record["dropped_keywords"] = dropped
            _add_part(record, part)
            _add_fit_cost(record, model)
        except (ChannelMismatchError, FCSError, ValueError, OSError) as exc:
            record["error"] = naming_the_file(fcs_path, exc)
        records.append(record)
    return records + _skipped_records(fcs_path, samples)


def digest_file(path, index: int, model: GatingModel) -> PatientDigest:
    """The :class:`PatientDigest` of the ``index``-th training INPUT (FCS with its labels file,
    or a gated CSV), drawn as ``model.fit`` would. Raises FCSError or LabelError."""
    from gating_core.io.inputs import load_labeled_input

    sample, labels = load_labeled_input(path, compensate=model.compensate)
    return model.digest(sample, labels, index)
