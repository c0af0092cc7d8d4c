"""Benchmark: scale of gating and training, on one machine and on a Dask cluster.

Prints, with ratios against baselines measured in the same run:

1. Serial gating of one file of 200k, 1M and 5M events (synthetic, 9 channels): events/s for
   the whole job (read FCS, gate, write the gated CSV) and for the gating step alone, and the
   peak memory of the process (each file in its own fresh subprocess) against
   the size of the file's event array (peak = VmHWM, reset after the model is loaded). BLAS is limited to one thread, like a Dask worker.
2. Parallel efficiency on Dask: a batch of 20 files of 200k events gated by a LocalCluster of
   1 worker (1 thread) and of 2 workers (1 thread each), same run; speed-up = t1 / t2.
3. Training time as the number of patients N grows (5, 10, 20 at n = 8,000 cells each) and as
   the cells per patient n grow (2,000, 8,000, 32,000 at N = 10), with and without the
   default cross-validated model selection.

The machine may be shared: the load average is printed beside the figures.

Run standalone: ``.venv/bin/python bench/bench_scale.py [--quick] [--skip-5m] [--only gate|dask|train]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _peak_mb() -> float:
    """This process's peak resident memory (Linux VmHWM).

    Not ``ru_maxrss``: Linux carries that across ``execve`` from the parent process, so a
    child started by a big parent would report the parent's peak.
    """
    return _status_mb("VmHWM")


def _reset_peak() -> None:
    # Writing 5 to clear_refs resets VmHWM to the current RSS (Linux >= 4.0).
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def _process_cpu_seconds() -> float:
    """CPU seconds (user + system) this process has used so far (run on each worker)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _gate_child(model_path: str, fcs_path: str, out_dir: str, chunk_size: int) -> None:
    """Subprocess body: gate one file, print timings and memory as JSON."""
    import numpy as np  # noqa: F401

    from gating_core.fcs import read_fcs
    from gating_core.io.export import write_gated_csv
    from gating_core.model import GatingModel

    model = GatingModel.load(model_path)
    _reset_peak()
    baseline = _status_mb("VmRSS")
    peak_before = _peak_mb()
    t0 = time.perf_counter()
    sample = read_fcs(fcs_path, compensate=model.compensate)
    t1 = time.perf_counter()
    peak_read = _peak_mb()
    result = model.gate(sample, chunk_size=chunk_size)
    t2 = time.perf_counter()
    peak_gate = _peak_mb()
    write_gated_csv(Path(out_dir) / f"{sample.name}.gated.csv", sample, result.populations, result.confidence)
    t3 = time.perf_counter()
    peak = _peak_mb()
    print(json.dumps({"events": sample.n_events, "event_mb": sample.events.nbytes / 2**20,
                      "read_s": t1 - t0, "gate_s": t2 - t1, "write_s": t3 - t2,
                      "baseline_mb": baseline, "peak_before_mb": peak_before, "peak_read_mb": peak_read,
                      "peak_gate_mb": peak_gate, "peak_mb": peak}))


def _make_model(folder: Path):
    from gating_core.model import GatingModel
    from gating_core.synthetic import simulate_cohort

    cohort = simulate_cohort(6, seed=7, n_events=10_000)
    model = GatingModel(select=False).fit([s for s, _ in cohort], [y for _, y in cohort])
    path = folder / "model.npz"
    model.save(path)
    return path


def _write_patient(path: Path, seed, n_events: int) -> None:
    from gating_core.synthetic import simulate_patient, write_sample

    if n_events <= 1_000_000:
        sample, _ = simulate_patient(seed, n_events=n_events, name=path.stem)
        write_sample(path, sample)
        return
    # Large files in 1M-event blocks of different patients' cells, so the simulator's own
    # float64 temporaries do not dominate this process's memory.
    import numpy as np

    from gating_core.fcs import write_fcs

    blocks, first = [], None
    for k in range(0, n_events, 1_000_000):
        sample, _ = simulate_patient((seed, k), n_events=min(1_000_000, n_events - k), name=path.stem,
                                     condition="typical")
        first = first or sample
        blocks.append(sample.events.astype(np.float32))
    keywords = dict(first.keywords)
    for i, channel in enumerate(first.channels, start=1):
        keywords[f"$P{i}R"] = str(int(channel.range or 262144))
    write_fcs(path, np.vstack(blocks), first.pnn, first.pns, keywords)


