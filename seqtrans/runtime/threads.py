"""How many threads a process computes with: the CPUs it may use, not the host's cores.

PyTorch's intra-op pool (OpenMP) starts one thread per core of the host. In a container
with a CPU quota, or a process pinned to some CPUs (``taskset``), those threads outnumber
the CPUs the process may run on, and threads that spin waiting for each other on a
core another thread holds make decoding many times slower. The default here is the CPUs
this process may use:

- its affinity mask (``os.sched_getaffinity``, where the platform has it; else
  ``os.cpu_count()``),
- capped by the cgroup CPU quota, rounded up: cgroup v2's ``cpu.max`` of the process's
  cgroup and its parents, or cgroup v1's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``.

What decides, first to last: ``seqtrans --threads N`` (or :func:`set_threads` from
Python), ``$SEQTRANS_THREADS``, ``$OMP_NUM_THREADS`` (left to PyTorch, as the user set
it), the CPUs available. A count above the CPUs available is honoured, with a warning
naming both numbers. An explicit count holds for the processes this one starts too (the
ranks of ``run --nproc``); the default leaves them to their launcher (one thread per
rank). Imports no torch until it sets a count on a PyTorch already loaded.

A server's decoding workers (``seqtrans serve --workers W``) each compute with
:func:`worker_threads`: the count given, else the process's count shared among them.

How OpenMP's threads wait between parallel regions is :func:`set_wait_policy`'s: PyTorch's
CPU wheels, oneDNN, MKL and the native kernels share one libgomp, whose idle threads spin
for a while (``GOMP_SPINCOUNT``) before they sleep. A spinning thread holds a core that a
busy machine's other processes want. libgomp reads ``OMP_WAIT_POLICY`` and
``GOMP_SPINCOUNT`` once, when it is loaded (with torch), so the policy must be set before
torch is imported: the command line does so first thing; from Python, call it first.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from pathlib import Path

from seqtrans.errors import UsageError
from seqtrans.runtime import environment

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")


def affinity_cpus() -> int:
    """The CPUs this process may run on (its affinity mask), or the machine's CPUs where the
    platform cannot say."""
    getaffinity = getattr(os, "sched_getaffinity", None)
    if getaffinity is not None:
        try:
            return max(1, len(getaffinity(0)))
        except OSError:
            pass
    return os.cpu_count() or 1


def _own_cgroup(proc: Path) -> str | None:
    """The cgroup v2 path of this process ("0::/path" in /proc/self/cgroup), or None."""
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            return line[3:] or "/"
    return None


def _v2_quota(root: Path, path: str) -> float | None:
    """The smallest quota / period of ``cpu.max`` from the cgroup up to the root."""
    quotas = []
    node = (root / path.lstrip("/")).resolve() if path != "/" else root
    while True:
        try:
            quota, _, period = (node / "cpu.max").read_text().strip().partition(" ")
            if quota != "max" and period:
                quotas.append(int(quota) / int(period))
        except (OSError, ValueError):
            pass
        if node == root or root not in node.parents:
            break
        node = node.parent
    return min(quotas) if quotas else None


def _v1_quota(root: Path) -> float | None:
    for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        try:
            quota = int((root / name / "cpu.cfs_quota_us").read_text())
            period = int((root / name / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        return quota / period if quota > 0 and period > 0 else None
    return None


def cgroup_cpus(*, root: Path = CGROUP_ROOT, proc: Path = Path("/proc")) -> float | None:
    """The CPUs the cgroup CPU quota allows this process (a fraction is possible), or None
    without a quota or where there are no cgroups."""
    if not sys.platform.startswith("linux"):
        return None
    path = _own_cgroup(proc)
    if path is not None and (root / "cgroup.controllers").exists():
        return _v2_quota(root, path)
    return _v1_quota(root)


def available_cpus(*, root: Path = CGROUP_ROOT, proc: Path = Path("/proc")) -> int:
    """The CPUs this process may use: its affinity, capped by the cgroup quota rounded up."""
    count = affinity_cpus()
    quota = cgroup_cpus(root=root, proc=proc)
    if quota is not None:
        count = min(count, max(1, math.ceil(quota)))
    return count


def parse_threads(text: str, *, name: str) -> int:
    """A thread count as given on the command line or in the environment: a whole number,
    1 or more, else a :class:`UsageError` naming ``name``."""
    try:
        value = int(text.strip())
    except ValueError:
        raise UsageError(f"{name} must be a whole number of threads, 1 or more, got {text!r}") from None
    if value < 1:
        raise UsageError(f"{name} must be 1 or more threads, got {value}")
    return value


def chosen_threads(threads: int | None = None) -> int | None:
    """The count the policy picks: ``threads``, else ``$SEQTRANS_THREADS``, else None when
    ``$OMP_NUM_THREADS`` is set (PyTorch reads it), else the CPUs available."""
    if threads is not None:
        return threads
    configured = environment.threads()
    if configured:
        return parse_threads(configured, name=environment.THREADS)
    if environment.omp_threads():
        return None
    return available_cpus()


def set_threads(threads: int | None = None) -> int | None:
    """Compute with ``threads`` threads, or as the policy picks (see the module docstring);
    the count set, or None when ``$OMP_NUM_THREADS`` decides. Before PyTorch is imported
    this sets ``OMP_NUM_THREADS`` for it (and for processes this one starts); after, it
    also sets PyTorch's intra-op pool."""
    if threads is not None and threads < 1:
        raise UsageError(f"threads must be 1 or more, got {threads}")
    explicit = threads is not None or bool(environment.threads())
    count = chosen_threads(threads)
    if count is None:
        return None
    available = available_cpus()
    if count > available:
        log.warning("computing with %d threads, more than the %d CPUs this process may use", count, available)
    if explicit:
        # the processes this one starts (the ranks of run --nproc) compute with it too
        environment.export(environment.THREADS, str(count))
    if explicit or count < affinity_cpus():
        # OpenMP already follows the affinity mask; a quota below it must be said. Left
        # unset otherwise, so that a launcher's own rule (one thread per rank) still holds.
        environment.export(environment.OMP_THREADS, str(count))
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(count)
    return count


