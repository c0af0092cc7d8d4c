"""How many CPUs this process may really use, and pools sized from it.

``os.cpu_count()`` counts the machine's CPUs, not the ones this process may run on: a CPU
affinity mask (``taskset``, a batch scheduler) or a cgroup CPU quota (a container's
``--cpus``, Kubernetes limits, systemd ``CPUQuota``) leaves fewer. Pools sized from
``cpu_count`` then oversubscribe: threads wait on each other while the kernel shares the few
CPUs between them, and OpenBLAS threads that spin on a barrier waste what is left. Every pool
of this project (BLAS threads, the scoring thread pool, Dask local workers) takes its size
from :func:`usable_cpus`, and BLAS runs one thread inside any pool of our own threads.

The pools of our own threads live here too, so that no module reaches into another for them:
:func:`score_threads` (their size), :func:`run_side_by_side` (one item of numpy work per
thread) and :func:`parallel_rows` (row blocks of one array).

``$GATING_CPUS`` overrides the count (a positive integer), e.g. to leave CPUs to other work.
"""

from __future__ import annotations

import math
import os
from contextlib import contextmanager
from pathlib import Path

__all__ = ["allowed_workers", "usable_cpus", "idle_cpus", "affinity_cpus", "cgroup_cpu_limit", "parse_cpu_max",
           "parse_cfs_quota", "blas_threads", "with_blas_threads", "one_blas_thread", "score_threads",
           "run_side_by_side", "parallel_rows"]

CGROUP_ROOT = Path("/sys/fs/cgroup")
#: Seconds a reading of this process's cgroup quota is reused: the scoring pool asks for the
#: usable CPUs on every chunk, and reading the cgroup files each time cost 2.5% of gating.
CGROUP_READING_SECONDS = 5.0
_cgroup_reading: list = []  # [(monotonic time, pid, limit)]
_blas_controller: list = []  # [(pid, ThreadpoolController)]


def parse_cpu_max(text: str) -> float | None:
    """CPUs allowed by a cgroup v2 ``cpu.max`` line (``"<quota> <period>"``, microseconds).

    ``"max 100000"`` -> None (no limit); ``"150000 100000"`` -> 1.5. A malformed line -> None.
    """
    parts = text.split()
    if not parts or parts[0] == "max":
        return None
    try:
        quota = int(parts[0])
        period = int(parts[1]) if len(parts) > 1 else 100_000
    except ValueError:
        return None
    if quota <= 0 or period <= 0:
        return None
    return quota / period


def parse_cfs_quota(quota_text: str, period_text: str) -> float | None:
    """CPUs allowed by cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (-1: no limit)."""
    try:
        quota, period = int(quota_text.strip()), int(period_text.strip())
    except ValueError:
        return None
    if quota <= 0 or period <= 0:
        return None
    return quota / period


def _own_cgroups(proc_cgroup: str) -> list[tuple[str, str]]:
    """(controllers, path) pairs of ``/proc/self/cgroup`` lines ``id:controllers:path``."""
    pairs = []
    for line in proc_cgroup.splitlines():
        fields = line.split(":", 2)
        if len(fields) == 3:
            pairs.append((fields[1], fields[2]))
    return pairs


