"""The committed demo folder ``sample_data/`` (:func:`write_sample_data`, byte-identical
for a seed) and the file writers it and the multi-center benchmark use.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from gating_core.fcs import Sample, write_fcs
from gating_core.synthetic.panel import FLUORESCENCE_PANEL, POPULATIONS, RANGE_MAX
from gating_core.synthetic.patients import simulate_patient


#: (file stem, condition, drift) for the historical, expert-gated patients.
HISTORICAL_PLAN = (
    ("patient_01", "typical", 1.0),
    ("patient_02", "typical", 1.0),
    ("patient_03", "lymphopenia", 1.0),
    ("patient_04", "typical", 1.0),
    ("patient_05", "cd4_depletion", 1.0),
    ("patient_06", "monocytosis", 1.0),
    ("patient_07", "typical", 1.0),
    ("patient_08", "b_cell_depletion", 1.0),
)


#: New, unlabeled patients; the third is strongly drifted so the novelty warning should fire.
NEW_PLAN = (
    ("new_patient_01", "typical", 1.0),
    ("new_patient_02", "cd4_depletion", 1.0),
    ("new_patient_03", "typical", 5.0),
)


SAMPLE_EVENTS = 12000


def write_labels_csv(path, labels) -> None:
    """Write ``<stem>.labels.csv``: header ``population``, one row per event, ``\\n`` endings."""
    path = Path(path)
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "w", encoding="utf-8", newline="\n") as handle:
        handle.write("population\n")
        handle.write("".join(f"{label}\n" for label in labels))
    os.replace(tmp, path)


def write_sample(path, sample: Sample) -> None:
    """Write a simulated Sample as FCS 3.1 (float32) with its keywords, $PnS and ranges."""
    keywords = dict(sample.keywords)
    for i, channel in enumerate(sample.channels, start=1):
        keywords[f"$P{i}R"] = str(int(channel.range or RANGE_MAX))
    write_fcs(path, sample.events, sample.pnn, sample.pns, keywords)


def write_sample_data(out_dir, seed: int = 2026, n_events: int = SAMPLE_EVENTS) -> list[Path]:
    """Write the demo folder; returns the paths written (sorted).

    Layout::

        out_dir/patient_01.fcs + patient_01.labels.csv ... patient_08   (historical, gated)
        out_dir/new/new_patient_01.fcs ... new_patient_03.fcs            (to gate)
        out_dir/truth/new_patient_01.labels.csv ...                      (held-out truth)
        out_dir/README.md
    """
    out_dir = Path(out_dir)
    (out_dir / "new").mkdir(parents=True, exist_ok=True)
    (out_dir / "truth").mkdir(parents=True, exist_ok=True)
    written = []
    summary = []
    for i, (stem, condition, drift) in enumerate(HISTORICAL_PLAN):
        sample, labels = simulate_patient((seed, 0, i), n_events=n_events, drift=drift,
                                          condition=condition, name=stem)
        written += _write_pair(out_dir / f"{stem}.fcs", out_dir / f"{stem}.labels.csv", sample, labels)
        summary.append((f"{stem}.fcs", condition, drift, labels))
    for i, (stem, condition, drift) in enumerate(NEW_PLAN):
        sample, labels = simulate_patient((seed, 1, i), n_events=n_events, drift=drift,
                                          condition=condition, name=stem)
        written += _write_pair(out_dir / "new" / f"{stem}.fcs", out_dir / "truth" / f"{stem}.labels.csv",
                               sample, labels)
        summary.append((f"new/{stem}.fcs", condition, drift, labels))
    readme = out_dir / "README.md"
    readme.write_text(_readme_text(seed, n_events, summary), encoding="utf-8", newline="\n")
    written.append(readme)
    return sorted(written)


def _write_pair(fcs_path: Path, labels_path: Path, sample: Sample, labels) -> list[Path]:
    write_sample(fcs_path, sample)
    write_labels_csv(labels_path, labels)
    return [fcs_path, labels_path]


def _readme_text(seed: int, n_events: int, summary) -> str:
    header = "| file | condition | drift | " + " | ".join(POPULATIONS) + " |"
    rule = "|" + "---|" * (3 + len(POPULATIONS))
    rows = []
    for file, condition, drift, labels in summary:
        shares = [f"{100 * np.mean(labels == p):.1f}%" for p in POPULATIONS]
        rows.append(f"| {file} | {condition} | {drift:g} | " + " | ".join(shares) + " |")
    panel = ", ".join(f"{pnn} = {marker} ({fluor})" for pnn, marker, fluor in FLUORESCENCE_PANEL)
    return f"""# Sample data (synthetic)

Simulated flow cytometry for trying the product end to end. No real patient is in here.
Regenerate, byte for byte, with:

    python -m gating_core.synthetic --out sample_data --seed {seed}

(`tests/test_synthetic.py` regenerates it and compares hashes with these files.)

## Content

- `patient_01.fcs` ... `patient_08.fcs`: eight "historical" patients, each with its expert
  labels in `patient_NN.labels.csv` (header `population`, one row per event, in event order).
  Use them to train.
- `new/new_patient_01.fcs` ... `new_patient_03.fcs`: three new patients to gate.
  `new_patient_03` was measured with strong instrument drift (5x the usual), so it lies outside
  what the historical patients cover: the novelty warning should fire on it.
- `truth/new_patient_NN.labels.csv`: the true labels of the new patients, kept apart so that
  accuracy can be demonstrated after gating.

Each file holds {n_events} events and 9 channels, FCS 3.1, float32: FSC-A and SSC-A (linear,
0..262144) and {panel}.
The stored values are UNcompensated; the spillover matrix is in `$SPILLOVER`. After
compensation, negative populations spread around zero, with negative values.

Populations (labels): {", ".join(POPULATIONS)}. `other` holds CD3+ CD4- CD8- T cells,
which no leaf gate claims.

Patients differ the way real ones do: population proportions (Dirichlet around a clinical
condition), population shapes (biology), and channel gains and offsets (instrument and
staining drift), so one fixed polygon gate does not fit all of them.

{header}
{rule}
""" + "\n".join(rows) + "\n"


def file_digests(folder) -> dict[str, str]:
    """SHA-256 of every file under ``folder``, keyed by POSIX relative path."""
    folder = Path(folder)
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}