def bench_gate(folder: Path, sizes, chunk_size: int) -> list[dict]:
    model_path = _make_model(folder)
    rows = []
    for n in sizes:
        fcs = folder / f"patient_{n}.fcs"
        _write_patient(fcs, 100 + n, n)
        out = folder / f"out_{n}"
        out.mkdir()
        env = dict(os.environ, PYTHONPATH=str(REPO), **ONE_THREAD)
        done = subprocess.run([sys.executable, __file__, "--_gate-child", str(model_path), str(fcs), str(out),
                               str(chunk_size)], capture_output=True, text=True, env=env, check=True)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        row["csv_mb"] = sum(p.stat().st_size for p in out.iterdir()) / 2**20
        rows.append(row)
        fcs.unlink()
        for p in out.iterdir():
            p.unlink()
    print(f"\n== Serial gating, one file (chunk {chunk_size:,} events, 1 BLAS thread, fresh process per file) ==")
    print(f"{'events':>10} {'read s':>7} {'gate s':>7} {'write s':>8} {'total ev/s':>11} {'gate ev/s':>10} "
          f"{'events MB':>9} {'peak MB':>8} {'peak-base MB':>12} {'ratio':>6}")
    for r in rows:
        total = r["read_s"] + r["gate_s"] + r["write_s"]
        r["total_rate"] = r["events"] / total
        r["gate_rate"] = r["events"] / r["gate_s"]
        r["growth_mb"] = r["peak_mb"] - r["baseline_mb"]
        r["ratio"] = r["growth_mb"] / r["event_mb"]
        print(f"{r['events']:>10,} {r['read_s']:>7.2f} {r['gate_s']:>7.2f} {r['write_s']:>8.2f} {r['total_rate']:>11,.0f} "
              f"{r['gate_rate']:>10,.0f} {r['event_mb']:>9.1f} {r['peak_mb']:>8.0f} {r['growth_mb']:>12.0f} {r['ratio']:>6.2f}")
    base = rows[0]
    for r in rows[1:]:
        print(f"throughput at {r['events']:,} vs {base['events']:,} events: total x{r['total_rate'] / base['total_rate']:.2f}, "
              f"gating step x{r['gate_rate'] / base['gate_rate']:.2f} (1.00 = flat)")
    print("ratio = (peak RSS - RSS after imports and model load) / size of the event array as read")
    for r in rows:
        print(f"  {r['events']:>10,} events: growth at the end of reading {r['peak_read_mb'] - r['baseline_mb']:.0f} MB, "
              f"of gating {r['peak_gate_mb'] - r['baseline_mb']:.0f} MB, of writing {r['growth_mb']:.0f} MB")
    if len(rows) > 1:
        a, z = rows[-2], rows[-1]
        print(f"marginal memory per event-array MB ({a['events']:,} -> {z['events']:,} events): "
              f"{(z['growth_mb'] - a['growth_mb']) / (z['event_mb'] - a['event_mb']):.2f}")
    return rows


def bench_dask(folder: Path, n_files: int, n_events: int, chunk_size: int) -> dict:
    from dask.distributed import Client

    from gating_core.batch.distributed import gate_files_distributed, local_cluster

    model_path = _make_model(folder)
    data = folder / "batch"
    data.mkdir()
    paths = []
    for i in range(n_files):
        path = data / f"batch_{i:02d}.fcs"
        _write_patient(path, (500, i), n_events)
        paths.append(path)
    times, cores = {}, {}
    for workers in (1, 2):
        out = folder / f"dask_{workers}"
        with local_cluster(workers) as cluster, Client(cluster) as client:
            client.run(lambda: __import__("gating_core.batch.files"))  # imports outside the timing
            cpu_before = sum(client.run(_process_cpu_seconds).values())
            start = time.perf_counter()
            records = gate_files_distributed(model_path, paths, out, chunk_size=chunk_size, client=client)
            times[workers] = time.perf_counter() - start
            cores[workers] = (sum(client.run(_process_cpu_seconds).values()) - cpu_before) / times[workers]
        failed = [r for r in records if "error" in r]
        if failed:
            raise RuntimeError(f"benchmark batch failed: {failed[0]['error']}")
    identical = all((folder / "dask_1" / p.name).read_bytes() == p.read_bytes() for p in (folder / "dask_2").iterdir())
    total = n_files * n_events
    speedup = times[1] / times[2]
    print(f"\n== Dask LocalCluster, {n_files} files x {n_events:,} events (1 thread per worker, BLAS 1 thread) ==")
    for workers in (1, 2):
        print(f"{workers} worker{'s' if workers > 1 else ' '}: {times[workers]:7.2f} s  {total / times[workers]:>11,.0f} events/s"
              f"  CPU obtained by the workers: {cores[workers]:.2f} cores")
    print(f"speed-up 2 vs 1 workers: x{speedup:.2f} (target >= 1.8), parallel efficiency {speedup / 2:.0%}; "
          f"outputs identical between runs: {identical}")
    cpu = {w: cores[w] * times[w] for w in (1, 2)}
    print(f"CPU seconds spent on the batch: 1 worker {cpu[1]:.1f}, 2 workers {cpu[2]:.1f} "
          f"(work efficiency {cpu[1] / cpu[2]:.0%}: extra CPU cost of running two at once)")
    if cores[2] < 1.8:
        print(f"note: the 2 workers only obtained {cores[2]:.2f} cores from the OS (load average "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs: the machine is shared), so the wall-clock "
              "speed-up is capped by the CPU on offer, not by Dask")
        if Path("/proc/sys/kernel/sched_autogroup_enabled").exists() and \
                Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1":
            print("      the kernel shares CPU fairly between sessions (sched_autogroup), and this benchmark and "
                  "its workers are one session: under load, adding workers does not add CPU share")
    return {"t1": times[1], "t2": times[2], "speedup": speedup, "identical": identical, "cores": cores}