def explicit_threads(threads: int | None = None) -> int | None:
    """The count asked for: ``threads``, else ``$SEQTRANS_THREADS``; None when neither
    says (the policy's default then decides)."""
    if threads is not None:
        return threads
    configured = environment.threads()
    return parse_threads(configured, name=environment.THREADS) if configured else None


def worker_threads(workers: int, *, threads: int | None = None, process: int) -> int | None:
    """The threads each of ``workers`` threads that compute side by side should use (a
    server's decoding workers): ``threads`` or ``$SEQTRANS_THREADS`` for each, else the
    ``process``'s count (what :func:`set_threads` left PyTorch) shared among them, one at
    least; None for a single worker without a count (it keeps the process's). A total above
    the CPUs available is honoured, with a warning naming both numbers."""
    if workers < 1:
        raise UsageError(f"workers must be 1 or more, got {workers}")
    count = explicit_threads(threads)
    if count is None:
        if workers == 1:
            return None
        count = max(1, process // workers)
    available = available_cpus()
    if workers * count > available:
        log.warning("%d workers of %d threads each compute with %d threads, more than the %d CPUs this "
                    "process may use", workers, count, workers * count, available)
    return count


#: OpenMP wait policies by name; a whole number is a spin count (``GOMP_SPINCOUNT``).
WAIT_POLICIES = ("default", "active", "passive")


def parse_wait_policy(text: str, *, name: str) -> str:
    """A wait policy as given on the command line or in the environment: ``default``,
    ``active``, ``passive`` or a spin count (a whole number, 0 or more), else a
    :class:`UsageError` naming ``name``."""
    value = text.strip().lower()
    if value in WAIT_POLICIES or (value.isdigit() and value.isascii()):
        return value
    raise UsageError(f"{name} must be one of {', '.join(WAIT_POLICIES)} or a spin count (a whole number, "
                     f"0 or more), got {text!r}")


def wait_policy_environment(policy: str) -> dict[str, str | None]:
    """The OpenMP variables that say ``policy`` (None: unset, since libgomp lets
    ``GOMP_SPINCOUNT`` win over ``OMP_WAIT_POLICY``): ``active`` and ``passive`` as
    ``OMP_WAIT_POLICY`` (spin until work comes; sleep at once), a spin count N as
    ``GOMP_SPINCOUNT`` (spin about N times, then sleep), ``default`` none (libgomp's own,
    a few milliseconds of spinning, or what the user set)."""
    if policy in ("active", "passive"):
        return {environment.OMP_WAIT_POLICY: policy.upper(), environment.GOMP_SPINCOUNT: None}
    if policy.isdigit():
        return {environment.OMP_WAIT_POLICY: None, environment.GOMP_SPINCOUNT: str(int(policy))}
    return {}


def set_wait_policy(policy: str | None = None) -> str | None:
    """Have OpenMP's idle threads wait as ``policy`` says (see
    :func:`wait_policy_environment`), else as ``$SEQTRANS_WAIT_POLICY`` says; the policy
    set. Where neither says, ``passive``, unless ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``
    is set (then they decide, and None is returned): idle threads that spin hold cores
    that other busy processes need, which slowed decoding beside two CPU-burning
    processes ninefold, while sleeping at once cost nothing measurable on a quiet machine
    (docs/speed.md). It holds for this process only when PyTorch has not been imported
    yet (a warning says so otherwise), and for the processes it starts."""
    if policy is not None:
        policy = parse_wait_policy(policy, name="wait policy")
    elif environment.wait_policy():
        policy = parse_wait_policy(environment.wait_policy(), name=environment.WAIT_POLICY)
    elif os.environ.get(environment.OMP_WAIT_POLICY) or os.environ.get(environment.GOMP_SPINCOUNT):
        return None
    else:
        return _default_wait_policy()
    settings = wait_policy_environment(policy)
    for name, value in settings.items():
        if value is None:
            environment.remove(name)
        else:
            environment.export(name, value)
    environment.export(environment.WAIT_POLICY, policy)
    if settings and "torch" in sys.modules:
        log.warning("the OpenMP wait policy %s holds for the processes this one starts, not for this one: "
                    "PyTorch (and its OpenMP) is loaded already", policy)
    return policy


def _default_wait_policy() -> str:
    """``passive`` said to OpenMP where nobody chose: for this process if PyTorch is not
    loaded yet (quietly, since nobody asked), and for the processes it starts."""
    environment.export(environment.OMP_WAIT_POLICY, "PASSIVE")
    return "passive"
