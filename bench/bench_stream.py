"""Benchmark: streamed gating of big files: peak memory, throughput, busy machine.

Prints, with ratios against baselines measured in the same run:

1. Per file size (1M, 5M, 20M events x 20 channels, float32, with a spillover matrix; written
   with the project's FCS writer in a temp folder and deleted afterwards), each step in a
   fresh process, all pools at their defaults (sized by ``gating_core.cpus``):
   - ``gate``: ``GatingModel.gate_chunks`` without output (two chunked reads of the file,
     compensation, the content hash, scoring) -- the gating step;
   - ``csv`` / ``parquet``: ``gating_core.batch.files.gate_file`` end to end to the gated file;
   - ``in-memory``: today's path (read the whole file, ``GatingModel.gate``, write the CSV),
     for the memory baseline and to check the streamed CSV is byte-identical (SHA-256);
   peak memory = VmHWM minus the resident size after imports and model load.
2. The scoring step's ceiling on this machine: the measured sgemm rate and cosine rate on all
   usable CPUs, turned into events/s for this model's products ((n, d+1) x (d+1, D), cos,
   (n, D) x (D, k), for the marginal model, its second-bandwidth fit and its pooled companion);
   the scoring rate measured on 1M in-memory cells is printed as a ratio to it.

The model is the default one (selection, the pooled companion, the adapted populations),
trained on six simulated patients.
3. Busy machine: training and gating (1M events to CSV) alone, then beside two CPU-bound
   processes; the slowdown ratio is printed beside the CPU share lost.

Run: ``.venv/bin/python bench/bench_stream.py [--quick] [--sizes 1000000,5000000] [--skip-busy]``;
``--against-previous`` times only the gating step of the default model beside the previous
default's (shift augmentation, second bandwidth, self-training) on the same files.
``--quick``: 200k and 1M events only, a shorter busy test.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench_scale import _status_mb  # noqa: E402  (the same /proc reading)
from gating_core.library.storage import sha256_of  # noqa: E402

N_CHANNELS = 20
N_POPULATIONS = 6
BLOCK = 1_000_000


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as fh:  # VmHWM := current RSS (Linux >= 4.0)
        fh.write("5")


# -- synthetic 20-channel data -------------------------------------------------------------------

def _channels():
    return ["FSC-A", "SSC-A"] + [f"FL{i}-A" for i in range(1, N_CHANNELS - 1)]


def _spillover():
    import numpy as np

    k = N_CHANNELS - 2
    matrix = np.eye(k)
    for i in range(k - 1):
        matrix[i, i + 1] = 0.04
        matrix[i + 1, i] = 0.01
    return matrix


def _patient(seed, n: int):
    """Events (n, 20) float32 (linear scale, spilled over) and labels: a mixture of
    N_POPULATIONS populations on arcsinh scale, the patient's seed shifting their centres."""
    import numpy as np

    rng = np.random.default_rng(seed)
    base = np.random.default_rng(0)
    centres = base.normal(0, 2.0, size=(N_POPULATIONS, N_CHANNELS))
    centres += rng.normal(0, 0.2, size=centres.shape)  # patient-to-patient shift
    shares = rng.dirichlet(np.full(N_POPULATIONS, 5.0))
    labels = rng.choice(N_POPULATIONS, size=n, p=shares)
    x = centres[labels] + rng.normal(0, 0.5, size=(n, N_CHANNELS))
    events = np.sinh(x) * 150.0
    events[:, :2] = np.abs(events[:, :2]) * 10 + 1000  # scatter channels: positive, linear
    events[:, 2:] = events[:, 2:] @ _spillover()
    return events.astype(np.float32), np.array([f"pop{c}" for c in range(N_POPULATIONS)])[labels]


def _keywords():
    matrix = _spillover()
    fl = _channels()[2:]
    values = ",".join(repr(float(v)) for v in matrix.ravel())
    return {"$SPILLOVER": f"{len(fl)}," + ",".join(fl) + "," + values, "$CYT": "synthetic"}


def write_file(path: Path, n_events: int, seed: int = 1) -> None:
    import numpy as np

    from gating_core.fcs import write_fcs

    events = np.empty((n_events, N_CHANNELS), dtype=np.float32)
    for k in range(0, n_events, BLOCK):
        events[k:k + BLOCK] = _patient((seed, k), min(BLOCK, n_events - k))[0]
    write_fcs(path, events, _channels(), None, _keywords(), ranges=[262144] * N_CHANNELS)


