"""kvserve's C++ CPU kernels, one shared library per instruction-set variant, called through ctypes.

Sources (``csrc/``), plain C++ on raw pointers (no PyTorch header; ``abi.h``: the types, the
errors and the shape of an entry point):
- ``paged_attention.cpp`` (+ ``paged_attention.h``): attention reading K/V in place from the paged
  cache (``kvserve.attention.cpu_paged``): tiles, tasks and the entry points; the online-softmax walk
  the kernels share (``paged_attention_walk.h``) and its three kernels, ``paged_attention_portable.cpp``
  (any dtype, int8/fp8 caches: ``kv_one_byte.h``), ``paged_attention_bf16.cpp`` (AVX512-BF16) and
  ``paged_attention_amx.cpp`` (AMX tiles);
- ``latent_attention.cpp``: the same for a latent (MLA) cache;
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
  projection with SiLU-and-multiply in its store; ``amx_tiles.h``: what the AMX kernels share,
  and the AMX rule);
- ``quant_linear.cpp``: the same over weight-only int8/int4 weights (``kvserve.model.quant_linear``;
  ``quant_vector.h``: the library's instruction set and vectors, ``quant_fma.h``: the float32 FMA
  kernels, ``quant_pairs.h``: the AVX512-BF16 pair kernels);
- ``amx_quant_linear.cpp``: the same on AMX tiles for bfloat16 activations (``amx_quant.h``: what its
  files share, ``amx_quant_tiles.cpp``: the tile kernel, ``amx_quant_widen.h``: weights widened to
  tiles, ``amx_quant_row.cpp``: a lone row on vector FMAs with the tiles' arithmetic);
- ``bitmask.cpp``: a structured-output token bitmask applied to float32 logits
  (``kvserve.structured_output.bitmask``);
- ``lora.cpp``: every token's LoRA adapter added to a projection, all adapters in one call
  (``kvserve.lora.layers``);
- ``projection.cpp`` (+ ``projection.h``): a model's linear layers as the C++ loops run them;
- ``moe.cpp`` (+ ``moe.h``): a mixture-of-experts layer's experts in one call (``moe_route.cpp``:
  the router's top k, ``moe_abi.cpp``: its handle and entry points; ``kvserve.model.moe``);
- ``decoder.cpp``: a Llama-family model's decoder layers in one call over the kernels above
  (``kvserve.model.fused_decoder``);
- ``thread_pool.cpp`` (+ ``thread_pool.h``): the worker threads every kernel's ``parallel_for``
  runs on where OpenMP's threads sleep at once (idle workers spin for a short window, then sleep);
- ``abi.cpp``: the library's own entry points (errors, thread count, pool settings, the AMX
  switch).

Python side: :mod:`kvserve.kernels.build` compiles them (one library per instruction-set
variant, units in parallel, a line per unit; its docstring has the instruction-set rule),
:mod:`kvserve.kernels.library` finds a wheel's prebuilt library or builds this install's on first
use and declares every entry point, and the ``ops_*`` modules wrap the entry points with the checks
of their arguments. :func:`cpu_kernels` returns them as one object, the library of the best variant
this CPU runs; where no library can be had (no compiler, no prebuilt one), it returns None.
:func:`kernels_for` is the one rule for "C++ kernel or torch code", applied where a model, a
sampler or a backend is built (``kvserve.model.kernel_layer``), never per call.
:func:`kernels_for_variant` opens another variant this CPU runs, beside it (the tests of every
instruction set).
"""

from __future__ import annotations

import functools
import logging

import torch

from kvserve.cpu_threads import openmp_threads_sleep
from kvserve.kernels.ops_attention import AttentionOps
from kvserve.kernels.ops_decoder import DecoderStack, LinearPart
from kvserve.kernels.ops_elementwise import ElementwiseOps
from kvserve.kernels.ops_linear import LinearOps
from kvserve.kernels.ops_moe import MoeOps
from kvserve.kernels.ops_sample import SampleOps

logger = logging.getLogger(__name__)


