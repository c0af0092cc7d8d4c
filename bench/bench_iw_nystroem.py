"""Importance-weighted Nystroem KRR under covariate shift: error and time against exact KRR.

1. Simulation (after "Computational efficiency under covariate shift in kernel ridge
   regression"): training inputs ~ N(0, I_2), test inputs ~ N((1, 0.5), 0.5^2 I_2),
   y = sin(2 x_1) + cos(x_2) x_1 / 2 + N(0, 0.3^2); n = 4,000 training points. Test error
   (mean squared error against the noiseless function, on 2,000 test points) of exact KRR,
   exact weighted KRR (true density ratio, clipped at 20) and weighted Nystroem KRR with m
   landmarks (uniform or weighted-leverage), mean over seeds, with fit times and the ratios
   to exact weighted KRR measured in the same run; then the same with the weights estimated
   from the test inputs (the product's setting: only the new patient's unlabeled cells).
2. Shared multicenter CyTOF (../shared/data/multicenter, skipped when absent): leave one
   patient out, one fit per new patient on the other patients' standardised cells (2,000 per
   patient) and the new patient's cells, accuracy and seconds per patient, weighted and not.

Run: ``python bench/bench_iw_nystroem.py [--seeds 3] [--simulation-only]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from scipy.stats import multivariate_normal

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gating_core.method.iw_nystroem import (ImportanceWeightedNystroemKRR, exact_weighted_krr,  # noqa: E402
                                            gaussian_kernel)

MULTICENTER = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "multicenter"
# lambda large enough that the fit is biased towards where training points are dense, the
# regime where weighting pays (at lambda = 1e-3 unweighted exact KRR was better: 0.0007 vs 0.0021).
ALPHA, BANDWIDTH, N_TRAIN, N_TEST = 3e-2, 0.7, 4000, 2000
TEST_MEAN, TEST_SD = np.array([1.0, 0.5]), 0.5


def truth(x):
    return np.sin(2 * x[:, 0]) + np.cos(x[:, 1]) * x[:, 0] / 2


def draw(seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(N_TRAIN, 2))
    y = truth(x) + 0.3 * rng.standard_normal(N_TRAIN)
    test = rng.normal(TEST_MEAN, TEST_SD, size=(N_TEST, 2))
    ratio = multivariate_normal(TEST_MEAN, TEST_SD ** 2).pdf(x) / multivariate_normal(np.zeros(2)).pdf(x)
    return x, y, test, np.minimum(ratio, 20.0)


def simulation(seeds, landmark_counts=(10, 25, 50, 100, 200, 400)):
    rows = {}

    def record(key, error, seconds):
        rows.setdefault(key, []).append((error, seconds))

    for seed in range(seeds):
        x, y, test, weights = draw(seed)
        for name, w in (("exact KRR (unweighted)", np.ones(N_TRAIN)), ("exact weighted KRR", weights)):
            start = time.perf_counter()
            coef = exact_weighted_krr(x, y, w, ALPHA, BANDWIDTH)
            seconds = time.perf_counter() - start
            record((name, N_TRAIN), np.mean(((gaussian_kernel(test, x, BANDWIDTH) @ coef)[:, 0] - truth(test)) ** 2),
                   seconds)
        for sampling in ("uniform", "leverage"):
            for m in landmark_counts:
                for label, given in (("true w", weights), ("estimated w", None)):
                    model = ImportanceWeightedNystroemKRR(n_landmarks=m, alpha=ALPHA, bandwidth=BANDWIDTH,
                                                          landmarks=sampling, max_weight=20.0, random_state=seed)
                    start = time.perf_counter()
                    model.fit(x, y, test, weights=given)
                    seconds = time.perf_counter() - start
                    record((f"weighted Nystroem, {sampling}, {label}", m),
                           np.mean((model.predict(test) - truth(test)) ** 2), seconds)
    reference = np.mean(rows[("exact weighted KRR", N_TRAIN)], axis=0)
    print(f"\n== simulation: n = {N_TRAIN}, d = 2, lambda = {ALPHA}, sigma = {BANDWIDTH}, {seeds} seeds; "
          f"test MSE against the noiseless function")
    print(f"{'method':44s} {'m':>5s} {'test MSE':>9s} {'/ exact w':>9s} {'fit s':>8s} {'/ exact w':>9s}")
    for (name, m), values in rows.items():
        error, seconds = np.mean(values, axis=0)
        print(f"{name:44s} {m:5d} {error:9.5f} {error / reference[0]:9.2f} {seconds:8.3f} "
              f"{seconds / reference[1]:9.3f}", flush=True)


def multicenter(n_landmarks=500):
    if not (MULTICENTER / "multicenter_01.fcs").exists():
        print(f"\n(multicenter data not found at {MULTICENTER}: skipped)")
        return
    from gating_core.io.inputs import load_labeled_input
    from gating_core.model import GatingModel
    from gating_core.model.digest import digest_patient

    data = [load_labeled_input(p) for p in sorted(MULTICENTER.glob("multicenter_*.fcs"))]
    samples, labels = [d[0] for d in data], [np.asarray(d[1]).astype(str) for d in data]
    print(f"\n== multicenter CyTOF, {len(samples)} patients, leave one patient out, m = {n_landmarks} landmarks, "
          f"2,000 training cells per patient")
    print(f"{'patient':16s} {'unweighted acc %':>16s} {'weighted acc %':>15s} {'s / patient (weighted)':>23s}")
    results = []
    for k in range(len(samples)):
        train = [i for i in range(len(samples)) if i != k]
        prep = GatingModel(cells_per_patient=2000)
        digests = [digest_patient(samples[i], labels[i], 2000, prep.embedding_cells, seed=prep.digest_seed(j),
                                  compensate=prep.compensate) for j, i in enumerate(train)]
        cells, _, drawn = prep.prepare_digests(digests)
        x, y = np.vstack(cells), np.concatenate(drawn)
        new = prep.standardised_cells(samples[k])
        row = []
        for weighting in ("none", "classifier"):
            start = time.perf_counter()
            model = ImportanceWeightedNystroemKRR(n_landmarks=n_landmarks, alpha=1e-5, weighting=weighting)
            predicted = model.fit(x, y, new).predict(new)
            row += [np.mean(predicted == labels[k]), time.perf_counter() - start]
        results.append(row)
        print(f"{samples[k].name:16s} {100 * row[0]:16.2f} {100 * row[2]:15.2f} {row[3]:23.1f}", flush=True)
    results = np.array(results)
    print(f"{'mean':16s} {100 * results[:, 0].mean():16.2f} {100 * results[:, 2].mean():15.2f} "
          f"{results[:, 3].mean():23.1f}")
    print(f"{'worst':16s} {100 * results[:, 0].min():16.2f} {100 * results[:, 2].min():15.2f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--simulation-only", action="store_true")
    args = parser.parse_args()
    simulation(args.seeds)
    if not args.simulation_only:
        multicenter()


if __name__ == "__main__":
    main()
