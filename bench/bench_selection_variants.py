"""Model-selection variants measured on unseen centers: the search's feature count and sigma_X grid.

The hyperparameter search (``gating_core.method.selection``) scores candidates on ``SEARCH_FEATURES``
random features and steps sigma_X by factors ``DEFAULT_X_FACTORS`` of the median distance. This
bench runs one protocol of ``python -m gating_core evaluate`` (or ``bench/bench_centers.py``'s
simulated cohorts) with those two settings changed for every kernel method of the run, so that a
variant is compared with the baselines it would also change (pooling and pooled logistic select
their sigma_X with the same search).

Run, for example (the shared multicenter data, leaving one replicate pair out and one patient out)::

    python bench/bench_selection_variants.py --search-features 512 -- \\
        evaluate --method marginal pooling pooled-logistic --seeds 0 1 2 --groups pairs.csv \\
        --protocol both ../shared/data/multicenter/multicenter_*.fcs
    python bench/bench_selection_variants.py --x-factors 0.25,0.35,0.5,0.71,1,1.41,2 -- \\
        centers --cohorts 11,12,13,14 --model-seeds 0,1,2 --methods marginal,pooling,pooled-logistic

(``pairs.csv`` / ``batches.csv``: the patient and pair / batch columns of the shared ``groups.csv``.)
It prints the figures it measures.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def _set_default(function, name, value):
    names = list(inspect.signature(function).parameters)
    defaults = list(function.__defaults__)
    defaults[names[-len(defaults):].index(name)] = value
    function.__defaults__ = tuple(defaults)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ours, rest = (argv[: argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--search-features", type=int, help="random features the search scores on (default 256)")
    parser.add_argument("--x-factors", help="comma-separated sigma_X factors of the median distance "
                                            "(default 0.25,0.5,1,2)")
    args = parser.parse_args(ours)
    if not rest or rest[0] not in ("evaluate", "centers"):
        parser.error("after --, 'evaluate ARGS' (the CLI) or 'centers ARGS' (bench_centers.py)")
    import gating_core.method.selection as selection

    if args.search_features:
        selection.SEARCH_FEATURES = args.search_features
    if args.x_factors:
        factors = tuple(float(v) for v in args.x_factors.split(","))
        selection.DEFAULT_X_FACTORS = factors
        for function in (selection.select_hyperparameters, selection.HyperparameterSearch.__init__):
            _set_default(function, "x_factors", factors)
    print(f"search features {selection.SEARCH_FEATURES}, sigma_X factors {selection.DEFAULT_X_FACTORS}", flush=True)
    if rest[0] == "evaluate":
        from gating_core.cli import main as cli_main

        return cli_main(rest)
    import bench_centers

    return bench_centers.main(rest[1:])


if __name__ == "__main__":
    sys.exit(main())
