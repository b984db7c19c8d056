"""What every benchmark shares: timing, memory, budgets, arguments and results with provenance.

Timing, peak memory, the machine's peaks, a training budget, the argument parser, and
writing results with where they come from.

Every benchmark writes its results through :func:`write_results` (or :func:`write_json`),
which adds a ``provenance`` record (:func:`provenance`): the command that ran it (as the
runner, ``python -m benchmarks NAME ...``, received it) and its parsed arguments, the
commit and whether the tree had changes, the CPU's model and flags, the torch version,
the threads, the load average, and whether the machine was quiet: how many cores, on
average, work outside the benchmark's own processes kept busy while it ran.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch

from seqtrans.runtime import atomic
from seqtrans.runtime.system import release_freed_memory
from seqtrans.runtime.threads import wait_policy_environment

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
T = TypeVar("T")

# ------------------------------------------------------------------------- device and timing


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{cpu_info()['model']}, {torch.get_num_threads()} threads"


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


def timed_once(fn: Callable[[], T]) -> tuple[float, T]:
    """Wall-clock seconds of one call of ``fn()`` (on a CPU), and what it returned."""
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def timed_in_turn(fns: Mapping[str, Callable[[], Any]], device: torch.device, *,
                  repeats: int = 3) -> dict[str, float]:
    """Median wall-clock seconds of each of ``fns`` over ``repeats`` rounds in which each
    runs once, in turn: where the machine's speed drifts (other processes' load, clock
    changes), every system meets the same drift, not one system a slow spell of its own.
    A function that returns a float has timed itself (a child process that decodes, whose
    start and loading are not the decoding): its seconds count instead."""
    times: dict[str, list[float]] = {key: [] for key in fns}
    for _ in range(repeats):
        for key, fn in fns.items():
            start = time.perf_counter()
            took = fn()
            synchronize(device)
            times[key].append(took if isinstance(took, float) else time.perf_counter() - start)
    return {key: statistics.median(values) for key, values in times.items()}


class CrossAttentionClock:
    """Wall-clock seconds spent in every decoder layer's encoder-decoder attention of
    ``model`` (its ``prepare``, once per source, and its steps) while the clock is open;
    :meth:`close` gives the modules back their own methods."""

    def __init__(self, model: Any) -> None:
        self.seconds = 0.0
        self._wrapped: list[tuple[Any, str]] = []
        for layer in model.decoder_layers:
            for method in ("prepare", "forward"):
                attn = layer.cross_attn
                setattr(attn, method, self._timed(getattr(attn, method)))
                self._wrapped.append((attn, method))

    def _timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started
        return run

    def close(self) -> None:
        for attn, method in self._wrapped:
            delattr(attn, method)  # the class's method again
        self._wrapped = []


# ------------------------------------------------------------------------------------- memory


def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024  # kB
    return float("nan")


def resident_mib() -> float:
    """This process's resident memory now, in MiB (Linux; NaN elsewhere)."""
    try:
        return _status_mib("VmRSS")
    except OSError:
        return float("nan")