#: The previous default model's settings (shift augmentation, a second cell bandwidth,
#: self-training; no adapted populations), for ``--against-previous``.
PREVIOUS_DEFAULT = {"n_augment": 4, "bandwidth_x_hedge": 0.5, "self_training": True, "adaptive_weight": 0.0,
                    "unknown_margin": None}


def make_model(folder: Path, n_patients: int = 6, n_events: int = 10_000, params=None, name="model.npz",
               with_trees: bool = False) -> Path:
    """A model trained on simulated patients; ``with_trees``: its pooled trees fitted and kept
    whether or not the check took them (what gating a model that took them costs)."""
    from gating_core.fcs import Channel, Sample
    from gating_core.method.boosted_trees import PooledTrees
    from gating_core.model import GatingModel
    from gating_core.model.research import build_model

    samples, labels = [], []
    for i in range(n_patients):
        events, y = _patient(100 + i, n_events)
        samples.append(Sample(f"train{i}", events, [Channel(c, "", 262144) for c in _channels()], _keywords()))
        samples[-1].spillover, samples[-1].spillover_channels = _spillover(), _channels()[2:]
        labels.append(y)
    # The defaults, selection included: the model then carries every fit a gated cell pays for
    # (the second-bandwidth fit exists only when sigma_X was selected).
    model = build_model(dict(params or {})).fit(samples, labels)  # PREVIOUS_DEFAULT: a ResearchGatingModel
    if with_trees and model.pooled_trees_ is None:
        cells, drawn = GatingModel().standardised_training_cells(samples, labels)  # the model's cells
        model.pooled_trees_ = PooledTrees(random_state=0).fit(cells, drawn, model.populations_)
    print(f"{name}: selection; feature maps scored per cell: "
          f"{1 + (model.hedge_classifier_ is not None) + (model.pooled_classifier_ is not None)}, "
          f"self-training {'on' if model.self_training else 'off'}, adapted populations weight "
          f"{getattr(model, 'adaptive_weight_', 0.0):g}, unknown cells "
          f"{'on' if model._unknown_called() else 'off'}, pooled trees "
          f"{'taken' if getattr(model, 'pooled_trees_', None) is not None else 'not taken'}", flush=True)
    path = folder / name
    model.save(path)
    return path


# -- children: one measured step in a fresh process ---------------------------------------------

def _child(step: str, model_path: str, fcs_path: str, out_dir: str) -> None:
    from gating_core.model.research import load_gating_model

    model = load_gating_model(model_path)
    _reset_peak()
    baseline = _status_mb("VmRSS")
    t0 = time.perf_counter()
    extra = {}
    if step == "gate":
        from gating_core.fcs import stream_fcs_all

        stream = stream_fcs_all(fcs_path, compensate=model.compensate)[0]
        result = model.gate_chunks(stream.sample, stream.chunks)
        n = result.n_events
    elif step in ("csv", "parquet"):
        from gating_core.batch.files import gate_file

        record = gate_file(model, fcs_path, out_dir, format=step)[0]
        assert "error" not in record, record
        n = record["events"]
        extra["output"] = record["output"]
    elif step == "in-memory":
        from gating_core.batch.files import _gate_file_whole

        record = _gate_file_whole(model, fcs_path, out_dir, format="csv")[0]
        assert "error" not in record, record
        n = record["events"]
        extra["output"] = record["output"]
    else:
        raise ValueError(step)
    seconds = time.perf_counter() - t0
    print(json.dumps({"step": step, "events": n, "seconds": seconds, "growth_mb": _status_mb("VmHWM") - baseline,
                      "baseline_mb": baseline, **extra}))


