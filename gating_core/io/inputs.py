"""Reading one input file into patients: the one reader every caller uses.

An input is

* a gated CSV (``*.csv``, as :func:`gating_core.io.export.write_gated_csv` writes it): one patient,
  labeled, provenance :attr:`~gating_core.io.labels.Provenance.GATED_CSV`;
* an FCS file with ``<stem>.labels.csv`` beside it: its first data set, labeled from that file,
  provenance :attr:`~gating_core.io.labels.Provenance.IMPORTED`;
* an FCS file alone: every readable data set of it, unlabeled (``<stem>#<k>`` when several) --
  or, when labels are required, its first data set labeled from the population channel an
  exported FCS carries (:func:`gating_core.io.export.write_fcs_with_populations`).

:func:`read_input` reads those; :func:`load_labeled_input` is its form for training and
evaluation (one labeled patient or an error). The patient library's import, the app's uploads
and folder loading, and the command line's ``train`` / ``evaluate`` all go through them.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gating_core.fcs import Sample, SampleList, read_fcs, read_fcs_all
from gating_core.fcs.reader import data_set_names
from gating_core.io.export import POPULATION_KEYWORD, populations_from_sample, read_gated_csv
from gating_core.io.labels import LabelError, Provenance, labels_path_for, read_labels_csv

logger = logging.getLogger(__package__)

__all__ = ["InputPatient", "read_input", "load_labeled_input"]


@dataclass
class InputPatient:
    """One patient read from an input file (nothing stored yet).

    ``labels`` is an ndarray of str of shape (n_events,), or None for an unlabeled patient;
    ``provenance`` is then None too, else a :class:`~gating_core.io.labels.Provenance` value, and
    ``label_source`` the name of the file the labels came from. ``sources`` lists the files read
    as ``(role, path)`` with role ``"fcs"``, ``"labels"`` or ``"gated-csv"``.
    """

    name: str
    sample: Sample
    labels: np.ndarray | None = None
    provenance: str | None = None
    label_source: str | None = None
    sources: list[tuple[str, Path]] = field(default_factory=list)


def _gated_csv_stem(path: Path) -> str:
    stem = path.name[: -len(".csv")]
    return stem[: -len(".gated")] if stem.casefold().endswith(".gated") else stem


def read_input(path: str | os.PathLike, *, compensate: bool = False,
               require_labels: bool = False) -> SampleList:
    """The patients of one input file (see the module's docstring for what an input is).

    Parameters
    ----------
    path : the input file.
    compensate : apply an FCS file's spillover matrix (no-op without one; gated CSVs hold
        the values they were written with).
    require_labels : an FCS file without ``<stem>.labels.csv`` is then read for its population
        channel, and a LabelError names the missing labels file when it has none.

    Returns
    -------
    A list of :class:`InputPatient` in file order, with ``skipped``: ``(name, problem)`` of the
    data sets of an FCS file that could not be read (see :func:`gating_core.fcs.read_fcs_all`).

    Raises FCSError (the FCS file) or LabelError (labels file or gated CSV), naming the file.
    """
    path = Path(path)
    if path.suffix.lower() == ".csv":
        sample, populations, _confidence = read_gated_csv(path)
        return SampleList([InputPatient(_gated_csv_stem(path), sample, populations, Provenance.GATED_CSV,
                                        path.name, [("gated-csv", path)])])
    labels_path = labels_path_for(path)
    if labels_path.exists() or require_labels:
        _say_labels_are_the_first_data_sets(path)
    if labels_path.exists():
        sample = read_fcs(path, compensate=compensate)
        labels = read_labels_csv(labels_path, sample.n_events)
        return SampleList([InputPatient(path.stem, sample, labels, Provenance.IMPORTED, labels_path.name,
                                        [("fcs", path), ("labels", labels_path)])])
    if require_labels:
        sample = read_fcs(path, compensate=compensate)
        if POPULATION_KEYWORD not in sample.keywords:
            raise LabelError(labels_path, f"labels file is missing: {path.name} needs {labels_path.name} "
                                          "beside it (header 'population', one row per event)")
        sample, labels = populations_from_sample(sample)
        return SampleList([InputPatient(path.stem, sample, labels, Provenance.IMPORTED, path.name,
                                        [("fcs", path)])])
    samples = read_fcs_all(path, compensate=compensate)
    patients = [InputPatient(s.name if len(samples) > 1 else path.stem, s, sources=[("fcs", path)])
                for s in samples]
    return SampleList(patients, samples.skipped)


def labelled_data_sets_note(path) -> str | None:
    """What reading labels for the FCS file ``path`` leaves out, or None: labels name the events of
    one data set, so of a file that holds several, the first one's are read."""
    path = Path(path)
    if path.suffix.lower() == ".csv":
        return None
    names = data_set_names(path)
    if len(names) < 2:
        return None
    return (f"{path.name}: the file holds {len(names)} data sets; its labels are taken as the first one's "
            f"({names[0]}) and the other {len(names) - 1} are left out of training")


def _say_labels_are_the_first_data_sets(path: Path) -> None:
    note = labelled_data_sets_note(path)
    if note:
        logger.warning("%s", note)


def load_labeled_input(path: str | os.PathLike, compensate: bool = True):
    """(Sample, populations ndarray[str]) from a labeled input: :func:`read_input` with
    labels required, first data set.

    ``path`` ending in ``.csv`` is read as a gated CSV; anything else as an FCS file whose labels
    are in ``<stem>.labels.csv`` beside it (or, failing that, in a population channel written by
    :func:`gating_core.io.export.write_fcs_with_populations`). ``compensate`` applies the FCS
    spillover matrix when present. Raises LabelError (labels) or FCSError (FCS file).
    """
    patient = read_input(path, compensate=compensate, require_labels=True)[0]
    return patient.sample, patient.labels
