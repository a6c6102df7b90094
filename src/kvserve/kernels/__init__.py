"""kvserve's C++ CPU kernels, built on first use into one extension module.

Sources (``csrc/``):
- ``paged_attention.cpp``: attention reading K/V in place from the paged cache
  (``kvserve.attention.cpu_paged``);
- ``argmax.cpp``: row-wise argmax of float32/bfloat16 logits without an upcast copy
  (``kvserve.sample.greedy``);
- ``bindings.cpp``: the Python module.

The build uses ``torch.utils.cpp_extension.load`` (g++ with OpenMP, ``-O3 -march=native``; about a
minute, cached under ``~/.cache/torch_extensions`` per CPU model and flags (``cpu_tag``);
``scripts/install.sh`` warms it). Where no
compiler or headers are available, ``cpu_kernels()`` returns None and every caller falls back to
portable PyTorch code.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import platform
from pathlib import Path
from types import ModuleType

logger = logging.getLogger(__name__)

_CSRC = Path(__file__).parent / "csrc"
SOURCES = ("paged_attention.cpp", "argmax.cpp", "bindings.cpp")


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


@functools.cache
def cpu_kernels() -> ModuleType | None:
    """The compiled module (``paged_attention``, ``argmax_rows``), or None when it cannot be
    built here (the reason is logged once as a warning)."""
    try:
        from torch.utils.cpp_extension import load

        return load(
            name=f"kvserve_cpu_kernels_{cpu_tag()}",
            sources=[str(_CSRC / name) for name in SOURCES],
            extra_cflags=["-O3", "-march=native", "-fopenmp", "-ffast-math", "-fno-finite-math-only",
                          "-fno-strict-aliasing"],
            extra_ldflags=["-fopenmp"],
            verbose=False,
        )
    except Exception as error:  # noqa: BLE001 - any build failure means "use the fallback"
        logger.warning("CPU kernels unavailable (%s); using portable torch code", error)
        return None


def cpu_kernels_available() -> bool:
    """True when the C++ kernels build and load on this machine (first call compiles, ~1 min)."""
    return cpu_kernels() is not None