def cgroup_cpu_limit(root: str | os.PathLike = CGROUP_ROOT, proc_cgroup: str | None = None) -> float | None:
    """The tightest CPU quota on this process's cgroup and its ancestors, in CPUs, or None.

    Reads cgroup v2 ``cpu.max`` (unified hierarchy) or v1 ``cpu.cfs_quota_us``; ``root`` and
    ``proc_cgroup`` (the text of ``/proc/self/cgroup``) can be given for testing."""
    root = Path(root)
    if proc_cgroup is None:
        try:
            proc_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError:
            proc_cgroup = ""
    limits = []
    for controllers, path in _own_cgroups(proc_cgroup) or [("", "/")]:
        relative = path.lstrip("/")
        if controllers == "":  # v2: <root>/<path>/cpu.max, each ancestor may limit too
            folder = root / relative
            while True:
                try:
                    limits.append(parse_cpu_max((folder / "cpu.max").read_text()))
                except OSError:
                    pass
                if folder == root or root not in folder.parents:
                    break
                folder = folder.parent
        elif "cpu" in controllers.split(","):  # v1: a cpu (or cpu,cpuacct) hierarchy
            for mount in (root / "cpu", root / "cpu,cpuacct", root / "cpuacct,cpu"):
                for folder in (mount / relative, mount):  # inside a container the path is its root
                    try:
                        limits.append(parse_cfs_quota((folder / "cpu.cfs_quota_us").read_text(),
                                                      (folder / "cpu.cfs_period_us").read_text()))
                        break
                    except OSError:
                        continue
    limits = [x for x in limits if x is not None]
    return min(limits) if limits else None


def affinity_cpus() -> int:
    """CPUs in this process's affinity mask (``os.cpu_count()`` where there is no such call)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def usable_cpus(affinity: int | None = None, quota: float | None = None, override: str | None = None) -> int:
    """CPUs this process may really use: ``$GATING_CPUS`` if set, else the affinity mask
    capped by the cgroup quota (rounded down, at least 1).

    The arguments replace what is read from the system (for testing): ``affinity`` the
    number of CPUs in the mask, ``quota`` the cgroup limit in CPUs, ``override`` the text of
    ``$GATING_CPUS``."""
    text = os.environ.get("GATING_CPUS", "") if override is None else override
    if text.strip().isdigit() and int(text) > 0:
        return int(text)
    count = affinity_cpus() if affinity is None else int(affinity)
    limit = _recent_cgroup_limit() if quota is None and affinity is None else quota
    if limit is not None:
        count = min(count, max(1, math.floor(limit + 1e-9)))
    return max(1, count)


def _recent_cgroup_limit() -> float | None:
    """:func:`cgroup_cpu_limit` of this process, read again after ``CGROUP_READING_SECONDS``
    (or in a forked child)."""
    import time

    now, pid = time.monotonic(), os.getpid()
    if _cgroup_reading:
        when, owner, limit = _cgroup_reading[0]
        if owner == pid and now - when < CGROUP_READING_SECONDS:
            return limit
    limit = cgroup_cpu_limit()
    _cgroup_reading[:] = [(now, pid, limit)]
    return limit


def idle_cpus(usable: int | None = None, load: float | None = None) -> int:
    """Usable CPUs not already kept busy by other work, judged by the 1-minute load average
    (``load`` replaces it for testing): at least 1, at most :func:`usable_cpus`.

    The load counts this process's own work too (about 1 while it computes), hence the + 1;
    a CPU counts as busy once more than half of one is taken. Rounding down instead made a
    training run on an otherwise idle 2-CPU machine (load 1.1: itself and a little background)
    take one BLAS thread of two. The fitted model does not depend on the count."""
    usable = usable_cpus() if usable is None else usable
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):
            return usable
    return max(1, min(usable, math.floor(usable - load + 1.5)))


def current_blas_threads() -> int | None:
    """Threads the loaded BLAS libraries use now (the largest), or None when none is loaded."""
    from threadpoolctl import threadpool_info

    counts = [int(info.get("num_threads") or 1) for info in threadpool_info() if info.get("user_api") == "blas"]
    return max(counts) if counts else None


@contextmanager
def blas_threads(threads: int | None = None):
    """BLAS (and OpenMP) limited to ``threads`` inside the block, never raised above what it is.

    Default: :func:`idle_cpus`. Multithreaded BLAS synchronises its threads at every call;
    when the CPUs are busy with other work a descheduled BLAS thread stalls the others (a
    training run measured 10x slower with 2 BLAS threads than with 1 beside other CPU-bound
    jobs on 2 CPUs), so BLAS takes only the CPUs that are free. Inside a pool of our own
    threads use ``blas_threads(1)``: each pool thread is already one CPU's worth of work."""
    from threadpoolctl import threadpool_limits

    wanted = max(1, int(threads if threads is not None else idle_cpus()))
    now = current_blas_threads()
    if now is not None:
        wanted = min(wanted, now)
    with threadpool_limits(limits=wanted, user_api="blas"):
        yield


