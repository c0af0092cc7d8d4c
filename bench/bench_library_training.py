"""Benchmark: training from a patient library of N patients x 200,000 events (N = 10, 50, 200).

What ``train --library DIR`` does, stage by stage, serially (BLAS limited to the CPUs
:mod:`gating_core.cpus` grants, as the command runs), each training in a fresh process so that
its peak memory (Linux VmHWM) is its own:

- ``old read path``: the library read as the command read it before the digest cache
  (``load_training_set`` holds every patient's events, then each is digested); read and digest
  only, no fit: the fit is the same code on the same digests (checked: the digests' checksum
  must match the new path's).
- ``cold``: :func:`gating_core.library.digest_cache.library_digests` on an empty cache (reads every
  patient's events and labels once, digests, stores the digest), then the fit with default
  selection, broken down into the fit's stages (transform and groups, selection, final fit,
  companion, novelty).
- ``warm``: the library's digests again once the cache is full (no events file read); the fit
  is not repeated (same digests, same fit: the checksums are compared).
- ``+1 patient``: one patient added to the largest library, its digests read again (one events
  file read).

Generated patients (FCS + labels) are kept in ``--files`` (default a folder under the system's
temp dir) and reused by later runs; the library is rebuilt in a temp dir each run (its import
time is printed, not counted).

Run: ``nice -n 15 .venv/bin/python bench/bench_library_training.py [--sizes 10 50 200] [--quick]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench_scale import _status_mb  # noqa: E402  (a sibling bench: /proc/self/status fields in MB)

EVENTS = 200_000
FILES_SEED = 1414


def _patient_files(folder: Path, n: int, n_events: int) -> list[tuple[Path, Path]]:
    """FCS + labels (.npy of str) of the first ``n`` simulated patients, generated once."""
    import numpy as np

    from gating_core.synthetic import simulate_patient, write_sample

    folder.mkdir(parents=True, exist_ok=True)
    pairs = []
    for i in range(n):
        fcs, labels = folder / f"patient_{i:03d}.fcs", folder / f"patient_{i:03d}.labels.npy"
        if not (fcs.exists() and labels.exists()):
            sample, y = simulate_patient((FILES_SEED, i), n_events=n_events, name=fcs.stem)
            write_sample(fcs, sample)
            tmp = labels.with_name(labels.name + ".part.npy")
            np.save(tmp, np.asarray(y, dtype=str), allow_pickle=False)
            os.replace(tmp, labels)
        pairs.append((fcs, labels))
    return pairs


def _grow_library(library_dir: Path, pairs) -> float:
    """Add the patients of ``pairs`` not yet in the library; returns seconds spent."""
    import numpy as np

    from gating_core.fcs import read_fcs
    from gating_core.library import PatientLibrary

    library = PatientLibrary(library_dir)
    present = set(library.patient_names())
    start = time.perf_counter()
    for fcs, labels in pairs:
        if fcs.stem not in present:
            library.add_patient(read_fcs(fcs), np.load(labels, allow_pickle=False), source_files=[("fcs", fcs)])
    return time.perf_counter() - start


def _digests_checksum(digests) -> str:
    h = hashlib.sha256()
    for d in digests:
        for a in (d.train_events, d.embedding_events):
            h.update(a.tobytes())
        h.update("\0".join(d.train_labels.tolist()).encode())
    return h.hexdigest()[:16]


def _train_child(library_dir: str, mode: str) -> None:
    """Subprocess body: one training (or the old read path) on the library; prints JSON."""
    from gating_core.cpus import usable_cpus
    from gating_core.library import PatientLibrary
    from gating_core.model import GatingModel
    from gating_core.model.digest import digest_patient

    import gating_core.library.storage as storage

    reads = {"events": 0}
    real_read_events = storage.read_events

    def counting_read_events(*args, **kwargs):
        reads["events"] += 1
        return real_read_events(*args, **kwargs)

    storage.read_events = counting_read_events
    model = GatingModel()
    library = PatientLibrary(library_dir, create=False)
    out = {"mode": mode, "usable_cpus": usable_cpus()}
    t0, cpu0 = time.perf_counter(), time.process_time()
    if mode == "old":
        samples, labels = library.load_training_set(compensate=model.compensate)
        t1 = time.perf_counter()
        digests = [digest_patient(s, y, model.cells_per_patient, model.embedding_cells, seed=model.digest_seed(i),
                                  compensate=model.compensate) for i, (s, y) in enumerate(zip(samples, labels))]
        out.update(read_s=t1 - t0, digest_s=time.perf_counter() - t1)
        del samples, labels
    else:
        from gating_core.library.digest_cache import library_digests

        digests, stats = library_digests(library, model)
        out.update(read_s=stats.read_seconds, digest_s=stats.digest_seconds, cache_read_s=stats.cache_read_seconds,
                   cache_write_s=stats.cache_write_seconds, hits=stats.hits, misses=stats.misses)
    out["load_s"] = time.perf_counter() - t0
    out["n"] = len(digests)
    out["events_files_read"] = reads["events"]
    out["checksum"] = _digests_checksum(digests)
    out["peak_load_mb"] = _status_mb("VmHWM")
    out["load_cpu_s"] = time.process_time() - cpu0
    if mode == "cold":
        import cProfile
        import pstats

        marks = []
        profile = cProfile.Profile()
        fit_start, fit_cpu = time.perf_counter(), time.process_time()
        profile.enable()
        model.fit_digests(digests, progress=lambda stage, fraction: marks.append((stage, time.perf_counter())))
        profile.disable()
        fit_end = time.perf_counter()
        out["fit_cpu_s"] = time.process_time() - fit_cpu
        cumulative = {f"{Path(k[0]).stem}.{k[2]}": v[3] for k, v in pstats.Stats(profile).stats.items()}
        out["hotspots"] = {name: cumulative.get(name, 0.0) for name in HOTSPOTS}
        stages: dict[str, float] = {}
        for (stage, at), (_, nxt) in zip(marks, marks[1:] + [("end", fit_end)]):
            stages[stage] = stages.get(stage, 0.0) + nxt - at
        out["fit_s"] = fit_end - fit_start
        out["stages"] = stages
        out["cv_accuracy"] = model.selection_.get("cv_accuracy")
        out["params"] = model.selection_.get("params")
        out["selection_patients"] = model.selection_.get("n_patients")
    out["total_s"] = time.perf_counter() - t0
    out["peak_mb"] = _status_mb("VmHWM")
    print(json.dumps(out, default=float))


def _run_child(library_dir: Path, mode: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, __file__, "--_train-child", str(library_dir), mode],
                          capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(f"training child ({mode}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


#: Functions whose cumulative time the cold run reports (cProfile, wall seconds inside the fit).
HOTSPOTS = ("patient_embeddings.embed_patients", "patient_embeddings.embed_cells", "landmarks.cell_features", "ridge.add_patient", "ridge.eigen",
            "lbfgs.minimise_linear", "digest.infer_cell_groups", "selection.run")

STAGE_NAMES = {"Transforming events": "transform+groups", "Model selection (cross-validation over patients)": "selection",
               "Fitting the final model": "final fit", "Fitting the pooled companion": "companion", "Done": "novelty"}


def _print_row(n: int, r: dict) -> None:
    stages = {STAGE_NAMES.get(k, k): v for k, v in r.get("stages", {}).items()}
    cols = " ".join(f"{stages.get(k, 0.0):>9.1f}" for k in ("transform+groups", "selection", "final fit", "companion"))
    fit = f"{r['fit_s']:>7.1f}" if "fit_s" in r else f"{'-':>7}"
    print(f"{n:>4} {r['mode']:>6} {r['events_files_read']:>6} {r['read_s']:>7.1f} {r['digest_s']:>7.1f} "
          f"{r.get('cache_write_s', 0.0):>6.1f} {r['load_s']:>7.1f} {cols} {fit} {r['total_s']:>7.1f} "
          f"{r['peak_load_mb']:>8.0f} {r['peak_mb']:>8.0f}")


def main(argv=()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 50, 200])
    parser.add_argument("--events", type=int, default=EVENTS)
    parser.add_argument("--files", type=Path, default=Path(tempfile.gettempdir()) / "gating-bench-library-files",
                        help="folder of generated patients, reused across runs")
    parser.add_argument("--skip-old", action="store_true", help="leave out the old read path")
    parser.add_argument("--quick", action="store_true", help="sizes 4 and 8 of 20,000 events (a smoke run)")
    parser.add_argument("--_train-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(list(argv))
    if args._train_child:
        _train_child(*args._train_child)
        return 0
    if args.quick:
        args.sizes, args.events = [4, 8], 20_000
    files = args.files if args.events == EVENTS else args.files.with_name(f"{args.files.name}-{args.events}")
    print(f"bench_library_training: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start; "
          f"patients of {args.events:,} events, defaults (selection on, 512 features, 4 augmented copies)")
    start = time.perf_counter()
    pairs = _patient_files(files, max(args.sizes) + 1, args.events)
    print(f"generated patient files ready in {time.perf_counter() - start:.0f} s ({files})")
    print(f"\n{'N':>4} {'mode':>6} {'files':>6} {'read s':>7} {'dig s':>7} {'put s':>6} {'load s':>7} "
          f"{'transf s':>9} {'select s':>9} {'final s':>9} {'compan s':>9} {'fit s':>7} {'total s':>7} "
          f"{'peakL MB':>8} {'peak MB':>8}")
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-library-") as tmp:
        library_dir = Path(tmp) / "library"
        for n in sorted(args.sizes):
            imported = _grow_library(library_dir, pairs[:n])
            print(f"     (library grown to {n} patients: import {imported:.0f} s, "
                  f"load average {os.getloadavg()[0]:.2f})")
            row = {}
            if not args.skip_old:
                row["old"] = _run_child(library_dir, "old")
                _print_row(n, row["old"])
            row["cold"] = _run_child(library_dir, "cold")
            _print_row(n, row["cold"])
            row["warm"] = _run_child(library_dir, "warm")
            _print_row(n, row["warm"])
            if "old" in row and row["old"]["checksum"] != row["cold"]["checksum"]:
                print("     !! digests of the old read path differ from the cached path's")
            if row["warm"]["checksum"] != row["cold"]["checksum"]:
                print("     !! digests read from the cache differ from freshly made ones")
            results[n] = row
        top = max(args.sizes)
        _grow_library(library_dir, pairs[: top + 1])
        added = _run_child(library_dir, "warm")
        results["added"] = added
        _print_row(top + 1, dict(added, mode="+1"))
    print("\nfiles = events files read; read/dig/put = reading patients, digesting, storing digests; "
          "load = all of those; peakL = peak RSS after loading, peak = after the fit")
    sizes = sorted(args.sizes)
    base = results[sizes[0]]
    print("\nCPU seconds (process, all threads) and where the fit's time went (cProfile, cumulative wall s):")
    for n in sizes:
        c = results[n]["cold"]
        spots = ", ".join(f"{k.split('.')[-1]} {v:.1f}" for k, v in c["hotspots"].items())
        print(f"N={n:>3}: load {c['load_cpu_s']:.1f} CPU s, fit {c['fit_cpu_s']:.1f} CPU s in {c['fit_s']:.1f} s wall; {spots}")
        print(f"       selection on {c['selection_patients']} patients chose {c['params']}, CV accuracy {c['cv_accuracy']:.4f}")
    for n in sizes:
        c, w = results[n]["cold"], results[n]["warm"]
        line = (f"N={n:>3}: cold {c['total_s']:.1f} s ({c['total_s'] / n:.2f} s/patient, x{c['total_s'] / base['cold']['total_s']:.1f} "
                f"of N={sizes[0]} for x{n / sizes[0]:.0f} patients), warm load {w['load_s']:.1f} s; "
                f"shares of cold: load {c['load_s'] / c['total_s']:.0%}")
        for key, name in (("Model selection (cross-validation over patients)", "selection"),
                          ("Fitting the final model", "final fit"), ("Fitting the pooled companion", "companion")):
            line += f", {name} {c['stages'].get(key, 0.0) / c['total_s']:.0%}"
        if "old" in results[n]:
            o = results[n]["old"]
            line += (f"; old read path {o['load_s']:.1f} s, peak {o['peak_load_mb']:.0f} MB vs "
                     f"{c['peak_load_mb']:.0f} MB")
        print(line)
    print(f"retrain after adding one patient to {top}: {added['events_files_read']} events file read, "
          f"load {added['load_s']:.1f} s, total {added['total_s']:.1f} s")
    print(f"load average at end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
