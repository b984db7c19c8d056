"""Helpers shared by the benchmark scripts: the machine's matmul peak, timing, JSON.

Every script that writes results writes them through :func:`write_results` (or
:func:`write_json`), which adds a ``provenance`` record (:func:`provenance`): the
commit and whether the tree had changes, the CPU's model and flags, the torch
version, the threads and the load average, so that each published number can be
traced to the code and machine that made it.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from seqtrans.runtime import atomic
from seqtrans.runtime.system import release_freed_memory

RESULTS = Path(__file__).resolve().parent / "results"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {torch.get_num_threads()} threads"


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device, *, repeats: int = 3, warmup: int = 1) -> float:
    """Median wall-clock seconds of ``fn()`` over ``repeats`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def timed_in_turn(fns: Mapping[str, Callable[[], Any]], device: torch.device, *,
                  repeats: int = 3) -> dict[str, float]:
    """Median wall-clock seconds of each of ``fns`` over ``repeats`` rounds in which each
    runs once, in turn: where the machine's speed drifts (other processes' load, clock
    changes), every system meets the same drift, not one system a slow spell of its own."""
    times: dict[str, list[float]] = {key: [] for key in fns}
    for _ in range(repeats):
        for key, fn in fns.items():
            start = time.perf_counter()
            fn()
            synchronize(device)
            times[key].append(time.perf_counter() - start)
    return {key: statistics.median(values) for key, values in times.items()}


def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024  # kB
    return float("nan")


@contextlib.contextmanager
def peak_memory(device: torch.device) -> Iterator[dict[str, float]]:
    """The peak memory of the code in the ``with`` block, in MiB over the memory at its
    start: ``{"mib": ...}``, filled when the block ends, with ``"end_mib"``, the memory
    still held at its end (a model the block made and keeps; on a CPU after freed memory
    is given back). On CUDA, torch's peak of
    allocated device memory; on a CPU, the peak resident set (Linux), after giving freed
    memory back to the system and resetting the kernel's high-water mark, so that only
    this block's own peak counts (memory another library keeps for itself included)."""
    out: dict[str, float] = {}
    if device.type == "cuda":
        gc.collect()
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
        yield out
        torch.cuda.synchronize(device)
        out["mib"] = (torch.cuda.max_memory_allocated(device) - start) / 2**20
        out["end_mib"] = (torch.cuda.memory_allocated(device) - start) / 2**20
        return
    release_freed_memory()
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    except OSError:
        yield out  # no way to reset the peak here: nothing is reported
        return
    start = _status_mib("VmRSS")
    yield out
    out["mib"] = _status_mib("VmHWM") - start
    release_freed_memory()  # what is held, not what the allocator keeps for reuse
    out["end_mib"] = _status_mib("VmRSS") - start


def gemm_peak(device: torch.device, dtype: torch.dtype, *, size: int | None = None) -> float:
    """FLOP/s of a large square matrix multiply: the machine's practical peak.

    Without ``size``, the matrices are 8192 wide on CUDA, and on the CPU as large as fits in
    about a fifth of a second per product (at most 2048), so that a dtype the hardware lacks
    (bf16 on a CPU without AMX or AVX-512 BF16) is measured, slowly, rather than waited for.
    """
    if size is None and device.type == "cuda":
        # a GPU's small products are bound by their launch, so a probe's rate stops the
        # doubling early and the peak comes out far too low (docs/speed.md, the H100 run)
        size = 8192
    if size is None:
        limit = 2048
        probe = 256
        rate = _gemm_rate(device, dtype, probe, repeats=1)
        size = probe
        while size * 2 <= limit and 2 * (size * 2) ** 3 / rate < 0.2:
            size *= 2
    return _gemm_rate(device, dtype, size, repeats=3)


def _gemm_rate(device: torch.device, dtype: torch.dtype, size: int, *, repeats: int) -> float:
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    seconds = timed(lambda: a @ b, device, repeats=repeats, warmup=1)
    return 2 * size**3 / seconds


def memory_bandwidth(device: torch.device) -> float:
    """Bytes per second at which a matrix-vector product streams a large fp32 matrix
    (256 MiB; 1 GiB on CUDA): the bound on any step that must read every weight once,
    such as decoding one token for one sentence."""
    rows = 1 << 16 if device.type == "cuda" else 1 << 14
    w = torch.ones(rows, 4096, device=device)
    x = torch.ones(4096, device=device)
    seconds = timed(lambda: torch.mv(w, x), device, repeats=5, warmup=1)
    return w.numel() * w.element_size() / seconds


def last_level_cache_bytes() -> int | None:
    """The largest CPU cache's size in bytes (Linux sysfs), or None where unknown."""
    sizes = []
    for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = entry.read_text().strip().upper()
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        with contextlib.suppress(ValueError):
            sizes.append(int(text.rstrip("KMG")) * scale)
    return max(sizes) if sizes else None


def read_bandwidth(device: torch.device) -> float:
    """Bytes per second at which a sum streams a float32 buffer from memory: at least 256 MiB
    and 8 times the last-level cache (at most 4 GiB), so that the cache holds little of it."""
    if device.type == "cuda":
        return memory_bandwidth(device)
    size = min(max(256 * 2**20, 8 * (last_level_cache_bytes() or 0)), 4 * 2**30)
    buffer = torch.ones(size // 4)
    seconds = timed(lambda: buffer.sum(), device, repeats=5, warmup=1)
    return size / seconds


#: A CPU burner: a busy loop that ends when its parent does (checked every few milliseconds),
#: so that no burner outlives a benchmark killed without its clean-up.
BURNER = ("import os, sys\nparent = int(sys.argv[1])\nwhile os.getppid() == parent:\n"
          "    for _ in range(100000):\n        pass\n")


@contextlib.contextmanager
def background_load(processes: int) -> Iterator[list[int]]:
    """``processes`` CPU-burning processes (busy loops) running beside the ``with`` block,
    started before it and killed after it, however it ends; their process ids."""
    burners = [subprocess.Popen([sys.executable, "-c", BURNER, str(os.getpid())], stdin=subprocess.DEVNULL)
               for _ in range(processes)]
    try:
        if burners:
            time.sleep(0.5)  # running, and seen by the scheduler, before the block starts
            for burner in burners:
                if burner.poll() is not None:
                    raise RuntimeError(f"a background burner exited with status {burner.returncode}")
        yield [b.pid for b in burners]
    finally:
        for burner in burners:
            burner.kill()
        for burner in burners:
            burner.wait()


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=Path(__file__).resolve().parent, capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def cpu_info() -> dict[str, Any]:
    """The processor's model name and feature flags (from /proc/cpuinfo where there is
    one, else what :mod:`platform` knows, with no flags)."""
    model, flags = platform.processor() or platform.machine(), None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == (platform.processor() or platform.machine()):
                model = value.strip()
            elif key.strip() in ("flags", "Features") and flags is None:
                flags = value.split()
    except OSError:
        pass
    return {"model": model, "flags": flags, "machine": platform.machine(), "cores": os.cpu_count()}


#: What benchmarks write, which a run that writes more than once finds changed by its own
#: earlier writes: not a change of the code it ran.
OUTPUTS = ("benchmarks/results/", "docs/images/")


def provenance() -> dict[str, Any]:
    """Where a result comes from: the commit (``dirty``: tracked files other than
    :data:`OUTPUTS` differed from it), the CPU, the torch version and threads, the load
    average when it was written."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    # "XY PATH" lines (the first one's leading space stripped with the output's)
    changed = None if status is None else [path for line in status.splitlines()
                                           for path in line.split(maxsplit=1)[1:]
                                           if not path.startswith(OUTPUTS)]
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"commit": _git("rev-parse", "HEAD"), "dirty": None if changed is None else bool(changed),
            "cpu": cpu_info(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "load_average": None if load is None else [round(x, 2) for x in load],
            "python": platform.python_version(), "platform": platform.platform(),
            "time": time.strftime("%Y-%m-%d %H:%M:%S")}


def write_results(path: Path, data: dict[str, Any], **options: Any) -> Path:
    """Write a benchmark's results JSON to ``path`` (atomically), with its
    :func:`provenance` added; ``options`` go to :func:`seqtrans.runtime.atomic.write_json`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_json(path, {**data, "provenance": provenance()}, **options)
    return path


def write_json(name: str, data: dict[str, Any], device: torch.device) -> Path:
    """:func:`write_results` to ``benchmarks/results/NAME-DEVICE.json``, led by the device."""
    data = {"device": device_name(device), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "time": time.strftime("%Y-%m-%d %H:%M:%S"), **data}
    return write_results(RESULTS / f"{name}-{device.type}.json", data, sort_keys=False)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def arguments(doc: str | None) -> argparse.ArgumentParser:
    """A benchmark's argument parser, its module docstring as the description, as written."""
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
