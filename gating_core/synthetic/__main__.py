"""``python -m gating_core.synthetic --out DIR [--seed S] [--centers K]``: the sample-data
folder or a multi-center benchmark.
"""

from __future__ import annotations

import argparse
import sys

from gating_core.synthetic.centers import write_centers
from gating_core.synthetic.sample_data import SAMPLE_EVENTS, write_sample_data


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gating_core.synthetic",
                                     description="Write the synthetic sample-data folder, or a "
                                                 "multi-center benchmark (--centers).")
    parser.add_argument("--out", required=True, help="output folder (created if missing)")
    parser.add_argument("--seed", type=int, default=2026, help="random seed (default 2026)")
    parser.add_argument("--events", type=int, default=SAMPLE_EVENTS,
                        help=f"events per patient (default {SAMPLE_EVENTS})")
    parser.add_argument("--centers", type=int, metavar="K",
                        help="write a multi-center benchmark of K centers (with groups.csv) instead")
    parser.add_argument("--patients-per-center", type=int, default=3)
    parser.add_argument("--strength", type=float, default=2.0,
                        help="how far centers depart from the nominal instrument (default 2)")
    args = parser.parse_args(argv)
    if args.centers:
        paths = write_centers(args.out, n_centers=args.centers, patients_per_center=args.patients_per_center,
                              seed=args.seed, n_events=args.events, strength=args.strength)
    else:
        paths = write_sample_data(args.out, seed=args.seed, n_events=args.events)
    total = sum(p.stat().st_size for p in paths)
    print(f"wrote {len(paths)} files, {total / 1e6:.1f} MB, to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
