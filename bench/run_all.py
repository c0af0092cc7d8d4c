"""``make bench``: every benchmark, each printing its figures and ratios to a same-run baseline."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import bench_ellipse  # noqa: E402
import bench_model  # noqa: E402
import bench_read  # noqa: E402
import bench_scale  # noqa: E402
import bench_stream  # noqa: E402


def main() -> int:
    status = 0
    for title, run in (("FCS reading", lambda: bench_read.main([])),
                       ("Model training and gating", lambda: bench_model.main([])),
                       ("JMLR ellipse task", lambda: bench_ellipse.main([])),
                       ("Scale: streaming, Dask, training growth", lambda: bench_scale.main([])),
                       ("Streamed gating of big files, busy machine", lambda: bench_stream.main([]))):
        print(f"\n######## {title} ########", flush=True)
        status |= int(run() or 0)
    return status


if __name__ == "__main__":
    sys.exit(main())
