"""``python -m gating_core.synthetic --out DIR [--seed S] [--centers K | --hard KIND]``: the
sample-data folder, a multi-center benchmark or a hard benchmark cohort.
"""

from __future__ import annotations

import argparse
import sys

from gating_core.synthetic.centers import write_centers, write_cohort
from gating_core.synthetic.hard import HARD_COHORTS, simulate_hard_cohort
from gating_core.synthetic.sample_data import SAMPLE_EVENTS, write_sample_data


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gating_core.synthetic",
                                     description="Write the synthetic sample-data folder, a "
                                                 "multi-center benchmark (--centers) or a hard "
                                                 "benchmark cohort (--hard).")
    parser.add_argument("--out", required=True, help="output folder (created if missing)")
    parser.add_argument("--seed", type=int, default=2026, help="random seed (default 2026)")
    parser.add_argument("--events", type=int,
                        help=f"events per patient (default {SAMPLE_EVENTS}; 5000 with --hard)")
    parser.add_argument("--centers", type=int, metavar="K",
                        help="write a multi-center benchmark of K centers (with groups.csv) instead")
    parser.add_argument("--hard", choices=sorted(HARD_COHORTS),
                        help="write a hard benchmark cohort (with groups.csv) instead")
    parser.add_argument("--patients-per-center", type=int,
                        help="patients per center (default 3 with --centers; the kind's own with --hard)")
    parser.add_argument("--strength", type=float,
                        help="how far centers depart from the nominal instrument (default 2 with --centers; "
                             "the kind's own with --hard)")
    args = parser.parse_args(argv)
    if args.centers and args.hard:
        parser.error("--centers and --hard exclude each other")

    def given_or(value, default):
        return default if value is None else value

    if args.hard:
        # Only what was given overrides the kind's own settings.
        options = {name: value for name, value in (("patients_per_center", args.patients_per_center),
                                                   ("strength", args.strength)) if value is not None}
        paths = write_cohort(args.out, *simulate_hard_cohort(args.hard, seed=args.seed,
                                                             n_events=given_or(args.events, 5000), **options))
    elif args.centers:
        paths = write_centers(args.out, n_centers=args.centers,
                              patients_per_center=given_or(args.patients_per_center, 3), seed=args.seed,
                              n_events=given_or(args.events, SAMPLE_EVENTS), strength=given_or(args.strength, 2.0))
    else:
        paths = write_sample_data(args.out, seed=args.seed, n_events=given_or(args.events, SAMPLE_EVENTS))
    total = sum(p.stat().st_size for p in paths)
    print(f"wrote {len(paths)} files, {total / 1e6:.1f} MB, to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