def run_child(step: str, model_path: Path, fcs: Path, out_dir: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, __file__, "--_child", step, str(model_path), str(fcs), str(out_dir)],
                          capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(f"{step} on {fcs.name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


#: The default with its parts weighed otherwise, for ``--against-previous``: the adapted
#: populations at another weight, with and without the unknown-cell call.
MIXED = {"adaptive_weight": 0.5}
MIXED_NO_UNKNOWN = {"adaptive_weight": 0.5, "unknown_margin": None}
#: The default without the check of rare populations that swell (what that check costs).
NO_SWOLLEN_CHECK = {"swollen_check": False}


def against_previous(folder: Path, sizes) -> int:
    """The gating step of the default model beside the previous default's, on the same files,
    each in a fresh process, three times each (the best time kept: the machine is shared). Also
    the default with its adapted populations at weight 0.5, with and without the unknown-cell
    call (which the own-shape fit's posteriors share their distances with), the default
    without the check of rare populations that swell, and the default with its pooled trees
    (kept whether or not its check took them)."""
    models = {"default": make_model(folder),
              "with pooled trees": make_model(folder, name="with_trees.npz", with_trees=True),
              "no swollen check": make_model(folder, params=NO_SWOLLEN_CHECK, name="no_swollen_check.npz"),
              "g=0.5": make_model(folder, params=MIXED, name="mixed.npz"),
              "g=0.5, no unknown": make_model(folder, params=MIXED_NO_UNKNOWN, name="mixed_no_unknown.npz"),
              "previous": make_model(folder, params=PREVIOUS_DEFAULT, name="previous.npz")}
    print("\n== Gating step (two chunked reads, compensation, content hash, scoring), best of 3; events/s ==")
    print(f"{'events':>11} | " + " ".join(f"{name:>18}" for name in models) + " | default / previous")
    for n in sizes:
        fcs = folder / f"file_{n}.fcs"
        write_file(fcs, n)
        rates = {}
        for name, path in models.items():
            best = min(run_child("gate", path, fcs, folder)["seconds"] for _ in range(3))
            rates[name] = n / best
        print(f"{n:>11,} | " + " ".join(f"{rates[name]:>18,.0f}" for name in models) +
              f" | x{rates['default'] / rates['previous']:.2f}", flush=True)
        fcs.unlink()
    return 0


# -- the ceiling of the scoring step ---------------------------------------------------------------

def scoring_ceiling(model_path: Path) -> dict:
    """Events/s the scoring products allow on this machine (sgemm and cosine rates measured on
    all usable CPUs), and the scoring rate measured on 1M in-memory cells."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from gating_core.cpus import blas_threads, usable_cpus
    from gating_core.model.research import load_gating_model

    threads = usable_cpus()
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2048, 2048), dtype=np.float32)
    with blas_threads(threads):
        a @ a
        t = time.perf_counter()
        for _ in range(3):
            a @ a
        gemm_rate = 3 * 2 * 2048 ** 3 / (time.perf_counter() - t)
    blocks = [rng.standard_normal((2048, 512), dtype=np.float32) for _ in range(8 * threads)]
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(np.cos, blocks))
        t = time.perf_counter()
        for _ in range(3):
            list(pool.map(lambda b: np.cos(b, out=b), blocks))
        cos_rate = 3 * sum(b.size for b in blocks) / (time.perf_counter() - t)

    model = load_gating_model(model_path)
    # Every fit whose features each gated cell needs: the marginal model, its second-bandwidth
    # fit (a model trained with sigma_X selected) and the pooled companion.
    scorers = [c for c in (model.classifier_, getattr(model, "hedge_classifier_", None),
                           getattr(model, "pooled_classifier_", None)) if c is not None]
    d, k = len(model.channels_), len(model.populations_)
    flops = sum(2 * (d + 1) * c.coef_.shape[0] + 2 * c.coef_.shape[0] * k for c in scorers)
    cosines = sum(c.coef_.shape[0] for c in scorers)
    ceiling = 1.0 / (flops / gemm_rate + cosines / cos_rate)

    events, _ = _patient(7, 1_000_000)
    cells = model._standardise(events)
    embedding = model.classifier_.embed(cells)
    model._proba(cells[:100_000], embedding, 50_000)
    t = time.perf_counter()
    for start in range(0, len(cells), 51_200):
        model._proba(cells[start:start + 51_200], embedding, 51_200)
    score_rate = len(cells) / (time.perf_counter() - t)
    return {"threads": threads, "gemm_gflops": gemm_rate / 1e9, "cos_per_s": cos_rate, "flops_per_event": flops,
            "cosines_per_event": cosines, "ceiling": ceiling, "score_rate": score_rate}


# -- busy machine ----------------------------------------------------------------------------------

BUSY = "import time\nend = time.time() + {seconds}\nx = 0\nwhile time.time() < end:\n    x += 1\n"


def _busy_child(model_path: str, fcs_path: str, out_dir: str) -> None:
    from gating_core.batch.files import gate_file
    from gating_core.fcs import Channel, Sample
    from gating_core.model import GatingModel
    from gating_core.model.research import load_gating_model

    samples, labels = [], []
    for i in range(8):
        events, y = _patient(200 + i, 20_000)
        samples.append(Sample(f"p{i}", events, [Channel(c, "", 262144) for c in _channels()]))
        labels.append(y)
    t = time.perf_counter()
    GatingModel(select=True, cv_repeats=1).fit(samples, labels)
    train_s = time.perf_counter() - t
    model = load_gating_model(model_path)
    t = time.perf_counter()
    gate_file(model, fcs_path, out_dir)
    gate_s = time.perf_counter() - t
    print(json.dumps({"train_s": train_s, "gate_s": gate_s}))


def bench_busy(model_path: Path, fcs: Path, out_dir: Path, n_busy: int = 2) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO))

    def run():
        done = subprocess.run([sys.executable, __file__, "--_busy-child", str(model_path), str(fcs), str(out_dir)],
                              capture_output=True, text=True, env=env, check=True)
        return json.loads(done.stdout.strip().splitlines()[-1])

    alone = run()
    hogs = [subprocess.Popen([sys.executable, "-c", BUSY.format(seconds=900)]) for _ in range(n_busy)]
    try:
        time.sleep(2)
        busy = run()
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    return {"alone": alone, "busy": busy, "n_busy": n_busy}


# -- main ----------------------------------------------------------------------------------------

def main(argv=()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sizes", default="")
    parser.add_argument("--skip-busy", action="store_true")
    parser.add_argument("--against-previous", action="store_true",
                        help="only the gating step, of the default model and of the previous default "
                             "(PREVIOUS_DEFAULT) on the same files, with the ratio")
    parser.add_argument("--check-all", action="store_true",
                        help="compare the streamed CSV with the in-memory one at every size (default: up to 5M)")
    args = parser.parse_args(list(argv))
    from gating_core.cpus import affinity_cpus, cgroup_cpu_limit, usable_cpus

    sizes = ([int(s) for s in args.sizes.split(",")] if args.sizes
             else [200_000, 1_000_000] if args.quick else [1_000_000, 5_000_000, 20_000_000])
    print(f"bench_stream: {os.cpu_count()} CPUs, affinity {affinity_cpus()}, cgroup quota {cgroup_cpu_limit()}, "
          f"usable {usable_cpus()}; load average {os.getloadavg()[0]:.1f} at start")
    folder = Path(tempfile.mkdtemp(prefix="bench-stream-"))
    if args.against_previous:
        try:
            return against_previous(folder, sizes)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    try:
        model_path = make_model(folder)
        rows = []
        for n in sizes:
            free_gb = shutil.disk_usage(folder).free / 2**30
            need_gb = n * N_CHANNELS * 4 * 4.5 / 2**30  # the FCS file and its gated CSV (~4x)
            if free_gb < need_gb + 2:
                print(f"skipping {n:,} events: {free_gb:.0f} GB free in {folder}, about {need_gb:.0f} GB needed")
                continue
            fcs = folder / f"file_{n}.fcs"
            write_file(fcs, n)
            row = {"events": n, "event_mb": n * N_CHANNELS * 4 / 2**20}
            for step in ("gate", "csv", "parquet"):
                out = folder / f"out_{step}"
                out.mkdir(exist_ok=True)
                row[step] = run_child(step, model_path, fcs, out)
                if step == "parquet":
                    Path(row[step]["output"]).unlink()
            if n <= 5_000_000 or args.check_all:
                out = folder / "out_memory"
                out.mkdir(exist_ok=True)
                row["in-memory"] = run_child("in-memory", model_path, fcs, out)
                row["identical"] = sha256_of(Path(row["csv"]["output"])) == sha256_of(Path(row["in-memory"]["output"]))
                Path(row["in-memory"]["output"]).unlink()
            Path(row["csv"]["output"]).unlink()
            fcs.unlink()
            rows.append(row)
            print(f"  {n:,} events done (load average {os.getloadavg()[0]:.1f})", flush=True)

        print(f"\n== Streamed gating, {N_CHANNELS} channels float32 with spillover, chunk 50,000, fresh process per step ==")
        print(f"{'events':>11} {'events MB':>9} | {'peak MB above baseline':^40} | {'events/s':^35} | {'ratio to gate':^14} | same CSV")
        print(f"{'':>11} {'':>9} | {'gate':>9} {'csv':>9} {'parquet':>9} {'in-memory':>10} | {'gate':>11} {'csv':>11} "
              f"{'parquet':>11} | {'csv':>6} {'parq':>6} |")
        for r in rows:
            rate = {s: r["events"] / r[s]["seconds"] for s in ("gate", "csv", "parquet")}
            memory = r.get("in-memory", {}).get("growth_mb", float("nan"))
            print(f"{r['events']:>11,} {r['event_mb']:>9.0f} | {r['gate']['growth_mb']:>9.0f} {r['csv']['growth_mb']:>9.0f} "
                  f"{r['parquet']['growth_mb']:>9.0f} {memory:>10.0f} | {rate['gate']:>11,.0f} {rate['csv']:>11,.0f} "
                  f"{rate['parquet']:>11,.0f} | {rate['csv'] / rate['gate']:>6.2f} {rate['parquet'] / rate['gate']:>6.2f} | "
                  f"{r.get('identical', 'not run')}")
        if rows:
            peaks = [max(r[s]["growth_mb"] for s in ("gate", "csv", "parquet")) for r in rows]
            print(f"peak growth, largest over the steps: {', '.join(f'{p:.0f}' for p in peaks)} MB "
                  f"(target < 300 MB at every size); largest file / smallest: x{peaks[-1] / peaks[0]:.2f} (1.00 = flat)")
            big = rows[-1]
            print(f"targets at {big['events']:,} events: gating step {big['events'] / big['gate']['seconds'] / 2e6:.2f} of 2 M/s; "
                  f"CSV {big['events'] / big['csv']['seconds'] / 1e6:.2f} of 1 M/s; "
                  f"Parquet {big['events'] / big['parquet']['seconds'] / 2e6:.2f} of 2 M/s")

        c = scoring_ceiling(model_path)
        print(f"\n== Scoring ceiling ({c['threads']} threads): sgemm {c['gemm_gflops']:.0f} GFLOP/s, cosine "
              f"{c['cos_per_s'] / 1e9:.2f} G/s; model: {c['flops_per_event']:,} flops + {c['cosines_per_event']} cosines "
              f"an event ==")
        print(f"ceiling {c['ceiling']:,.0f} events/s; scoring measured {c['score_rate']:,.0f} events/s "
              f"(ratio {c['score_rate'] / c['ceiling']:.2f}); target 2 M/s is {2e6 / c['ceiling']:.2f} of the ceiling")

        if not args.skip_busy:
            fcs = folder / "busy.fcs"
            write_file(fcs, 200_000 if args.quick else 1_000_000)
            out = folder / "out_busy"
            out.mkdir(exist_ok=True)
            b = bench_busy(model_path, fcs, out)
            share = (usable_cpus() + b["n_busy"]) / usable_cpus()
            print(f"\n== Beside {b['n_busy']} CPU-bound processes ({usable_cpus()} usable CPUs) ==")
            for key, label in (("train_s", "train (8 x 20,000 cells, CV selection)"), ("gate_s", "gate to CSV")):
                print(f"{label:>40}: alone {b['alone'][key]:.1f} s, busy {b['busy'][key]:.1f} s, "
                      f"slowdown x{b['busy'][key] / b['alone'][key]:.2f}")
            print(f"CPU share lost: about x{share:.1f} when the work uses every CPU, x{(1 + b['n_busy']) / usable_cpus():.1f} "
                  "for one thread; target: slowdown near it (about 2-3x), not 10x+")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--_child":
        _child(*sys.argv[2:6])
    elif len(sys.argv) > 1 and sys.argv[1] == "--_busy-child":
        _busy_child(*sys.argv[2:5])
    else:
        sys.exit(main(sys.argv[1:]))
