"""Benchmark: reading a 1,000,000-event x 20-channel float32 FCS file.

Prints the throughput of ``gating_core.fcs.read_fcs`` in MB/s and its ratio to a raw
``numpy.fromfile`` of the same DATA bytes, measured in the same run (the physical limit for
this machine and page-cache state). FlowIO's own reader is timed once for context.

Run standalone: ``.venv/bin/python bench/bench_read.py [--events N] [--channels D] [--repeats R]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gating_core.fcs import read_fcs, write_fcs  # noqa: E402


def _best_of(repeats: int, func) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = func()
        best = min(best, time.perf_counter() - start)
    return best, result


def run(n_events: int = 1_000_000, n_channels: int = 20, repeats: int = 5, with_flowio: bool = True) -> dict:
    rng = np.random.default_rng(0)
    events = rng.lognormal(5.0, 1.5, size=(n_events, n_channels)).astype(np.float32)
    pnn = [f"FL{i}-A" for i in range(1, n_channels + 1)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench_1M.fcs"
        write_fcs(path, events, pnn)
        sample = read_fcs(path)  # also warms the page cache
        if not np.array_equal(sample.events, events):
            raise AssertionError("read_fcs returned different values than were written")
        data_start = int(sample.keywords["$BEGINDATA"])
        n_bytes = events.nbytes

        def raw_fromfile():
            with open(path, "rb") as fh:
                fh.seek(data_start)
                return np.fromfile(fh, dtype="<f4", count=n_events * n_channels)

        t_raw, _ = _best_of(repeats, raw_fromfile)
        t_read, _ = _best_of(repeats, lambda: read_fcs(path))
        t_flowio = None
        if with_flowio:
            import flowio

            t_flowio, _ = _best_of(1, lambda: flowio.FlowData(str(path)).as_array(preprocess=True))
    mb = n_bytes / 1e6
    return {
        "events": n_events, "channels": n_channels, "data_mb": mb,
        "numpy_fromfile_s": t_raw, "numpy_fromfile_mb_s": mb / t_raw,
        "read_fcs_s": t_read, "read_fcs_mb_s": mb / t_read,
        "read_fcs_events_per_s": n_events / t_read,
        "ratio_vs_fromfile": t_read / t_raw,
        "flowio_s": t_flowio,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--channels", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-flowio", action="store_true", help="skip timing FlowIO's reader")
    args = parser.parse_args(argv)
    r = run(args.events, args.channels, args.repeats, with_flowio=not args.no_flowio)
    print(f"bench_read: {r['events']:,} events x {r['channels']} channels float32 "
          f"({r['data_mb']:.1f} MB DATA), best of {args.repeats}, warm page cache")
    print(f"  numpy.fromfile (limit) : {r['numpy_fromfile_s'] * 1e3:8.1f} ms  "
          f"{r['numpy_fromfile_mb_s']:8.0f} MB/s")
    print(f"  gating_core.read_fcs   : {r['read_fcs_s'] * 1e3:8.1f} ms  {r['read_fcs_mb_s']:8.0f} MB/s  "
          f"{r['read_fcs_events_per_s'] / 1e6:.1f} M events/s")
    print(f"  ratio read_fcs / limit : {r['ratio_vs_fromfile']:.2f}x  (target <= 2x: "
          f"{'met' if r['ratio_vs_fromfile'] <= 2 else 'NOT met'})")
    if r["flowio_s"] is not None:
        print(f"  FlowIO FlowData+as_array (context): {r['flowio_s'] * 1e3:8.1f} ms  "
              f"({r['flowio_s'] / r['read_fcs_s']:.1f}x slower than read_fcs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
