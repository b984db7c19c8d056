"""The calls seqtrans makes to the operating system, and their fallbacks where a call is
Linux's alone, each tried here by hiding what Linux has: ``fcntl`` (then Windows's
``msvcrt``, then a lock file made with ``O_EXCL``), glibc's ``malloc_trim``, and
``/proc/cpuinfo``."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest

from seqtrans import native
from seqtrans.runtime import system


def assert_excludes(path: Path) -> None:
    """Three threads take the lock on ``path`` in turn: never two inside at once."""
    inside, overlaps, done = [], [], []

    def worker() -> None:
        with system.file_lock(path, poll_s=0.005):
            inside.append(1)
            if len(inside) > 1:
                overlaps.append(1)
            time.sleep(0.05)
            inside.pop()
            done.append(1)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert len(done) == 3 and not overlaps


def hide(monkeypatch: Any, *names: str) -> None:
    """Make ``import NAME`` fail, as on a platform without the module."""
    for name in names:
        monkeypatch.setitem(sys.modules, name, None)


@pytest.mark.skipif(sys.platform == "win32", reason="fcntl is POSIX")
def test_the_lock_excludes_with_fcntl_between_processes(tmp_path: Path) -> None:
    lock = tmp_path / "data.lock"
    script = ("import sys, time\nfrom pathlib import Path\nfrom seqtrans.runtime.system import file_lock\n"
              "with file_lock(Path(sys.argv[1])):\n    print('in', flush=True)\n    time.sleep(1.0)\n")
    holder = subprocess.Popen([sys.executable, "-c", script, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "in\n"
        start = time.monotonic()
        with system.file_lock(lock):
            waited = time.monotonic() - start
        assert waited > 0.3  # it waited for the other process to let go
    finally:
        holder.wait(timeout=30)


def test_without_fcntl_or_msvcrt_a_lock_file_excludes(monkeypatch: Any, tmp_path: Path) -> None:
    hide(monkeypatch, "fcntl", "msvcrt")
    assert_excludes(tmp_path / "data.lock")
    assert list(tmp_path.iterdir()) == []  # the lock file goes with the lock


def test_the_lock_file_of_a_process_that_died_is_taken_over(monkeypatch: Any, tmp_path: Path) -> None:
    hide(monkeypatch, "fcntl", "msvcrt")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    (tmp_path / "data.lock.held").write_text(gone.stdout.strip())
    with system.file_lock(tmp_path / "data.lock", poll_s=0.005):
        assert (tmp_path / "data.lock.held").read_text() == str(os.getpid())


def test_on_windows_the_lock_is_msvcrt_locking(monkeypatch: Any, tmp_path: Path) -> None:
    calls: list[int] = []
    held = threading.Lock()

    def locking(fd: int, mode: int, size: int) -> None:
        calls.append(mode)
        if mode == 1:
            held.acquire()
        else:
            held.release()

    fake = types.SimpleNamespace(LK_LOCK=1, LK_UNLCK=0, locking=locking)
    hide(monkeypatch, "fcntl")
    monkeypatch.setitem(sys.modules, "msvcrt", fake)
    assert_excludes(tmp_path / "data.lock")
    assert sorted(calls) == [0, 0, 0, 1, 1, 1]  # each thread locked and unlocked


def test_without_malloc_trim_freed_memory_is_only_collected(monkeypatch: Any) -> None:
    monkeypatch.setattr(system, "_libc", {})
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)  # no C library found (Windows)
    system.release_freed_memory()
    assert system._malloc_trim() is None
    monkeypatch.setattr(system, "_libc", {})
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: "libc-without-trim")

    class NoTrim:  # a C library without malloc_trim (macOS, musl)
        def __init__(self, name: str) -> None:
            pass

    monkeypatch.setattr(ctypes, "CDLL", NoTrim)
    system.release_freed_memory()
    assert system._malloc_trim() is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc")
def test_with_glibc_malloc_trim_is_called(monkeypatch: Any) -> None:
    monkeypatch.setattr(system, "_libc", {})
    assert system._malloc_trim() is not None
    calls: list[int] = []
    monkeypatch.setattr(system, "_libc", {"malloc_trim": calls.append})
    system.release_freed_memory()
    assert calls == [0]


def test_without_proc_cpuinfo_the_cpu_is_named_by_platform(monkeypatch: Any, tmp_path: Path) -> None:
    monkeypatch.setattr(system, "CPUINFO", tmp_path / "no-cpuinfo")
    features = system.cpu_features()
    import platform

    assert features == f"{platform.processor()} {platform.machine()}".strip() and features
    # and the kernels' build key is made from it
    monkeypatch.setattr(native, "cpu_features", system.cpu_features)
    source = tmp_path / "kernels.c"
    source.write_text("int x;\n")
    assert native.failure_marker(["cc"], source).name.startswith("kernels-")


def test_with_proc_cpuinfo_the_flags_line_is_read(monkeypatch: Any, tmp_path: Path) -> None:
    fake = tmp_path / "cpuinfo"
    fake.write_text("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu sse2 avx2\n")
    monkeypatch.setattr(system, "CPUINFO", fake)
    assert system.cpu_features() == "flags\t\t: fpu sse2 avx2\n"


FAULTS = """
import resource, sys
import torch
from seqtrans.runtime import system
if sys.argv[1] == "keep":
    assert system.keep_freed_memory()
