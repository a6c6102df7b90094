"""How many threads the CPU kernels use, and how they wait: ``--cpu-threads N|auto``.

``auto`` (the default) counts the CPUs this process may actually run on: its affinity mask
(``taskset``, ``docker --cpuset-cpus``) bounded by the cgroup CPU quota (``docker --cpus``,
Kubernetes CPU limits; cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us``),
rounded up. ``os.cpu_count()`` counts the host's CPUs, which over-subscribes a limited container.
vLLM's CPU backend does the same job with ``VLLM_CPU_OMP_THREADS_BIND`` (a core list, ``auto`` by
default); kvserve takes a count and leaves placement to the OS.

Waiting: kvserve's C++ kernels run on a worker pool of their own (``kernels/csrc/thread_pool.h``)
whose idle workers spin for 200 us after each parallel region, so the ~200 regions of a decode
step find them awake, and then sleep, so nothing spins between steps. PyTorch's own operators run
on GNU OpenMP (libgomp), whose threads spin at the end of every parallel region before they sleep
(``GOMP_SPINCOUNT``, 300,000 spins by default): when another process takes one of the cores, a
thread spins on a peer that is not running, through its time slice (decode got 14-30x slower),
and spinning OpenMP threads take the cores from the kernels' pool (a decode step 1.7x slower).
``kvserve`` (the command) therefore sets ``OMP_WAIT_POLICY=PASSIVE`` (waiting threads sleep at
once) unless the environment sets ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` itself, and the kernels
use their pool only where OpenMP's threads sleep at once (:func:`openmp_threads_sleep`); elsewhere
(an ``LLM`` in a script that imported torch with libgomp's default) they run on OpenMP's threads.
These variables are read once, when libgomp loads, so :func:`apply_cpu_threads` must run before
``import torch`` to set them; the thread count itself can be set at any time
(``torch.set_num_threads``). Figures: docs/benchmarks.md section 3.8.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

_CGROUP = Path("/sys/fs/cgroup")
_OPENMP_DEFAULTS: dict[str, str] = {"OMP_WAIT_POLICY": "PASSIVE"}
_WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def process_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The OpenMP wait settings ``kvserve`` gives its process: :data:`_OPENMP_DEFAULTS`, or nothing
    when ``environ`` (default ``os.environ``) already sets ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``."""
    environ = os.environ if environ is None else environ
    if any(name in environ for name in _WAIT_VARIABLES):
        return {}
    return dict(_OPENMP_DEFAULTS)


def openmp_threads_sleep(environ: dict[str, str] | None = None) -> bool:
    """True when libgomp's idle threads sleep at once in this process: ``OMP_WAIT_POLICY=PASSIVE``
    (any case) or ``GOMP_SPINCOUNT=0`` in ``environ`` (default ``os.environ``, as libgomp read it
    when it loaded)."""
    environ = os.environ if environ is None else environ
    return environ.get("OMP_WAIT_POLICY", "").strip().upper() == "PASSIVE" or environ.get("GOMP_SPINCOUNT", "").strip() == "0"


def cpu_threads_arg(text: str) -> str | int:
    """argparse type for ``--cpu-threads``: ``auto`` or an integer >= 1."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 'auto' or an integer >= 1, got {text!r}")
    return value


def cgroup_cpu_limit(root: Path = _CGROUP, self_cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """The CPU quota of this process's cgroup in CPUs (``2.5`` = 250 ms per 100 ms), or None
    when there is none or it cannot be read."""
    for directory in _cgroup_dirs(root, self_cgroup):
        v2 = directory / "cpu.max"
        if v2.is_file():
            quota, _, period = v2.read_text().strip().partition(" ")
            if quota != "max" and period:
                return int(quota) / int(period)
        quota_file, period_file = directory / "cpu.cfs_quota_us", directory / "cpu.cfs_period_us"
        if quota_file.is_file() and period_file.is_file():
            quota = int(quota_file.read_text())
            if quota > 0:
                return quota / int(period_file.read_text())
    return None


def _cgroup_dirs(root: Path, self_cgroup: Path) -> list[Path]:
    """This process's cgroup folder(s) (v2 ``0::/path``, v1 ``N:cpu,cpuacct:/path``), then the root."""
    dirs = []
    try:
        for line in self_cgroup.read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controllers == "" or "cpu" in controllers.split(","):
                for base in (root, root / "cpu", root / "cpu,cpuacct"):
                    dirs.append(base / path.lstrip("/"))
    except (OSError, ValueError):
        pass
    return [*dirs, root, root / "cpu", root / "cpu,cpuacct"]


def available_cpus() -> int:
    """CPUs this process may use: affinity mask, bounded by the cgroup quota (rounded up), >= 1."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        count = os.cpu_count() or 1
    try:
        limit = cgroup_cpu_limit()
    except (OSError, ValueError):
        limit = None
    if limit is not None:
        count = min(count, max(1, math.ceil(limit)))
    return max(1, count)


def resolve_cpu_threads(value: str | int | None) -> int:
    """``auto``/None -> :func:`available_cpus`; an integer is taken as given.

    Raises:
        ValueError: not ``auto`` and not an integer >= 1.
    """
    if value in (None, "auto"):
        return available_cpus()
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"cpu_threads must be 'auto' or an integer >= 1, got {value!r}")
    return value


def apply_cpu_threads(value: str | int | None = "auto") -> int:
    """Use ``value`` threads for this process's CPU kernels; returns the count.

    Before torch is imported this sets ``OMP_NUM_THREADS`` and the wait policy of
    :func:`process_environment` (read once by libgomp when it loads); afterwards it calls
    ``torch.set_num_threads`` (the wait policy then stays what libgomp read). An explicit
    ``OMP_NUM_THREADS`` in the environment wins over ``auto``.
    """
    import sys

    if value in (None, "auto") and os.environ.get("OMP_NUM_THREADS", "").isdigit():
        threads = int(os.environ["OMP_NUM_THREADS"])
    else:
        threads = resolve_cpu_threads(value)
    if "torch" not in sys.modules:
        os.environ.update(process_environment())
        os.environ["OMP_NUM_THREADS"] = str(threads)
    else:
        import torch

        torch.set_num_threads(threads)
    return threads
