"""The shared multicenter samples as the benches read them (``../shared/data/multicenter``).

``groups.csv`` there has columns patient, pair, batch: the replicate pair of each patient and
its batch (the later batch is the one a "leave the later batch out" protocol gates).
"""

from __future__ import annotations

import csv
from pathlib import Path

from gating_core.io.inputs import load_labeled_input

MULTICENTER = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "multicenter"


def load_multicenter(folder=MULTICENTER):
    """Samples, labels, replicate pair and batch of every multicenter patient, in file order."""
    data = [load_labeled_input(p) for p in sorted(Path(folder).glob("multicenter_*.fcs"))]
    samples, labels = [d[0] for d in data], [d[1] for d in data]
    with open(Path(folder) / "groups.csv", newline="") as handle:
        rows = {r["patient"]: r for r in csv.DictReader(handle)}
    return samples, labels, [rows[s.name]["pair"] for s in samples], [rows[s.name]["batch"] for s in samples]