def with_blas_threads(function):
    """Decorator: run ``function`` inside :func:`blas_threads` (its default size)."""
    import functools

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        with blas_threads():
            return function(*args, **kwargs)

    return wrapper


def one_blas_thread():
    """Context manager: BLAS limited to one thread inside the block (what every pool of our
    own threads runs under).

    The loaded BLAS libraries are found once per process: ``threadpool_limits`` scans them on
    every call (about 1 ms), which cost 18% of gating a 1M-event file, whose scoring enters
    such a block on every chunk, and a seventh of each eigendecomposition of the held-out check.
    SciPy is imported first, so that its own BLAS (a separate library from NumPy's in the
    wheels) is among those found."""
    pid = os.getpid()
    if not _blas_controller or _blas_controller[0][0] != pid:
        import scipy.linalg  # noqa: F401  (loads SciPy's BLAS before the scan)
        from threadpoolctl import ThreadpoolController

        _blas_controller[:] = [(pid, ThreadpoolController())]
    return _blas_controller[0][1].limit(limits=1, user_api="blas")


def allowed_workers(n_items: int) -> int:
    """Threads for ``n_items`` items of one-CPU numpy work here: the BLAS threads allowed at
    this point (sized by :func:`blas_threads`; 1 inside a pool of our own threads), at most
    one per item, at least 1."""
    return max(1, min(n_items, current_blas_threads() or 1))


def run_side_by_side(function, items, workers: int) -> list:
    """``[function(item) for item in items]``, on up to ``workers`` threads, BLAS limited to one
    thread throughout: each item is one CPU's worth of numpy work (numpy releases the GIL), and
    BLAS threads inside a pool of threads only wait on each other. Serially when
    ``workers <= 1``. Results in the order of ``items``."""
    items = list(items)
    with one_blas_thread():
        if workers <= 1 or len(items) <= 1:
            return [function(item) for item in items]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(workers, len(items))) as pool:
            return list(pool.map(function, items))


def score_threads() -> int:
    """Threads of the pools that score, transform or compensate blocks of cells.

    ``$GATING_SCORE_THREADS`` if set, else up to 4 of the :func:`usable_cpus` (the CPUs this
    process may use, not the machine's). Dask workers set it to 1: one thread per worker
    process, the parallelism being across files.
    """
    value = os.environ.get("GATING_SCORE_THREADS", "")
    return max(1, int(value)) if value.isdigit() else min(4, usable_cpus())


def parallel_rows(function, n_rows: int, max_block: int = 262_144, min_block: int = 8192) -> None:
    """Call ``function((lo, hi))`` on row blocks covering ``range(n_rows)``.

    On :func:`score_threads` threads when the rows are many (at least ``min_block`` per
    thread), with BLAS at one thread meanwhile. For row-wise work (compensation, transforms)
    whose result for a row does not depend on the block it is in: numpy releases the GIL, so
    the blocks run in parallel.

    Parameters
    ----------
    function : callable
        Called once per block with ``(lo, hi)``; its return value is ignored.
    n_rows : int
        Rows to cover.
    max_block, min_block : int
        Largest block, and fewest rows per thread worth a thread of their own.
    """
    threads = max(1, min(score_threads(), n_rows // min_block))
    step = min(max_block, -(-n_rows // threads)) if n_rows else 1
    bounds = [(lo, min(lo + step, n_rows)) for lo in range(0, n_rows, step)]
    if threads == 1:
        for b in bounds:
            function(b)
        return
    from concurrent.futures import ThreadPoolExecutor

    with one_blas_thread(), ThreadPoolExecutor(threads) as pool:
        list(pool.map(function, bounds))
