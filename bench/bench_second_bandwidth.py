"""What the marginal model's second fit (``ResearchGatingModel.bandwidth_x_hedge``, an option)
costs, against the same model with one fit (``bandwidth_x_hedge=None``), in the same run on the
same data.

- Training: each cohort trained with default selection both ways (alternating, ``--repeats``
  times, fastest kept): the shared multicenter samples (10 patients) when present, and a
  simulated cohort of 4 centers x 3 patients (cohort 14 of ``bench_centers.py --cohorts``, 9
  patients: its first three centers). Whether the default fitted a second model is printed: it
  fits none when selection chose half the median distance or less.
- Gating: one simulated patient of ``--events`` events, in memory, by the two models trained on
  the simulated cohort (``GatingModel.gate``: every cell scored by every fit); events per second
  and the ratio.

Run: ``python bench/bench_second_bandwidth.py [--events 1000000] [--repeats 2]``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gating_core.model.research import ResearchGatingModel  # noqa: E402
from gating_core.synthetic import simulate_centers  # noqa: E402


def _cohorts():
    from multicenter_data import MULTICENTER, load_multicenter

    if (MULTICENTER / "multicenter_01.fcs").exists():
        samples, labels, pairs, _ = load_multicenter()
        yield "shared multicenter (10 patients)", samples, labels, pairs
    cohort, centers = simulate_centers(4, 3, seed=14, n_events=6000, strength=2.0)
    kept = [i for i, (s, _) in enumerate(cohort) if centers[s.name] != "center_4"]
    yield ("simulated cohort 14, centers 1-3 (9 patients)", [cohort[i][0] for i in kept],
           [cohort[i][1] for i in kept], [centers[cohort[i][0].name] for i in kept])


def _fastest_of_each(fits: dict, repeats: int):
    """Fastest wall time of each fit, the fits alternating within every repeat (a load that
    comes and goes then falls on both); returns ({name: seconds}, {name: last model})."""
    best, models = {name: float("inf") for name in fits}, {}
    for _ in range(repeats):
        for name, fit in fits.items():
            start = time.perf_counter()
            models[name] = fit()
            best[name] = min(best[name], time.perf_counter() - start)
    return best, models


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    models = {}
    for name, samples, labels, groups in _cohorts():
        print(f"== training: {name}, default selection", flush=True)
        times, models = _fastest_of_each(
            {label: (lambda hedge=hedge: ResearchGatingModel(bandwidth_x_hedge=hedge).fit(samples, labels,
                                                                                         groups=groups))
             for label, hedge in (("one fit", None), ("two fits (default)", 0.5))}, args.repeats)
        second = models["two fits (default)"].describe()["second_bandwidth_x"]
        chosen = models["two fits (default)"].classifier_.bandwidth_x_
        print(f"   one fit {times['one fit']:.2f} s, two fits {times['two fits (default)']:.2f} s, "
              f"ratio x{times['two fits (default)'] / times['one fit']:.2f}; selected sigma_X {chosen:.3g}, "
              f"second fit at {second if second is None else f'{second:.3g}'}", flush=True)
    sample = simulate_centers(1, 1, seed=99, n_events=args.events, strength=2.0)[0][0][0]
    print(f"== gating one simulated patient of {sample.n_events:,} events (in memory), the models of the "
          "simulated cohort", flush=True)
    seconds, _ = _fastest_of_each({label: (lambda model=model: model.gate(sample)) for label, model in models.items()},
                                  args.repeats)
    rates = {}
    for label, best in seconds.items():
        rates[label] = sample.n_events / best
        print(f"   {label}: {best:.2f} s = {rates[label]:,.0f} events/s", flush=True)
    print(f"   two fits / one fit: x{rates['two fits (default)'] / rates['one fit']:.2f} of the throughput")
    return 0


if __name__ == "__main__":
    sys.exit(main())
