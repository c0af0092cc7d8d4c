"""Groups of patients that must stay together: centers, batches, runs, replicate twins.

A new patient usually comes from a run the model has not seen. Evaluation and model selection
must therefore hold out whole groups: a held-out patient whose twin (a technical replicate, a
sample of the same run) is in training makes every method look better than it will be.

Groups come from the user (a CSV mapping patient to group, or an FCS keyword such as
``$CYTSN``, ``$INST`` or ``$DATE``); where none are given, :func:`infer_groups` finds
near-duplicate patients from their cell distributions so that they are never split between
training and validation.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from gating_core.errors import GroupsError


#: The group columns a groups table is read from when none is named, in order of preference.
GROUP_COLUMNS = ("group", "center", "batch", "run", "pair")


def groups_from_csv(path, patient_names, column=None) -> list[str]:
    """Group of each patient from a CSV whose first column names the patient.

    The group column is ``column`` when given (a header name, case-insensitive), else
    ``group``, ``center``, ``batch``, ``run`` or ``pair`` (the first present, in that order of
    preference; :func:`groups_csv_column` says which), else the second column. Patients are
    matched by name, the file stem, case-insensitively. Every patient must be listed.
    """
    path = Path(path)
    rows = _groups_rows(path)
    index = _column_index(path, rows[0], column)
    table = {}
    for line, row in enumerate(rows[1:], start=2):
        if not row or not any(cell.strip() for cell in row):
            continue
        if len(row) <= index:
            raise GroupsError(path, f"line {line} has no group value")
        table[_key(row[0])] = row[index].strip()
    missing = [n for n in patient_names if _key(n) not in table]
    if missing:
        raise GroupsError(path, f"no group for patient{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
    return [table[_key(n)] for n in patient_names]


def groups_csv_column(path, column=None) -> str:
    """The header of the column :func:`groups_from_csv` reads the groups from."""
    rows = _groups_rows(Path(path))
    return rows[0][_column_index(Path(path), rows[0], column)].strip()


def _groups_rows(path: Path) -> list:
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            rows = list(csv.reader(handle))
    except (OSError, UnicodeDecodeError) as exc:
        raise GroupsError(path, f"cannot read groups table ({exc})") from None
    if len(rows) < 2 or len(rows[0]) < 2:
        raise GroupsError(path, "groups table needs a header and two columns: patient, group")
    return rows


def _column_index(path: Path, header_row, column) -> int:
    header = [h.strip().casefold() for h in header_row]
    if column is not None:
        wanted = str(column).strip().casefold()
        if wanted not in header[1:]:
            raise GroupsError(path, f"no column {column!r} (its columns: {', '.join(h.strip() for h in header_row)})")
        return header.index(wanted, 1)
    return next((header.index(c) for c in GROUP_COLUMNS if c in header), 1)


def groups_from_keyword(samples, keyword: str) -> list[str]:
    """Group of each sample from the value of an FCS keyword (``$CYTSN``, ``$DATE``, ...)."""
    wanted = keyword.strip().casefold()
    groups = []
    for s in samples:
        value = next((v for k, v in s.keywords.items() if k.strip().casefold() == wanted), None)
        if value is None:
            raise GroupsError(getattr(s, "path", None) or s.name, f"no keyword {keyword!r} to group by")
        groups.append(str(value).strip())
    return groups


def infer_groups(embeddings, names=None, ratio: float = 0.5) -> list[str]:
    """Clusters of near-duplicate patients, by single linkage on embedding distances.

    Two patients are linked when their embeddings lie closer than ``ratio`` times the median
    distance between patients; linked patients (transitively) form one group. Technical
    replicates and samples of one run land together, while patients whose distributions differ
    as much as typical patients do stay apart.

    Parameters
    ----------
    embeddings : ndarray of shape (n_patients, m)
    names : list of str or None, used to name the groups (``auto:<first member>``)

    Returns
    -------
    list of str, one group label per patient.
    """
    e = np.asarray(embeddings, dtype=np.float64)
    n = len(e)
    names = list(names) if names is not None else [str(i) for i in range(n)]
    if n < 3:
        return [f"auto:{m}" for m in names]
    d = np.sqrt(((e[:, None, :] - e[None, :, :]) ** 2).sum(-1))
    off = d[np.triu_indices(n, 1)]
    threshold = ratio * float(np.median(off))
    parent = list(range(n))

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(n):
        for j in range(i + 1, n):
            if d[i, j] < threshold:
                parent[root(i)] = root(j)
    roots = [root(i) for i in range(n)]
    first = {}
    for i, r in enumerate(roots):
        first.setdefault(r, names[i])
    return [f"auto:{first[r]}" for r in roots]


def group_folds(groups, n_folds: int, n_repeats: int, random_state=0) -> list[list[int]]:
    """Held-out patient index sets that never split a group.

    With ``g`` distinct groups: ``n_repeats`` random partitions of the groups into
    ``min(n_folds, g)`` folds (one partition when every fold is a single group, since all
    partitions are then the same). With one group only, patients are folded individually:
    nothing better can be done, and :func:`describe_folds` says so.
    """
    groups = list(groups)
    labels = sorted(set(groups), key=groups.index)
    if len(labels) < 2:
        labels = list(range(len(groups)))
        groups = list(range(len(groups)))
    k = max(2, min(n_folds, len(labels)))
    repeats = 1 if k == len(labels) else n_repeats
    rng = np.random.default_rng(random_state)
    folds = []
    for _ in range(repeats):
        order = rng.permutation(len(labels))
        for part in np.array_split(order, k):
            chosen = {labels[i] for i in part}
            folds.append([i for i, g in enumerate(groups) if g in chosen])
    return [f for f in folds if f]


def _key(name) -> str:
    stem = Path(str(name).strip()).name
    for suffix in (".fcs", ".csv", ".gated"):
        if stem.casefold().endswith(suffix):
            stem = stem[: -len(suffix)]
    return stem.casefold()


#: FCS keywords that commonly tell which instrument, site, run or day measured a sample.
GROUP_KEYWORDS = ("$CYTSN", "$CYT", "$INST", "$DATE", "$PLATENAME", "$PROJ", "$OP")


def shared_group_keywords(samples) -> list[str]:
    """The :data:`GROUP_KEYWORDS` every sample carries, for offering as a grouping."""
    present = []
    for keyword in GROUP_KEYWORDS:
        if all(any(k.strip().casefold() == keyword.casefold() for k in s.keywords) for s in samples):
            present.append(keyword)
    return present