class CpuKernels(AttentionOps, ElementwiseOps, LinearOps, MoeOps, SampleOps):
    """Every kernel of the opened library (:class:`kvserve.kernels.library.Library`), with torch
    tensors in and out; ``DecoderStack`` and ``LinearPart`` build the fused decoder."""

    LinearPart = LinearPart

    def __init__(self, lib):
        self._lib = lib
        self.variant = lib.variant
        self.path = lib.path

    def __copy__(self) -> CpuKernels:  # one library per process: a copied model shares it
        return self

    def __deepcopy__(self, memo) -> CpuKernels:
        return self

    def DecoderStack(self, **kwargs) -> DecoderStack:  # noqa: N802 - named as the class it builds
        return DecoderStack(self._lib, **kwargs)

    def set_pool_enabled(self, enabled: bool) -> None:
        """Run the parallel regions on kvserve's worker pool (True) or OpenMP's threads (False)."""
        self._lib.set_pool_enabled(int(enabled))

    def pool_enabled(self) -> bool:
        return bool(self._lib.pool_enabled())

    def set_pool_spin_us(self, microseconds: int) -> None:
        """How long (us) idle kernel worker threads wait for the next region before sleeping."""
        self._lib.set_pool_spin_us(microseconds)

    def pool_spin_us(self) -> int:
        return self._lib.pool_spin_us()

    def pool_self_check(self, regions: int, seed: int, max_threads: int, throw_every: int) -> list[int]:
        """The worker pool's self-check (``thread_pool.h``), run without the GIL: faults by kind."""
        import ctypes

        faults = (ctypes.c_int64 * 4)()
        self._lib.call("kvserve_pool_self_check", regions, seed, max_threads, throw_every, ctypes.addressof(faults))
        return list(faults)


def _open(variant=None) -> CpuKernels:
    """The kernels of ``variant`` (a :class:`kvserve.kernels.build.Variant`; default this CPU's),
    their parallel regions on kvserve's pool where OpenMP's threads sleep at once."""
    from kvserve.kernels.library import open_library

    kernels = CpuKernels(open_library(variant))
    kernels.set_pool_enabled(openmp_threads_sleep())
    return kernels


@functools.cache
def cpu_kernels() -> CpuKernels | None:
    """The kernels (a wheel's prebuilt library, or this install's build, made on first use), or
    None when there is none here (the reason is logged once as a warning)."""
    try:
        kernels = _open()
    except Exception as error:  # noqa: BLE001 - any build or load failure means "use the fallback"
        logger.warning("CPU kernels unavailable (%s); using portable torch code", error)
        return None
    logger.info("CPU kernels: %s (%s)", kernels.variant, kernels.path)
    return kernels


def kernels_for_variant(name: str) -> CpuKernels:
    """The kernels of variant ``name`` (``kvserve.kernels.build.VARIANTS``; one this CPU runs,
    ``build.host_variants()``): a wheel's prebuilt library or this install's cached build of it,
    built on first use; one object per name and process, :func:`cpu_kernels`'s own for the variant
    it opened. For the tests of every instruction set this CPU runs: each variant's library computes
    with its own instruction set, and a layer packed by one (``QuantizedLinear``) runs on it.

    Raises:
        RuntimeError: this CPU does not run ``name``; no compiler; a unit that does not compile.
    """
    from kvserve.kernels import build

    runnable = {variant.name: variant for variant in build.host_variants()}
    if name not in runnable:
        raise RuntimeError(f"variant {name}: this CPU runs {', '.join(runnable)}")
    return _variant_kernels(runnable[name])


@functools.cache
def _variant_kernels(variant) -> CpuKernels:
    own = cpu_kernels()
    if own is not None and own.variant == variant.name:
        return own
    return _open(variant)


def cpu_kernels_available() -> bool:
    """True when the C++ kernels load on this machine (a source install's first call builds them)."""
    return cpu_kernels() is not None


def kernels_for(device: torch.device | str | None) -> CpuKernels | None:
    """The kernels for tensors on ``device``: kvserve's library on the CPU where it loads, else None
    (CUDA, ``meta``, or no library here), and the caller runs its torch code. Asked once, where a
    layer, model, sampler or backend is built; a call then checks only what its kernel accepts
    (dtype, shape), never the machine."""
    if device is None or torch.device(device).type != "cpu":
        return None
    return cpu_kernels()
