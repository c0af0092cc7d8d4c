"""Gating many FCS files in parallel on a Dask distributed cluster.

One task per FCS file. Each task runs the same code as the serial path
(:func:`gating_core.batch.files.gate_file`), so outputs are byte-identical to a one-process run on
the same kind of CPU. A worker whose CPU gets another BLAS kernel (OpenBLAS picks one per CPU
model) may round the float32 scores differently: confidences then differ in their last float32
bits (4.8e-7 at most between the Haswell and SkylakeX kernels on the sample data), and a
population only where two tie within that.

What travels over the network:

- the model file's bytes, read once by the client and broadcast to every worker with
  ``client.scatter`` (a model is a few MB at most); each worker process loads it once with
  :meth:`GatingModel.load` (the .npz reader, no pickle) and keeps it for its next files;
- each task's FCS path, the output folder and the chunk size, and back the small record dict
  (counts, novelty, output path).

The events themselves never travel: workers read the FCS files and write the gated CSVs
through storage they share with the client (a network file system on a real cluster). Paths
are made absolute on the client, so they must mean the same file on every worker.

A worker limits its BLAS to one thread per task thread (Dask runs several tasks per worker
only when it has several threads), so K workers of one thread use K cores, not K x cores.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import threading
import uuid
import weakref
from contextlib import contextmanager
from pathlib import Path

from gating_core.errors import ClusterError

# Every worker process gets these before numpy starts: one BLAS thread per Dask thread.
WORKER_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "GATING_SCORE_THREADS": "1", "GATING_CPUS": "1"}

_MODEL_CACHE: dict[str, object] = {}
_MODEL_LOCK = threading.Lock()


def local_cluster(workers: int, threads_per_worker: int = 1, memory_limit="auto"):
    """A Dask ``LocalCluster`` of ``workers`` processes bound to the loopback interface.

    Nothing listens beyond 127.0.0.1: the scheduler, the workers, their nannies and the
    scheduler's status pages (on a free port, not the usual 8787 another user may hold) all
    bind to it.

    The workers' scratch space is a private temporary folder, removed when the cluster is
    closed (or collected): Dask's shared one in the temporary directory keeps its lock files
    after every run.
    """
    import dask
    from dask.distributed import LocalCluster

    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    scratch = tempfile.mkdtemp(prefix="gating-dask-")
    try:
        # Each nanny takes a copy of the configuration when it is made, and its worker (a
        # restarted one too) finds its scratch space there.
        with dask.config.set({"temporary-directory": scratch}):
            # Task failures reach the client as exceptions and become the file's error record;
            # what the private cluster logs on its own (a heartbeat that misses a scheduler
            # already shutting down on a busy machine) is a traceback on the user's terminal and
            # says nothing about the files.
            cluster = LocalCluster(n_workers=workers, threads_per_worker=threads_per_worker, processes=True,
                                   host="127.0.0.1", dashboard_address="127.0.0.1:0", memory_limit=memory_limit,
                                   env=dict(WORKER_ENV), silence_logs=logging.CRITICAL)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    remove_scratch = weakref.finalize(cluster, shutil.rmtree, scratch, True)
    close = cluster.close

    def close_and_remove_scratch(*args, **kwargs):
        try:
            return close(*args, **kwargs)
        finally:
            remove_scratch()

    cluster.close = close_and_remove_scratch
    return cluster


def _load_model_cached(model_bytes: bytes, digest: str):
    """The GatingModel (or ResearchGatingModel) in ``model_bytes``, loaded once per worker process
    (keyed by SHA-256)."""
    from gating_core.model.research import load_gating_model

    with _MODEL_LOCK:
        model = _MODEL_CACHE.get(digest)
        if model is None:
            # The loader reads a path: go through a private temp file, removed at once.
            handle, name = tempfile.mkstemp(suffix=".npz", prefix="gating-model-")
            try:
                with os.fdopen(handle, "wb") as out:
                    out.write(model_bytes)
                model = load_gating_model(name)
            finally:
                os.unlink(name)
            _MODEL_CACHE.clear()  # one model at a time is what a batch needs
            _MODEL_CACHE[digest] = model
        return model


def _gate_task(model_bytes: bytes, digest: str, fcs_path: str, out_dir: str, chunk_size: int,
               format: str = "csv", include_identifying: bool = False, keep_keywords=(), part=None) -> list[dict]:
    """Worker side: gate one file with the serial code path, BLAS limited to one thread."""
    from gating_core.batch.files import gate_file

    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
        threadpool_limits = None
    model = _load_model_cached(model_bytes, digest)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    options = dict(chunk_size=chunk_size, format=format, include_identifying=include_identifying,
                   keep_keywords=tuple(keep_keywords), part=part)
    if threadpool_limits is None:
        return gate_file(model, fcs_path, out_dir, **options)
    with threadpool_limits(limits=1):
        return gate_file(model, fcs_path, out_dir, **options)


def _as_typed(message: str, resolved: str, typed: str) -> str:
    """A worker's message, which names the file by the absolute path it was sent, naming it as the
    caller typed it (as the serial path does)."""
    return typed + message[len(resolved):] if message.startswith(f"{resolved}: ") else message


def _failure_record(path: str, exc: BaseException) -> dict:
    from gating_core.batch.files import naming_the_file

    return {"file": path, "patient": Path(path).stem, "error": naming_the_file(Path(path), exc)}


@contextmanager
def cluster_client(workers=None, scheduler=None, client=None, connect_timeout="30s"):
    """A Dask client: the one given, one connected to ``scheduler``, or a local cluster of
    ``workers`` one-thread processes on 127.0.0.1 (closed on exit). Raises ClusterError."""
    from dask.distributed import Client

    if client is not None:
        yield client
        return
    own_cluster = None
    if scheduler:
        try:
            client = Client(scheduler, timeout=connect_timeout)
        except (OSError, TimeoutError, ValueError) as exc:
            raise ClusterError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from None
    else:
        if workers is not None and workers < 1:
            raise ClusterError(f"--workers must be at least 1, got {workers}")
        from gating_core.cpus import usable_cpus  # affinity and cgroup quota, not the machine's count

        own_cluster = local_cluster(workers or usable_cpus())
        client = Client(own_cluster)
    try:
        yield client
    finally:
        client.close()
        if own_cluster is not None:
            own_cluster.close()


def _digest_task(path: str, index: int, params: dict):
    """On a worker: read one labeled INPUT and reduce it to a PatientDigest (or an error)."""
    from gating_core.batch.files import digest_file
    from gating_core.errors import describe_error
    from gating_core.fcs import FCSError
    from gating_core.io.labels import LabelError
    from gating_core.model.research import build_model

    try:
        # ``params`` are a model's get_params(): a ResearchGatingModel's name its options.
        return digest_file(path, index, build_model(params))
    except (FCSError, LabelError, OSError, ValueError) as exc:
        return {"file": path, "error": describe_error(exc)}


def digest_files_distributed(paths, model_params: dict, workers=None, scheduler=None, client=None,
                             connect_timeout="30s"):
    """Read and digest labeled training INPUTs on a Dask cluster (see ``train --workers``).

    Each worker reads its files where they are (shared storage), compensates, draws the
    training cells and picks the embedding cells, and sends back only those rows: a few
    thousand per patient instead of the file. Returns (digests, errors) in input order;
    ``build_model(model_params).fit_digests(digests)`` (:func:`gating_core.model.research.build_model`:
    a GatingModel, or a ResearchGatingModel for its options) then gives the same model as ``fit``.
    """
    given = [str(p) for p in paths]
    paths = [str(Path(p).resolve()) for p in paths]  # where the workers find them
    with cluster_client(workers, scheduler, client, connect_timeout) as client:
        batch = uuid.uuid4().hex
        futures = [client.submit(_digest_task, p, i, model_params, key=f"digest-{i}-{batch}", pure=False)
                   for i, p in enumerate(paths)]
        digests, errors = [], []
        for path, typed, future in zip(paths, given, futures):
            try:
                result = future.result()
            except Exception as exc:  # noqa: BLE001 - a worker crash is reported per file
                result = _failure_record(path, exc)
            if isinstance(result, dict):
                errors.append(_as_typed(result["error"], path, typed))
            else:
                digests.append(result)
        return digests, errors


def gate_files_distributed(model_path, fcs_paths, out_dir, workers=None, scheduler=None, chunk_size=50_000,
                           client=None, connect_timeout="30s", format: str = "csv", *,
                           include_identifying: bool = False, keep_keywords=(), part=None) -> list[dict]:
    """Gate ``fcs_paths`` in parallel on Dask; write ``<out_dir>/<stem>.gated.csv`` per patient.

    Parameters
    ----------
    model_path : path of a model file written by :meth:`GatingModel.save`
    fcs_paths : list of paths (the workers must see them at the same absolute paths)
    out_dir : output folder (shared storage too)
    workers : int or None
        Start a local cluster of this many one-thread worker processes on 127.0.0.1.
    scheduler : str or None
        Address of an existing scheduler (``tcp://host:8786``); used instead of ``workers``.
    chunk_size : int
        Events gated at a time (bounds each worker's memory), as in the serial path.
    client : dask.distributed.Client or None
        Use this client (and its cluster) instead of creating one.
    connect_timeout : str or float
        How long to keep trying to reach ``scheduler``.
    format : str
        Output format, as :func:`gating_core.batch.files.gate_file` takes it (default gated CSV).
    include_identifying, keep_keywords
        The keyword policy of FCS and h5ad outputs, as :func:`gating_core.batch.files.gate_file`
        takes it.
    part : str or None
        The model's part to gate with alone, as :func:`gating_core.batch.files.gate_file` takes it
        (a name not of ``GATING_PARTS`` raises ValueError before anything runs).

    Returns
    -------
    list of dict, one record per data set, files in the given order: the records
    :func:`gating_core.batch.files.gate_file` returns (``file`` and ``output`` as the caller wrote
    them). A file that fails, even by crashing its worker, gets a record with ``error``; the
    other files are gated regardless.

    Raises
    ------
    ClusterError
        When the scheduler cannot be reached or ``workers`` is below 1.
    """
    if part is not None:
        from gating_core.model.result import GATING_PARTS

        if part not in GATING_PARTS:  # the caller's error, not each file's (the model checks the rest)
            raise ValueError(f"part={part!r}: one of {', '.join(GATING_PARTS)}, or None for the model's own gating")
    model_bytes = Path(model_path).read_bytes()
    digest = hashlib.sha256(model_bytes).hexdigest()
    fcs_paths = [str(p) for p in fcs_paths]
    out_dir_given = Path(out_dir)
    out_dir_abs = str(out_dir_given.resolve())

    with cluster_client(workers, scheduler, client, connect_timeout) as client:
        batch = uuid.uuid4().hex
        model_future = client.scatter(model_bytes, broadcast=True, hash=False)
        futures = [client.submit(_gate_task, model_future, digest, str(Path(p).resolve()), out_dir_abs, chunk_size,
                                 format, include_identifying, tuple(keep_keywords), part,
                                 key=f"gate-{i}-{batch}", pure=False, retries=0)
                   for i, p in enumerate(fcs_paths)]
        records = []
        for path, future in zip(fcs_paths, futures):
            try:
                file_records = future.result()
            except Exception as exc:  # noqa: BLE001 - a worker crash or bug is reported per file
                records.append(_failure_record(path, exc))
                continue
            for record in file_records:
                # Report the paths as the caller wrote them, like the serial path does.
                if "error" in record:
                    record["error"] = _as_typed(record["error"], str(Path(path).resolve()), path)
                record["file"] = path
                if "output" in record:
                    record["output"] = str(out_dir_given / Path(record["output"]).name)
                records.append(record)
        return records