def process_peak_mib() -> float:
    """The most resident memory this process has held since it started, in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


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


# -------------------------------------------------------------------- the machine's peaks


def gemm_peak(device: torch.device, dtype: torch.dtype, *, size: int | None = None) -> float:
    """FLOP/s of a large square matrix multiply: the machine's practical peak.

    Without ``size``, the matrices are 8192 wide on CUDA, and on the CPU as large as fits in
    about a fifth of a second per product (at most 2048), so that a dtype the hardware lacks
    (bf16 on a CPU without AMX or AVX-512 BF16) is measured, slowly, rather than waited for.
    """
    if size is None and device.type == "cuda":
        # a GPU's small products are bound by their launch, so a probe's rate stops the
        # doubling early and the peak comes out far too low (benchmarks/README.md, the H100 run)
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


#: What a child process's environment loses before its own wait policy and threads go in.
POLICY_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "SEQTRANS_WAIT_POLICY", "OMP_NUM_THREADS",
                    "SEQTRANS_THREADS")


def policy_environment(policy: str, threads: str = "default") -> dict[str, str]:
    """This process's environment for a child that runs under an OpenMP wait ``policy``
    (``default``, ``active``, ``passive`` or a spin count) and with ``threads`` threads
    (``default``: the child's own choice)."""
    env = {k: v for k, v in os.environ.items() if k not in POLICY_VARIABLES}
    env.update({k: v for k, v in wait_policy_environment(policy).items() if v is not None})
    env["SEQTRANS_WAIT_POLICY"] = policy  # so that 'default' is libgomp's own, not seqtrans's passive
    if threads != "default":
        env["SEQTRANS_THREADS"] = env["OMP_NUM_THREADS"] = threads
    return env


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


# ------------------------------------------------------------------------ a training budget


def budget(steps: int, *, checkpoints: int = 10, warmup: int | None = None,
           average_last: int | None = 5) -> list[str]:
    """Settings that stop training after ``steps`` updates rather than after some minutes,
    so that the budget does not depend on what else the machine is doing: the warm-up
    (by default 2/5 of the updates, at most the presets' 400), ``checkpoints`` checkpoints
    over the run, and the last ``average_last`` of them averaged (None: the preset's own
    averaging and keeping)."""
    every = max(1, steps // checkpoints)
    if warmup is None:
        warmup = max(1, min(400, 2 * steps // 5))
    out = [f"train.max_steps={steps}", "train.max_minutes=0", f"train.warmup={warmup}",
           f"train.checkpoint_every={every}"]
    if average_last is not None:
        out += [f"train.average_last={average_last}", f"train.keep_checkpoints={average_last}"]
    return out


# ------------------------------------------------------- the arguments and the run in hand


@dataclasses.dataclass(frozen=True)
class CpuClock:
    """CPU seconds at one moment: every process's on the machine (``machine``, from
    ``/proc/stat``; None where there is none) and this process's with its descendants'."""

    wall: float
    machine: float | None
    own: float


def _descendants_cpu(ticks: float) -> float:
    """CPU seconds of this process's live (or not yet reaped) descendants, their own
    reaped children included; reaped ones are in ``RUSAGE_CHILDREN``."""
    parents: dict[int, int] = {}
    seconds: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        # after the name: state, ppid, ..., utime, stime, cutime, cstime (fields 4 and 14-17)
        parents[int(entry.name)] = int(fields[1])
        seconds[int(entry.name)] = sum(int(x) for x in fields[11:15]) / ticks
    ours, total = {os.getpid()}, 0.0
    grew = True
    while grew:
        found = {pid for pid, parent in parents.items() if parent in ours and pid not in ours}
        total += sum(seconds[pid] for pid in found)
        ours |= found
        grew = bool(found)
    return total


def cpu_clock() -> CpuClock:
    own = sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
              for f in ("ru_utime", "ru_stime"))
    try:
        ticks = float(os.sysconf("SC_CLK_TCK"))
        # cpu  user nice system idle iowait irq softirq steal ... (guest time is in user)
        values = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
        machine: float | None = (sum(values) - values[3] - values[4]) / ticks
        own += _descendants_cpu(ticks)
    except (OSError, ValueError, IndexError):
        machine = None
    return CpuClock(wall=time.monotonic(), machine=machine, own=own)


#: Cores kept busy on average by other work under which a machine still counts as quiet.
QUIET_CORES = 0.2


def other_cores(start: CpuClock, end: CpuClock) -> float | None:
    """How many cores, on average between ``start`` and ``end``, work outside this process
    and its descendants kept busy (a benchmark's own burners are its descendants)."""
    if start.machine is None or end.machine is None or end.wall <= start.wall:
        return None
    other = (end.machine - start.machine) - (end.own - start.own)
    return max(0.0, other) / (end.wall - start.wall)


@dataclasses.dataclass
class Run:
    """The benchmark the runner runs: its command, the arguments its parser read (filled
    in by the parser of :func:`arguments`) and the CPU time when it started."""

    command: list[str]
    arguments: dict[str, Any] | None = None
    started: CpuClock = dataclasses.field(default_factory=cpu_clock)


#: The run in hand, set by :func:`running` (the runner) and read by :func:`provenance`.
_run: Run | None = None


@contextlib.contextmanager
def running(command: Sequence[str]) -> Iterator[Run]:
    """Record ``command`` as the one that runs the benchmark called in the ``with`` block:
    what it writes through :func:`write_results` says so, with its settings and whether
    the machine was quiet meanwhile."""
    global _run
    before, _run = _run, Run([_portable(arg) for arg in command])
    try:
        yield _run
    finally:
        _run = before


def _portable(arg: str) -> str:
    """A command's argument as the repository sees it: an absolute path beside or inside the
    repository relative to it (commands run from the repository's root), not this machine's."""
    key, eq, value = arg.rpartition("=") if "=" in arg and not arg.startswith("/") else ("", "", arg)
    path = Path(value)
    if path.is_absolute() and path.is_relative_to(ROOT.parent):
        value = os.path.relpath(path, ROOT)
    return f"{key}{eq}{value}"


def _settings(namespace: argparse.Namespace) -> dict[str, Any]:
    """Parsed arguments as JSON holds them (paths as the repository sees them)."""
    def plain(value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, (Path, str)):
            return _portable(str(value))
        return value if value is None or isinstance(value, (bool, int, float)) else str(value)
    return {key: plain(value) for key, value in vars(namespace).items()}


class Arguments(argparse.ArgumentParser):
    """A benchmark's argument parser: what it parses is recorded as the run's settings."""

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        parsed, rest = super().parse_known_args(args, namespace)
        if _run is not None:
            _run.arguments = _settings(parsed)
        return parsed, rest


def arguments(doc: str | None) -> Arguments:
    """A benchmark's argument parser, its module docstring as the description, as written;
    its usage line names the command that runs it."""
    prog = None if _run is None else " ".join(_run.command[:4])  # python -m benchmarks NAME
    return Arguments(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


# ------------------------------------------------------------------- results and provenance


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
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
#: Environment variables that change how the code runs (threads, wait policies, allocators);
#: those naming paths are left out, as results name no machine's paths.
ENVIRONMENT = ("OMP_", "GOMP_", "KMP_", "MKL_", "SEQTRANS_")


def provenance() -> dict[str, Any]:
    """Where a result comes from: the command and its settings (None when the benchmark
    was not run through the runner), the commit (``dirty``: tracked files other than
    :data:`OUTPUTS` differed from it), the CPU, the torch version and threads, the load
    average when it was written, the environment's settings of :data:`ENVIRONMENT`, and
    ``other_cores`` since the run started, ``quiet`` when below :data:`QUIET_CORES`."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    # "XY PATH" lines (the first one's leading space stripped with the output's)
    changed = None if status is None else [path for line in status.splitlines()
                                           for path in line.split(maxsplit=1)[1:]
                                           if not path.startswith(OUTPUTS)]
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    other = None if _run is None else other_cores(_run.started, cpu_clock())
    return {"command": None if _run is None else shlex.join(_run.command),
            "arguments": None if _run is None else _run.arguments,
            "commit": _git("rev-parse", "HEAD"), "dirty": None if changed is None else bool(changed),
            "cpu": cpu_info(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "load_average": None if load is None else [round(x, 2) for x in load],
            "other_cores": None if other is None else round(other, 3),
            "quiet": None if other is None else other < QUIET_CORES,
            "environment": {k: v for k, v in sorted(os.environ.items())
                            if k.startswith(ENVIRONMENT) and os.sep not in v},
            "python": platform.python_version(), "platform": platform.platform(),
            "time": time.strftime("%Y-%m-%d %H:%M:%S")}


def seqtrans_command(*args: str) -> str:
    """Run one ``seqtrans`` command as a user would; its standard output (its log goes to ours)."""
    print("$ seqtrans", " ".join(args), flush=True)
    done = subprocess.run([sys.executable, "-m", "seqtrans", *args], check=True, stdout=subprocess.PIPE,
                          text=True)
    return done.stdout


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
