"""The JMLR 2021 synthetic task (design.md section 3): test error of marginal transfer and pooling.

N training tasks of n = 256 points, 10 test tasks, model selection by cross-validation over
tasks, three seeds. The paper's marginal-transfer error: 7.22% at N = 64, 1.27% at N = 256.

Run: ``python bench/bench_ellipse.py [--tasks 64 256]`` (``make bench`` runs N = 64).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gating_core.classifier import MarginalTransferClassifier  # noqa: E402
from gating_core.selection import select_hyperparameters  # noqa: E402
from gating_core.synthetic import ellipse_task  # noqa: E402

PAPER = {64: 0.0722, 256: 0.0127}


def test_error(n_tasks: int, seed: int, use_embedding: bool) -> float:
    rng = np.random.default_rng(seed)
    train_x, train_y = ellipse_task(n_tasks, 256, rng)
    test_x, test_y = ellipse_task(10, 256, rng)
    base = MarginalTransferClassifier(use_embedding=use_embedding, cells_per_patient=256, random_state=0)
    chosen = select_hyperparameters(train_x, train_y, base, cells_per_patient=256)
    clf = MarginalTransferClassifier(**{**base.get_params(), **chosen.params}).fit(train_x, train_y)
    return float(np.mean([np.mean(clf.predict(x) != y.astype(str)) for x, y in zip(test_x, test_y)]))


def main(argv=()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, nargs="+", default=[64], help="numbers of training tasks N")
    parser.add_argument("--seeds", type=int, nargs="+", default=[2021, 0, 1])
    args = parser.parse_args(list(argv))
    for n_tasks in args.tasks:
        print(f"== Ellipse task, N = {n_tasks} training tasks, n = 256, 10 test tasks ==", flush=True)
        for seed in args.seeds:
            start = time.perf_counter()
            marginal = test_error(n_tasks, seed, True)
            pooling = test_error(n_tasks, seed, False)
            paper = f" (paper, marginal: {PAPER[n_tasks]:.2%})" if n_tasks in PAPER else ""
            print(f"seed {seed}: marginal transfer {marginal:.2%}, pooling {pooling:.2%}{paper}  "
                  f"[{time.perf_counter() - start:.0f} s]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