for _ in range(10):  # 64 MiB each: over glibc's largest mapping threshold; the heap settles
    torch.relu(torch.ones(64 << 18))
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    torch.relu(torch.ones(64 << 18))
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(system._malloc_trim() is None, reason="needs glibc")
def test_kept_memory_is_reused_instead_of_faulted_in_again() -> None:
    """Each 64 MiB tensor is a mapping of its own under glibc's defaults, faulted in page by
    page every time (16,384 pages of 4 KiB each); kept, once the heap has grown to hold
    them, later ones reuse its pages. Run apart: the policy holds for the rest of a process."""
    faults = {policy: int(subprocess.run([sys.executable, "-c", FAULTS, policy], capture_output=True,
                                         text=True, check=True).stdout.split()[-1])
              for policy in ("system", "keep")}
    assert faults["system"] > 20 * 16384 * 0.9  # two tensors (input and output) per round, at least one new
    assert faults["keep"] < faults["system"] / 5, faults  # a round now and then still grows the heap


def test_the_command_keeps_freed_memory_unless_told_not_to(monkeypatch: Any) -> None:
    from seqtrans import cli

    calls: list[int] = []
    monkeypatch.setattr(cli, "keep_freed_memory", lambda: calls.append(1) or True)
    assert cli.main(["tasks"]) == 0 and calls == [1]
    monkeypatch.setenv("SEQTRANS_MALLOC", "system")
    assert cli.main(["tasks"]) == 0 and calls == [1]
    monkeypatch.setenv("SEQTRANS_MALLOC", "mmap")
    assert cli.main(["tasks"]) == 2 and calls == [1]


def test_without_mallopt_nothing_is_kept(monkeypatch: Any) -> None:
    monkeypatch.setattr(system, "_libc", {})
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    assert system.keep_freed_memory() is False


def _file_resident_kib() -> int:
    """This process's resident pages that map files (``RssFile`` of /proc/self/status)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1])
    raise AssertionError("no RssFile line")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise and /proc are Linux's")
def test_mapped_pages_are_given_back_and_read_again_unchanged(tmp_path: Path) -> None:
    import torch

    path = tmp_path / "t.pt"
    torch.save({"w": torch.arange(8 << 20, dtype=torch.float32)}, path)  # 32 MiB
    w = torch.load(path, mmap=True, weights_only=True)["w"]
    total = float(w.sum())  # every page read
    resident = _file_resident_kib()
    assert system.release_mapped(w)
    assert _file_resident_kib() < resident - 24 * 1024  # most of the 32 MiB given back
    assert float(w.sum()) == total  # read again from the file


def test_memory_not_mapped_from_a_file_or_written_is_left_alone(tmp_path: Path) -> None:
    import torch

    own = torch.ones(1 << 20)
    assert not system.release_mapped(own)
    assert float(own.sum()) == 1 << 20
    path = tmp_path / "t.pt"
    torch.save({"w": torch.zeros(1 << 20)}, path)
    w = torch.load(path, mmap=True, weights_only=True)["w"]
    w.add_(1.0)  # written: its pages are private copies now, not the file's
    assert not system.release_mapped(w)
    assert float(w.sum()) == 1 << 20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_the_file_of_a_mapped_tensor_reads_its_bytes_without_mapping_them(tmp_path: Path) -> None:
    import torch

    path = tmp_path / "t.pt"
    torch.save({"a": torch.arange(100.0), "w": torch.arange(1 << 20, dtype=torch.float32)}, path)
    w = torch.load(path, mmap=True, weights_only=True)["w"]
    source = system.mapped_file(w)
    assert source is not None
    got = torch.empty(1000)
    source.read_into(got.numpy().data.cast("B"), 5000 * 4)  # elements 5,000 to 5,999
    assert torch.equal(got, w[5000:6000])
    assert system.mapped_file(torch.ones(10)) is None  # memory of the process's own
    w[-1] = 0.0  # written: that page is a private copy now, and the file no longer its bytes
    assert system.mapped_file(w) is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_a_file_renamed_over_since_it_was_mapped_is_not_read(tmp_path: Path) -> None:
    import torch

    path, newer = tmp_path / "t.pt", tmp_path / "new.pt"
    torch.save({"w": torch.zeros(1 << 16)}, path)
    w = torch.load(path, mmap=True, weights_only=True)["w"]
    torch.save({"w": torch.ones(1 << 16)}, newer)
    newer.replace(path)  # as a checkpoint is replaced: the map still reads the old file
    assert system.mapped_file(w) is None
