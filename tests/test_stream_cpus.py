"""CPU counting for pool sizes: cgroup quotas (v1, v2), affinity, the override, BLAS limits."""

from __future__ import annotations

import os

import pytest

from gating_core import cpus


@pytest.mark.parametrize("text, expected", [
    ("max 100000\n", None),
    ("150000 100000\n", 1.5),
    ("200000 100000", 2.0),
    ("50000 100000", 0.5),
    ("100000", 1.0),          # period omitted: the kernel's default 100 ms
    ("", None),
    ("garbage here", None),
    ("-1 100000", None),
])
def test_parse_cpu_max(text, expected):
    assert cpus.parse_cpu_max(text) == expected


def test_parse_cfs_quota():
    assert cpus.parse_cfs_quota("-1\n", "100000\n") is None
    assert cpus.parse_cfs_quota("300000\n", "100000\n") == 3.0
    assert cpus.parse_cfs_quota("x", "100000") is None


def test_cgroup_v2_takes_the_tightest_of_the_process_group_and_its_ancestors(tmp_path):
    (tmp_path / "user.slice" / "job").mkdir(parents=True)
    (tmp_path / "cpu.max").write_text("max 100000\n")
    (tmp_path / "user.slice" / "cpu.max").write_text("150000 100000\n")
    (tmp_path / "user.slice" / "job" / "cpu.max").write_text("300000 100000\n")
    assert cpus.cgroup_cpu_limit(tmp_path, "0::/user.slice/job\n") == 1.5
    assert cpus.cgroup_cpu_limit(tmp_path, "0::/\n") is None


def test_cgroup_v1_quota(tmp_path):
    folder = tmp_path / "cpu,cpuacct" / "docker" / "abc"
    folder.mkdir(parents=True)
    (folder / "cpu.cfs_quota_us").write_text("250000\n")
    (folder / "cpu.cfs_period_us").write_text("100000\n")
    text = "12:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n"
    assert cpus.cgroup_cpu_limit(tmp_path, text) == 2.5
    (folder / "cpu.cfs_quota_us").write_text("-1\n")
    assert cpus.cgroup_cpu_limit(tmp_path, text) is None


def test_usable_cpus_caps_affinity_by_quota_and_honours_the_override():
    assert cpus.usable_cpus(affinity=8, quota=None, override="") == 8
    assert cpus.usable_cpus(affinity=8, quota=2.5, override="") == 2
    assert cpus.usable_cpus(affinity=2, quota=6.0, override="") == 2
    assert cpus.usable_cpus(affinity=4, quota=0.5, override="") == 1
    assert cpus.usable_cpus(affinity=8, quota=2.0, override="3") == 3
    assert cpus.usable_cpus(affinity=8, quota=None, override="0") == 8  # not a positive count


def test_usable_cpus_follows_this_process_affinity():
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no affinity calls on this platform")
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(before)})
        assert cpus.affinity_cpus() == 1
        assert cpus.usable_cpus(override="") == 1
    finally:
        os.sched_setaffinity(0, before)
    assert cpus.affinity_cpus() == len(before)


def test_idle_cpus_leaves_the_busy_ones():
    assert cpus.idle_cpus(usable=2, load=0.2) == 2
    assert cpus.idle_cpus(usable=2, load=1.0) == 2   # our own run counts in the load
    assert cpus.idle_cpus(usable=2, load=1.4) == 2   # ... with a little background beside it
    assert cpus.idle_cpus(usable=2, load=1.6) == 1   # more than half a CPU taken by others
    assert cpus.idle_cpus(usable=2, load=2.5) == 1
    assert cpus.idle_cpus(usable=8, load=4.0) == 5
    assert cpus.idle_cpus(usable=2, load=11.0) == 1


def test_blas_threads_limits_and_never_raises():
    from threadpoolctl import threadpool_limits

    if cpus.current_blas_threads() is None:
        pytest.skip("no BLAS loaded")
    with cpus.blas_threads(1):
        assert cpus.current_blas_threads() == 1
        with cpus.blas_threads(64):  # inside a limit of 1, stays 1
            assert cpus.current_blas_threads() == 1
    with threadpool_limits(limits=1, user_api="blas"):
        wrapped = cpus.with_blas_threads(lambda: cpus.current_blas_threads())
        assert wrapped() == 1


def test_scoring_pool_is_sized_from_usable_cpus(monkeypatch):
    from gating_core.cpus import score_threads

    monkeypatch.delenv("GATING_SCORE_THREADS", raising=False)
    monkeypatch.setenv("GATING_CPUS", "1")
    assert score_threads() == 1
    monkeypatch.setenv("GATING_CPUS", "3")
    assert score_threads() == 3
    monkeypatch.setenv("GATING_SCORE_THREADS", "2")
    assert score_threads() == 2


def test_one_blas_thread_limits_blas_and_scans_the_libraries_once():
    if cpus.current_blas_threads() is None:
        pytest.skip("no BLAS loaded")
    before = cpus.current_blas_threads()
    with cpus.one_blas_thread():
        assert cpus.current_blas_threads() == 1
        controller = cpus._blas_controller[0][1]
    assert cpus.current_blas_threads() == before  # restored on leaving the block
    with cpus.one_blas_thread():
        assert cpus._blas_controller[0][1] is controller  # found once per process, not per call
        assert cpus.current_blas_threads() == 1


def test_the_cgroup_quota_is_read_again_only_after_a_while(monkeypatch):
    reads = []
    monkeypatch.setattr(cpus, "cgroup_cpu_limit", lambda *a, **k: reads.append(1) or 1.5)
    monkeypatch.setattr(cpus, "_cgroup_reading", [])
    monkeypatch.delenv("GATING_CPUS", raising=False)
    assert cpus.usable_cpus() == 1 and cpus.usable_cpus() == 1
    assert len(reads) == 1
    monkeypatch.setattr(cpus, "CGROUP_READING_SECONDS", 0.0)
    assert cpus.usable_cpus() == 1
    assert len(reads) == 2
