"""``gate --method iw-nystroem`` on held-out groups: accuracy and refit cost per patient.

Leaves each group of a groups CSV out in turn (default: the replicate pairs of the shared
multicenter CyTOF data), trains an :class:`~gating_core.model.iw_model.IWNystroemGatingModel` on the
other patients exactly as ``train --method iw-nystroem`` does, gates each held-out patient (one
refit each) and prints per patient the accuracy against the expert labels and the refit's
seconds, then the mean and the worst. ``evaluate --protocol group --method marginal`` on the
same groups gives the marginal model's figures on the same split.

Run: ``python bench/bench_iw_gate.py [--groups FILE] [--landmarks 300] [--cells-per-patient 2000] [FILES...]``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gating_core.io.inputs import load_labeled_input  # noqa: E402
from gating_core.method.groups import groups_from_csv  # noqa: E402
from gating_core.model.iw_model import IWNystroemGatingModel  # noqa: E402

MULTICENTER = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "multicenter"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--groups", type=Path, help="CSV patient,group (default: the multicenter pairs)")
    parser.add_argument("--landmarks", type=int, default=300)
    parser.add_argument("--cells-per-patient", type=int, default=2000)
    args = parser.parse_args()
    files = args.files or sorted(MULTICENTER.glob("*.fcs"))
    if not files:
        print(f"no input files (and no {MULTICENTER})")
        return 0
    samples, labels = zip(*(load_labeled_input(p) for p in files))
    names = [s.name for s in samples]
    if args.groups:
        groups = groups_from_csv(args.groups, names)
    else:  # the multicenter groups.csv prefers its batch column; the pairs are the second column
        import csv

        with open(MULTICENTER / "groups.csv", newline="") as handle:
            pair = {row["patient"]: row["pair"] for row in csv.DictReader(handle)}
        groups = [pair[n] for n in names]
    rows = []
    for held in sorted(set(groups)):
        train = [i for i, g in enumerate(groups) if g != held]
        start = time.perf_counter()
        model = IWNystroemGatingModel(cells_per_patient=args.cells_per_patient, n_landmarks=args.landmarks).fit(
            [samples[i] for i in train], [labels[i] for i in train])
        train_seconds = time.perf_counter() - start
        for i in (i for i, g in enumerate(groups) if g == held):
            start = time.perf_counter()
            result = model.gate(samples[i])
            total = time.perf_counter() - start
            accuracy = float(np.mean(result.populations.astype(str) == np.asarray(labels[i]).astype(str)))
            rows.append((held, names[i], samples[i].n_events, accuracy, model.last_fit_seconds_, total, train_seconds))
            print(f"{held:>10} {names[i]:>16} {samples[i].n_events:>8,} events  accuracy {accuracy:.4f}  "
                  f"refit {model.last_fit_seconds_:6.1f} s  gate {total:6.1f} s  (training {train_seconds:.1f} s)",
                  flush=True)
    accuracies = np.array([r[3] for r in rows])
    refits = np.array([r[4] for r in rows])
    print(f"iw-nystroem, leave one group out: mean {accuracies.mean():.4f}, worst {accuracies.min():.4f} "
          f"({rows[int(np.argmin(accuracies))][1]}); refit per patient median {np.median(refits):.1f} s, "
          f"max {refits.max():.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
