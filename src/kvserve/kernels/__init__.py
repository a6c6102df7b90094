"""kvserve's C++ CPU kernels, built on first use into one extension module.

Sources (``csrc/``):
- ``paged_attention.cpp``: attention reading K/V in place from the paged cache
  (``kvserve.attention.cpu_paged``);
- ``elementwise.cpp``: RMSNorm (with the residual add), SiLU-and-multiply and the bfloat16 rotary
  embedding, one pass each (``kvserve.model.layers``);
- ``argmax.cpp``: row-wise argmax of float32/bfloat16 logits without an upcast copy
  (``kvserve.sample.greedy``);
- ``sample.cpp``: a token per row drawn from softmax(logits / T) by inverse transform, reading the
  logits in place (``kvserve.sample.sampler``);
- ``top_p.cpp``: top-p of wide-nucleus rows in place without sorting the vocabulary
  (``kvserve.sample.top_k_top_p``);
- ``linear.cpp``: the batch-invariant linear (GEMM) over prepacked float32/bfloat16 weights
  (``kvserve.model.invariant_linear``);
- ``amx_linear.cpp``: the same for bfloat16 on AMX tiles, where the CPU has them (and the gate-up
  projection with SiLU-and-multiply in its store);
- ``quant_linear.cpp`` (+ ``quant_linear_impl.h``): the same over weight-only int8/int4 weights
  (``kvserve.model.quant_linear``);
- ``amx_quant_linear.cpp``: the same on AMX tiles for bfloat16 activations (``amx_tiles.h``: what
  the two AMX kernels share);
- ``bitmask.cpp``: a structured-output token bitmask applied to float32 logits
  (``kvserve.structured_output.bitmask``);
- ``lora.cpp``: every token's LoRA adapter added to a projection, all adapters in one call
  (``kvserve.lora.layers``);
- ``decoder.cpp``: a Llama-family model's decoder layers in one call over the kernels above
  (``kvserve.model.fused_decoder``);
- ``thread_pool.cpp`` (+ ``thread_pool.h``): the worker threads every kernel's ``parallel_for``
  runs on where OpenMP's threads sleep at once (idle workers spin for a short window, then sleep);
- ``bindings.cpp``: the Python module.

The build uses ``torch.utils.cpp_extension.load`` (g++ with OpenMP, ``-O3 -march=native``; about a
minute) into a folder of this install's own, per CPU (:func:`build_directory`:
``~/.cache/kvserve/kernels/<hash of the package path>-<cpu_tag>``), so two installs on one machine
never rebuild each other's build (torch's default, ``~/.cache/torch_extensions``, is shared by
every install, and its ``build.ninja`` holds absolute source paths). ``scripts/install.sh`` builds
it at install; a build at run time (first start, sources changed, torch upgraded) prints one line
to stderr when it starts and one when it ends. Where no compiler or headers are available,
``cpu_kernels()`` returns None and every caller falls back to portable PyTorch code.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import platform
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from kvserve.cpu_threads import openmp_threads_sleep

logger = logging.getLogger(__name__)

_CSRC = Path(__file__).parent / "csrc"
SOURCES = ("paged_attention.cpp", "argmax.cpp", "sample.cpp", "top_p.cpp", "elementwise.cpp", "linear.cpp",
           "amx_linear.cpp", "quant_linear.cpp", "amx_quant_linear.cpp", "bitmask.cpp", "lora.cpp", "thread_pool.cpp", "decoder.cpp",
           "bindings.cpp")


def cpu_tag() -> str:
    """A short hash of this CPU's model name and instruction-set flags. The kernels are compiled
    with ``-march=native``, and torch caches a build by name, sources and flags only: the tag in
    the module name keeps a cache shared between machines (one home directory, a container image)
    from loading a build made for another CPU (which could die with an illegal instruction)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        model = next((line for line in lines if line.startswith("model name")), "")
        flags = next((line for line in lines if line.startswith(("flags", "Features"))), "")
    except OSError:
        model, flags = platform.processor(), platform.machine()
    return hashlib.sha256(f"{model}|{flags}".encode()).hexdigest()[:12]


def build_directory() -> Path:
    """Where this install builds its kernels: ``$XDG_CACHE_HOME/kvserve/kernels`` (default
    ``~/.cache``), in a folder named by a hash of this package's path and :func:`cpu_tag`."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    install = hashlib.sha256(str(Path(__file__).resolve().parent).encode()).hexdigest()[:12]
    return cache / "kvserve" / "kernels" / f"{install}-{cpu_tag()}"


def _stamp_file(directory: Path) -> Path:
    return directory / "kvserve_build_stamp"


def _build_stamp(directory: Path) -> str:
    """A digest of what the build depends on (sources, this file's flags, torch, Python, the
    folder): when the stamp of the last build differs, a build is coming and is announced."""
    import torch

    digest = hashlib.sha256(Path(__file__).read_bytes())
    for name in SOURCES:
        digest.update(name.encode() + (_CSRC / name).read_bytes())
    for path in sorted(_CSRC.glob("*.h")):
        digest.update(path.name.encode() + path.read_bytes())
    digest.update(f"{torch.__version__}|{sys.version}|{directory}".encode())
    return digest.hexdigest()


@contextlib.contextmanager
def _build_guard(directory: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the build folder while torch builds or loads there.

    torch marks a build in progress with a plain ``lock`` file and waits, without end, while it
    exists; a build killed midway (Ctrl-C during the first start) leaves it behind and every later
    start would hang. The kernel releases a ``flock`` when its holder dies, so while this process
    holds it no other kvserve build runs in the folder, and a ``lock`` file found then is stale.
    """
    with open(directory / "kvserve_build.flock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        try:
            stale = directory / "lock"
            if stale.exists():
                logger.warning("removing %s, left by a kernel build that did not finish", stale)
                stale.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(guard, fcntl.LOCK_UN)


@functools.cache
def cpu_kernels() -> ModuleType | None:
    """The compiled module (``paged_attention``, ``argmax_rows``, ``pack_linear_weight``,
    ``invariant_linear``), or None when it cannot be built here (the reason is logged once as a
    warning)."""
    directory = build_directory()
    try:
        from torch.utils.cpp_extension import load

        directory.mkdir(parents=True, exist_ok=True)
        stamp = _build_stamp(directory)
        announce = _stamp_file(directory).read_text() != stamp if _stamp_file(directory).is_file() else True
        if announce:
            print(f"kvserve: building the C++ CPU kernels in {directory} (once per install and CPU, about a "
                  "minute) ...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        with _build_guard(directory):
            module = load(
                name=f"kvserve_cpu_kernels_{cpu_tag()}",
                sources=[str(_CSRC / name) for name in SOURCES],
                extra_cflags=["-O3", "-march=native", "-fopenmp", "-ffast-math", "-fno-finite-math-only",
                              "-fno-strict-aliasing"],
                extra_ldflags=["-fopenmp"],
                build_directory=str(directory),
                verbose=False,
            )
        module.set_pool_enabled(openmp_threads_sleep())
        if announce:
            _stamp_file(directory).write_text(stamp)
            print(f"kvserve: CPU kernels built in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
        return module
    except Exception as error:  # noqa: BLE001 - any build failure means "use the fallback"
        logger.warning("CPU kernels unavailable (%s); using portable torch code", error)
        return None


def cpu_kernels_available() -> bool:
    """True when the C++ kernels build and load on this machine (first call compiles, ~1 min)."""
    return cpu_kernels() is not None
