"""``make bench``: the benchmarks of the product's targets, each printing its figures and ratios to
a same-run baseline. Longer studies run on their own (``bench_centers``, ``bench_library_training``
at 200 patients, ``bench_explore``, the benches of DICA, IW-Nystroem and the papers' other systems):
see each file's docstring."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import bench_browser_render  # noqa: E402
import bench_check  # noqa: E402
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
                       ("Streamed gating of big files, busy machine", lambda: bench_stream.main([])),
                       ("The leave-one-patient-out check against one training", lambda: bench_check.main(["--no-full"])),
                       ("Drawing the app's scatter figures in the browser", _browser_render)):
        print(f"\n######## {title} ########", flush=True)
        status |= int(run() or 0)
    return status


def _browser_render() -> int:
    if not Path(bench_browser_render.CHROMIUM).exists():
        print(f"skipped: {bench_browser_render.CHROMIUM} not installed (make chromium)")
        return 0
    return bench_browser_render.main([])


if __name__ == "__main__":
    sys.exit(main())