def bench_train(patients=(5, 10, 20), cells=(2_000, 8_000, 32_000), fixed_n=8_000, fixed_patients=10) -> dict:
    from gating_core.model import GatingModel
    from gating_core.synthetic import simulate_cohort

    from threadpoolctl import threadpool_limits

    def fit_time(n_patients, n_cells, select):
        cohort = simulate_cohort(n_patients, seed=31, n_events=n_cells)
        with threadpool_limits(limits=1):  # one core: the growth, not the machine's spare cores
            start = time.perf_counter()
            GatingModel(select=select).fit([s for s, _ in cohort], [y for _, y in cohort])
            return time.perf_counter() - start

    print("\n== Training time (synthetic patients; 1 BLAS thread; defaults: 4,000 solver cells and <= 20,000 embedding cells per patient) ==")
    results = {}
    for label, grid, make in (("N patients, n = %d" % fixed_n, patients, lambda v: (v, fixed_n)),
                              ("n cells, N = %d" % fixed_patients, cells, lambda v: (fixed_patients, v))):
        print(f"{label:>22} {'no selection s':>15} {'ratio':>6} {'with CV selection s':>20} {'ratio':>6} {'size ratio':>10}")
        rows = []
        for value in grid:
            n_patients, n_cells = make(value)
            rows.append((value, fit_time(n_patients, n_cells, False), fit_time(n_patients, n_cells, True)))
        for value, plain, selected in rows:
            print(f"{value:>22,} {plain:>15.2f} {plain / rows[0][1]:>6.2f} {selected:>20.2f} {selected / rows[0][2]:>6.2f} "
                  f"{value / rows[0][0]:>10.1f}")
        results[label] = rows
    return results


def main(argv=()) -> int:
    """Run the benchmarks; ``argv`` as on the command line (default: everything, full sizes)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    parser.add_argument("--skip-5m", action="store_true", help="leave out the 5M-event file")
    parser.add_argument("--only", choices=("gate", "dask", "train"), help="run one part")
    parser.add_argument("--chunk-size", type=int, default=50_000)
    parser.add_argument("--_gate-child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(list(argv))
    if args._gate_child:
        model, fcs, out, chunk = args._gate_child
        _gate_child(model, fcs, out, int(chunk))
        return 0
    print(f"bench_scale: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start")
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        tmp = Path(tmp)
        if args.only in (None, "gate"):
            sizes = (50_000, 200_000) if args.quick else (200_000, 1_000_000) if args.skip_5m else (200_000, 1_000_000, 5_000_000)
            (tmp / "gate").mkdir()
            bench_gate(tmp / "gate", sizes, args.chunk_size)
        if args.only in (None, "dask"):
            (tmp / "dask").mkdir()
            if args.quick:
                bench_dask(tmp / "dask", 4, 50_000, args.chunk_size)
            else:
                bench_dask(tmp / "dask", 20, 200_000, args.chunk_size)
        if args.only in (None, "train"):
            if args.quick:
                bench_train(patients=(3, 6), cells=(2_000, 4_000), fixed_n=2_000, fixed_patients=3)
            else:
                bench_train()
    print(f"\nload average at end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
