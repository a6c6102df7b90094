"""Whether Triton is installed, asked once per process: the GPU path's kernels
(``triton_paged``, ``triton_elementwise``, ``triton_quant_linear``, ``triton_moe``,
``triton_sample``) are offered on CUDA only where it is, and import it at first use."""

from __future__ import annotations

import functools
import importlib.util


@functools.cache
def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None
