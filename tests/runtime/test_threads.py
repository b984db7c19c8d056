"""The thread policy: the CPUs a process may use (affinity, cgroup v1 and v2 quotas, read
from fake cgroup trees), what decides the count, bad counts named, and a real process
confined to one CPU computing with one thread."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from seqtrans.errors import UsageError
from seqtrans.runtime import threads


def cgroup_v2(tmp_path: Path, limits: dict[str, str], own: str = "/app/worker") -> tuple[Path, Path]:
    root, proc = tmp_path / "cgroup", tmp_path / "proc"
    (root / "cgroup.controllers").parent.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    for path, value in limits.items():
        node = root / path.lstrip("/")
        node.mkdir(parents=True, exist_ok=True)
        (node / "cpu.max").write_text(value + "\n")
    (root / own.lstrip("/")).mkdir(parents=True, exist_ok=True)
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text(f"0::{own}\n")
    return root, proc


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="cgroups are Linux's")
@pytest.mark.parametrize(("limits", "expected"), [
    ({"/": "max 100000"}, None),  # no quota
    ({"/app": "150000 100000"}, 1.5),  # a parent's quota holds for its children
    ({"/app": "400000 100000", "/app/worker": "100000 100000"}, 1.0),  # the smallest on the way up
    ({"/app/worker": "max 100000"}, None),
])
def test_the_cgroup_v2_quota_is_the_smallest_on_the_way_to_the_root(tmp_path: Path, limits: dict[str, str],
                                                                     expected: float | None) -> None:
    root, proc = cgroup_v2(tmp_path, limits)
    assert threads.cgroup_cpus(root=root, proc=proc) == expected


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="cgroups are Linux's")
@pytest.mark.parametrize(("quota", "expected"), [("50000", 0.5), ("-1", None), ("300000", 3.0)])
def test_the_cgroup_v1_quota_is_quota_over_period(tmp_path: Path, quota: str, expected: float | None) -> None:
    root = tmp_path / "cgroup"
    (root / "cpu,cpuacct").mkdir(parents=True)
    (root / "cpu,cpuacct" / "cpu.cfs_quota_us").write_text(quota + "\n")
    (root / "cpu,cpuacct" / "cpu.cfs_period_us").write_text("100000\n")
    assert threads.cgroup_cpus(root=root, proc=tmp_path / "proc") == expected


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="cgroups are Linux's")
def test_available_cpus_are_the_affinity_capped_by_the_quota_rounded_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "affinity_cpus", lambda: 8)
    root, proc = cgroup_v2(tmp_path, {"/app": "150000 100000"})
    assert threads.available_cpus(root=root, proc=proc) == 2
    root, proc = cgroup_v2(tmp_path / "none", {"/": "max 100000"})
    assert threads.available_cpus(root=root, proc=proc) == 8
    root, proc = cgroup_v2(tmp_path / "small", {"/app": "20000 100000"})
    assert threads.available_cpus(root=root, proc=proc) == 1  # never 0


def test_without_sched_getaffinity_the_machines_cpus_are_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    assert threads.affinity_cpus() == (os.cpu_count() or 1)


def test_the_flag_then_the_environment_decide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "available_cpus", lambda: 2)
    monkeypatch.delenv("SEQTRANS_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert threads.chosen_threads() == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert threads.chosen_threads() is None  # the user's OpenMP setting is left to PyTorch
    monkeypatch.setenv("SEQTRANS_THREADS", "3")
    assert threads.chosen_threads() == 3
    assert threads.chosen_threads(5) == 5
    monkeypatch.setenv("SEQTRANS_THREADS", "zero")
    with pytest.raises(UsageError, match="SEQTRANS_THREADS"):
        threads.chosen_threads()


def test_more_threads_than_cpus_are_honoured_with_a_warning(monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    import torch

    monkeypatch.setattr(threads, "available_cpus", lambda: 2)
    monkeypatch.setenv("OMP_NUM_THREADS", str(torch.get_num_threads()))  # put back after the test
    monkeypatch.setenv("SEQTRANS_THREADS", "")
    before = torch.get_num_threads()
    try:
        assert threads.set_threads(3) == 3
        assert torch.get_num_threads() == 3 and os.environ["OMP_NUM_THREADS"] == "3"
        assert os.environ["SEQTRANS_THREADS"] == "3"  # an explicit count holds for the processes it starts
        assert "3 threads, more than the 2 CPUs" in caplog.text
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_a_bad_thread_count_is_a_usage_error_naming_the_flag(value: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from seqtrans.cli import main

    with pytest.raises(SystemExit) as exited:
        main([f"--threads={value}", "tasks"])
    assert exited.value.code == 2 and "--threads" in capsys.readouterr().err


def test_a_bad_environment_count_is_a_usage_error_naming_the_variable(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from seqtrans.cli import main

    monkeypatch.setenv("SEQTRANS_THREADS", "-1")
    assert main(["tasks"]) == 2
    assert "SEQTRANS_THREADS" in capsys.readouterr().err


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2,
                    reason="needs CPU affinity and two CPUs")
def test_a_process_confined_to_one_cpu_computes_with_one_thread() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "SEQTRANS_THREADS")}
    probe = ("import os, sys; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
             "from seqtrans.cli import main; import torch; main(['tasks']); "
             "print('threads', torch.get_num_threads())")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "threads 1" in done.stdout


def test_the_flag_sets_the_threads_of_the_command() -> None:
    probe = "import sys, torch; from seqtrans.cli import main; main(sys.argv[1:]); print('threads', " \
            "torch.get_num_threads())"
    done = subprocess.run([sys.executable, "-c", probe, "--threads", "1", "tasks"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "threads 1" in done.stdout


def test_the_default_is_said_to_openmp_only_where_a_quota_caps_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.delenv("SEQTRANS_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "")  # unset for the policy, put back after the test
    monkeypatch.setattr(threads, "affinity_cpus", lambda: 2)
    before = torch.get_num_threads()
    try:
        monkeypatch.setattr(threads, "available_cpus", lambda: 2)
        assert threads.set_threads() == 2
        assert os.environ["OMP_NUM_THREADS"] == ""  # a launcher's one thread per rank still holds
        monkeypatch.setattr(threads, "available_cpus", lambda: 1)  # a quota of one CPU
        assert threads.set_threads() == 1 and os.environ["OMP_NUM_THREADS"] == "1"
        assert "SEQTRANS_THREADS" not in os.environ
    finally:
        torch.set_num_threads(before)


def test_workers_share_the_process_threads_unless_a_count_is_given(monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(threads, "available_cpus", lambda: 4)
    monkeypatch.delenv("SEQTRANS_THREADS", raising=False)
    assert threads.worker_threads(1, process=4) is None  # one worker keeps the process's count
    assert threads.worker_threads(2, process=4) == 2
    assert threads.worker_threads(3, process=4) == 1
    assert threads.worker_threads(8, process=4) == 1  # one at least
    assert "8 workers of 1 threads each compute with 8 threads, more than the 4 CPUs" in caplog.text
    assert threads.worker_threads(2, threads=3, process=4) == 3  # --threads is each worker's
    monkeypatch.setenv("SEQTRANS_THREADS", "1")
    assert threads.worker_threads(1, process=4) == 1
    assert threads.worker_threads(2, process=4) == 1


@pytest.mark.parametrize(("policy", "expected"), [
    ("passive", {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": None}),
    ("Active", {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": None}),
    ("10000", {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": "10000"}),
    ("default", {"OMP_WAIT_POLICY": "mine", "GOMP_SPINCOUNT": "5"})])  # the user's own, untouched
def test_the_wait_policy_is_said_to_openmp(monkeypatch: pytest.MonkeyPatch, policy: str,
                                           expected: dict[str, str | None]) -> None:
    monkeypatch.setenv("OMP_WAIT_POLICY", "mine")
    monkeypatch.setenv("GOMP_SPINCOUNT", "5")
    monkeypatch.delenv("SEQTRANS_WAIT_POLICY", raising=False)
    assert threads.set_wait_policy(policy) == policy.lower()
    assert {name: os.environ.get(name) for name in expected} == expected
    assert os.environ["SEQTRANS_WAIT_POLICY"] == policy.lower()  # for the processes it starts


def test_without_a_policy_the_environment_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SEQTRANS_WAIT_POLICY", raising=False)
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert threads.set_wait_policy() is None and os.environ["OMP_WAIT_POLICY"] == "ACTIVE"
    monkeypatch.setenv("SEQTRANS_WAIT_POLICY", "passive")
    assert threads.set_wait_policy() == "passive" and os.environ["OMP_WAIT_POLICY"] == "PASSIVE"


def test_where_nobody_chose_idle_threads_sleep_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SEQTRANS_WAIT_POLICY", raising=False)
    monkeypatch.setenv("OMP_WAIT_POLICY", "")  # unset for the policy, put back after the test
    monkeypatch.setenv("GOMP_SPINCOUNT", "")
    assert threads.set_wait_policy() == "passive" and os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    assert "SEQTRANS_WAIT_POLICY" not in os.environ  # a started process decides the same way
    monkeypatch.setenv("OMP_WAIT_POLICY", "")
    monkeypatch.setenv("GOMP_SPINCOUNT", "20000")  # the user's spin count wins
    assert threads.set_wait_policy() is None and os.environ["OMP_WAIT_POLICY"] == ""


@pytest.mark.parametrize("value", ["sleepy", "-5", "1.5", ""])
def test_a_bad_wait_policy_is_a_usage_error_naming_the_flag(value: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from seqtrans.cli import main

    with pytest.raises(SystemExit) as exited:
        main([f"--wait-policy={value}", "tasks"])
    assert exited.value.code == 2 and "--wait-policy" in capsys.readouterr().err


def test_a_bad_environment_wait_policy_is_a_usage_error_naming_the_variable(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from seqtrans.cli import main

    monkeypatch.setenv("SEQTRANS_WAIT_POLICY", "sleepy")
    assert main(["tasks"]) == 2
    assert "SEQTRANS_WAIT_POLICY" in capsys.readouterr().err


IDLE_SPIN = """
import os, sys, time
from seqtrans.cli import main
main(sys.argv[1:])
import torch
torch.set_num_threads(2)
x = torch.ones(1 << 22)
for _ in range(20):
    x.add_(1)  # a parallel region: the second thread joins, then waits for the next
before = time.process_time()
time.sleep(0.5)
print("idle cpu", time.process_time() - before)
"""


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two CPUs")
def test_the_flag_reaches_openmp_active_threads_spin_while_idle_passive_ones_sleep() -> None:
    """The process's CPU time while its main thread sleeps after a parallel region: an
    OpenMP thread that spins for work uses it, one that sleeps does not."""
    used = {}
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    for policy in ("active", "passive"):
        done = subprocess.run([sys.executable, "-c", IDLE_SPIN, "-q", "--wait-policy", policy, "tasks"],
                              capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        used[policy] = float(done.stdout.split("idle cpu")[1])
    assert used["active"] > 0.05 and used["passive"] < 0.03, used
