"""Gating on a Dask cluster: same bytes as the serial path, bad files reported, loopback only."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from gating_core.batch.distributed import gate_files_distributed, local_cluster
from gating_core.batch.files import gate_file
from gating_core.model import GatingModel
from gating_core.synthetic import simulate_cohort, simulate_patient, write_sample
from helpers import run_cli

N_EVENTS = 20_000
CHUNK = 7_000  # several chunks per file, the last one short


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """A small model and a batch of FCS files: three good, one truncated, one not FCS at all."""
    root = tmp_path_factory.mktemp("distributed")
    cohort = simulate_cohort(3, seed=11, n_events=5_000)
    model = GatingModel(select=False, n_features=128, n_embedding_features=32, cells_per_patient=1500)
    model.fit([s for s, _ in cohort], [y for _, y in cohort])
    model_path = root / "model.npz"
    model.save(model_path)
    data = root / "data"
    data.mkdir()
    good = []
    for i in range(3):
        sample, _ = simulate_patient((23, i), n_events=N_EVENTS, name=f"new_{i}")
        path = data / f"new_{i}.fcs"
        write_sample(path, sample)
        good.append(path)
    truncated = data / "truncated.fcs"
    whole = good[0].read_bytes()
    truncated.write_bytes(whole[: len(whole) // 2])
    not_fcs = data / "notes.fcs"
    not_fcs.write_text("this is not an FCS file\n")
    return {"model_path": model_path, "model": GatingModel.load(model_path), "good": good,
            "truncated": truncated, "not_fcs": not_fcs, "root": root}


@pytest.fixture(scope="module")
def client():
    from dask.distributed import Client

    with local_cluster(2) as cluster, Client(cluster) as c:
        yield c


def _serial(batch, paths, out_dir):
    records = []
    for path in paths:
        records.extend(gate_file(batch["model"], path, out_dir, chunk_size=CHUNK))
    return records


def _csv_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.gated.csv"))}


def test_cluster_output_is_byte_identical_to_serial(batch, client, tmp_path):
    paths = batch["good"]
    serial_dir, cluster_dir = tmp_path / "serial", tmp_path / "cluster"
    serial_dir.mkdir()
    serial = _serial(batch, paths, serial_dir)
    distributed = gate_files_distributed(batch["model_path"], paths, cluster_dir, chunk_size=CHUNK, client=client)

    serial_csv, cluster_csv = _csv_bytes(serial_dir), _csv_bytes(cluster_dir)
    assert sorted(serial_csv) == ["new_0.gated.csv", "new_1.gated.csv", "new_2.gated.csv"]
    assert sorted(cluster_csv) == sorted(serial_csv)
    for name, content in serial_csv.items():
        assert cluster_csv[name] == content, f"{name} differs between the cluster and the serial path"
        assert content.count(b"\n") == N_EVENTS + 1  # header + one row per event

    # Same records, in the given order, with the output folder as the caller named it.
    assert [r["patient"] for r in distributed] == ["new_0", "new_1", "new_2"]
    for s, d in zip(serial, distributed):
        assert d["output"] == str(cluster_dir / Path(s["output"]).name)
        assert {k: v for k, v in d.items() if k != "output"} == {k: v for k, v in s.items() if k != "output"}
    assert sum(distributed[0]["counts"].values()) == N_EVENTS


def test_failing_files_do_not_stop_the_batch(batch, client, tmp_path):
    paths = [batch["truncated"], batch["good"][1], batch["not_fcs"], batch["good"][2],
             batch["root"] / "data" / "missing.fcs"]
    records = gate_files_distributed(batch["model_path"], paths, tmp_path, chunk_size=CHUNK, client=client)

    assert [r["file"] for r in records] == [str(p) for p in paths]
    errors = {r["file"]: r["error"] for r in records if "error" in r}
    assert sorted(Path(f).name for f in errors) == ["missing.fcs", "notes.fcs", "truncated.fcs"]
    for path, message in errors.items():
        assert message.startswith(f"{path}: "), message  # the path given, not only its name
    assert [r["patient"] for r in records if "error" not in r] == ["new_1", "new_2"]
    # Only the good files produced output, and no temporary file is left behind.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new_1.gated.csv", "new_2.gated.csv"]
    serial_dir = tmp_path / "serial"
    serial_dir.mkdir()
    _serial(batch, [batch["good"][1]], serial_dir)
    assert (tmp_path / "new_1.gated.csv").read_bytes() == (serial_dir / "new_1.gated.csv").read_bytes()


def test_local_cluster_listens_on_loopback_with_one_blas_thread(client):
    info = client.scheduler_info()
    assert client.scheduler.address.startswith("tcp://127.0.0.1:")
    assert len(info["workers"]) == 2
    for address, worker in info["workers"].items():
        assert address.startswith("tcp://127.0.0.1:")
        assert worker["nthreads"] == 1
    # Every socket the cluster's processes listen on is on the loopback interface.
    import psutil

    me = psutil.Process()
    pids = {me.pid} | {p.pid for p in me.children(recursive=True)}
    listening = [(c.laddr.ip, c.laddr.port) for c in psutil.net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN and c.pid in pids]
    assert len(listening) >= 5  # scheduler, its status pages, 2 workers, 2 nannies
    assert {ip for ip, _ in listening} == {"127.0.0.1"}, listening

    def blas_threads():
        import numpy  # noqa: F401 - make sure BLAS is loaded before asking
        from threadpoolctl import threadpool_info

        return os.environ.get("OPENBLAS_NUM_THREADS"), [p["num_threads"] for p in threadpool_info()
                                                        if p["user_api"] == "blas"]

    for env, threads in client.run(blas_threads).values():
        assert env == "1"
        assert threads and all(t == 1 for t in threads)


def test_model_file_loaded_once_per_worker(batch, client, tmp_path):
    paths = batch["good"] * 2  # six tasks on two workers: each worker reuses its loaded model
    gate_files_distributed(batch["model_path"], paths, tmp_path, chunk_size=CHUNK, client=client)

    def cached_models():
        from gating_core.batch import distributed

        return list(distributed._MODEL_CACHE)

    import hashlib

    digest = hashlib.sha256(batch["model_path"].read_bytes()).hexdigest()
    for cached in client.run(cached_models).values():
        assert cached in ([digest], [])  # a worker that got no task has none


def test_cli_gate_with_local_workers(batch, tmp_path):
    """The private cluster gates as the serial path does, and leaves nothing in the temporary
    directory (Dask's own scratch space would keep its lock files there)."""
    out_dir, temporary = tmp_path / "out", tmp_path / "tmp"
    temporary.mkdir()
    # paths as typed from the data's folder: the workers are sent absolute ones, errors say these
    paths = [os.path.relpath(p, batch["root"]) for p in [*batch["good"][:2], batch["truncated"]]]
    result = run_cli("gate", "--model", batch["model_path"], "--out-dir", out_dir, "--workers", "2",
                     "--chunk-size", CHUNK, *paths, timeout=240, cwd=batch["root"], env={"TMPDIR": str(temporary)})
    assert result.returncode == 1, result.stderr  # one file failed
    assert sorted(p.name for p in temporary.rglob("*")) == []
    assert result.stderr.startswith(f"error: {paths[2]}: the file is truncated"), result.stderr
    assert f"new_0: {N_EVENTS:,} events -> {out_dir / 'new_0.gated.csv'}" in result.stdout
    serial_dir = tmp_path / "serial"
    serial_dir.mkdir()
    _serial(batch, batch["good"][:2], serial_dir)
    assert _csv_bytes(out_dir) == _csv_bytes(serial_dir)
    assert len(_csv_bytes(out_dir)) == 2


def test_cli_rejects_workers_and_scheduler_together(batch, tmp_path):
    result = run_cli("gate", "--model", batch["model_path"], "--out-dir", tmp_path, "--workers", "2",
                     "--scheduler", "tcp://127.0.0.1:1", batch["good"][0], timeout=60)
    assert result.returncode == 2
    assert "not allowed with argument" in result.stderr


def test_gate_result_independent_of_chunk_size_on_cluster(batch, client, tmp_path):
    # Chunking bounds memory; it must not change a single label.
    a = gate_files_distributed(batch["model_path"], batch["good"][:1], tmp_path / "a", chunk_size=N_EVENTS,
                               client=client)
    b = gate_files_distributed(batch["model_path"], batch["good"][:1], tmp_path / "b", chunk_size=3_000,
                               client=client)
    assert a[0]["counts"] == b[0]["counts"]
    from gating_core.io.export import read_gated_csv

    _, pop_a, conf_a = read_gated_csv(tmp_path / "a" / "new_0.gated.csv")
    _, pop_b, conf_b = read_gated_csv(tmp_path / "b" / "new_0.gated.csv")
    assert np.array_equal(pop_a, pop_b)
    np.testing.assert_allclose(conf_a, conf_b, atol=1e-6)


def test_unreachable_scheduler_is_a_clear_error(batch, tmp_path):
    from gating_core.batch.distributed import ClusterError

    with pytest.raises(ClusterError, match=r"cannot reach the Dask scheduler at tcp://127\.0\.0\.1:9: "):
        gate_files_distributed(batch["model_path"], batch["good"][:1], tmp_path, scheduler="tcp://127.0.0.1:9",
                               connect_timeout="1s")
    assert list(tmp_path.iterdir()) == []


def test_cluster_gates_with_one_part_as_the_serial_path_does(batch, client, tmp_path):
    assert batch["model"].gating_parts() == ("transfer", "adapted")
    paths = batch["good"][:2]
    records = gate_files_distributed(batch["model_path"], paths, tmp_path / "cluster", chunk_size=CHUNK,
                                     client=client, part="adapted")
    assert [r.get("part") for r in records] == ["adapted", "adapted"]
    serial = tmp_path / "serial"
    serial.mkdir()
    for path in paths:
        assert "error" not in gate_file(batch["model"], path, serial, chunk_size=CHUNK, part="adapted")[0]
    assert _csv_bytes(tmp_path / "cluster") == _csv_bytes(serial)
    assert sorted(_csv_bytes(serial)) == sorted(f"{Path(p).stem}.adapted.gated.csv" for p in paths)
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    _serial(batch, paths, mixed)
    # the part alone is another gating here, under its own name
    assert [v for _, v in sorted(_csv_bytes(mixed).items())] != [v for _, v in sorted(_csv_bytes(serial).items())]
    with pytest.raises(ValueError, match="part='lda'"):
        gate_files_distributed(batch["model_path"], paths, tmp_path / "none", client=client, part="lda")
    assert not (tmp_path / "none").exists()


def test_cli_train_with_local_workers_names_a_bad_input_as_typed(batch, tmp_path):
    """Workers read absolute paths; the error names the file as the caller typed it."""
    typed = os.path.relpath(batch["not_fcs"], batch["root"])
    result = run_cli("train", "--workers", "2", "--no-selection", "--out", tmp_path / "m.npz", typed,
                     timeout=240, cwd=batch["root"])
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"error: {typed}: "), result.stderr
