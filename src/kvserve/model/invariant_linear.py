"""Batch-invariant CPU linears: every output element is computed by one fixed sequence of
floating-point operations, whatever the number of rows, the row's place in the batch and the
thread count, in float32 and bfloat16.

``F.linear`` gives no such promise on the CPU: MKL's float32 sgemm and oneDNN's bfloat16 kernels
pick kernels (and summation orders) by the number of rows M, so a request decoding alone
(M = 1) differed in the last bits from the same request decoding in a batch. The kernel behind
``InvariantLinear`` (``kvserve/kernels/csrc/linear.cpp``) computes, for each output element,

    acc = 0;  for k in 0 .. K-1: acc = fma(x[m, k], W[n, k], acc);  y[m, n] = round(acc + b[n])

in float32 (bfloat16 inputs are widened exactly), with the weight packed once into panels in its
own dtype. Rows are independent, so the same token gives the same bits alone, batched, in a
chunked prefill, from the prefix cache or after preemption.

On a CPU with AMX-BF16 tiles (Intel Sapphire Rapids and later) a bfloat16 layer runs on the tiles
instead (``kvserve/kernels/csrc/amx_linear.cpp``): the same per-element accumulation in increasing
k (the tile instruction's own rounding), every row independent of the others and one kernel for
every row count, so it is batch-invariant too, 4-6x faster at 64 rows and 1.2-1.9x at one
(docs/benchmarks.md). Its bits may differ in the last place from the vector path's, so they differ
between hosts with and without AMX; on one host they never depend on the batch.
``KVSERVE_AMX=0`` keeps the vector path.
"""

from __future__ import annotations

from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from kvserve import huge_pages
from kvserve.heap import HeapTrimmer, trim
from kvserve.kernels import kernels_for

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16)
PACK_SLICE_BYTES = 64 << 20  # pack_amx_weight's slices


def pack_amx_weight(weight: torch.Tensor) -> torch.Tensor:
    """A bfloat16 weight [N, K] as ``amx_linear.cpp``'s B tiles [ceil(N/16), ceil(K/32), 16, 32]:
    panel p, chunk c, tile row r holds, for each column j, the input pair (2r, 2r + 1) of the
    chunk, ``tiles[p, c, r, 2j + h] = W[16p + j, 32c + 2r + h]``; N and K padded with zeros.

    Written into huge pages (``huge_pages.empty``) a slice of panels at a time, so that packing
    holds one slice besides the weight and its packed copy: a whole-tensor pad and permute made two
    more copies of the largest weight (GPT-OSS-20B's LM head: 1.2 GB each, a 2.3 GB transient at
    start)."""
    n, k = weight.shape
    panels, chunks = -(-n // 16), -(-k // 32)
    out = huge_pages.empty((panels, chunks, 16, 32), weight.dtype)
    step = max(1, PACK_SLICE_BYTES // (16 * chunks * 32 * weight.element_size()))
    for p0 in range(0, panels, step):
        p1 = min(panels, p0 + step)
        rows = weight[16 * p0: 16 * p1]
        padded = F.pad(rows, (0, chunks * 32 - k, 0, 16 * (p1 - p0) - rows.shape[0]))
        out[p0:p1] = padded.view(p1 - p0, 16, chunks, 16, 2).permute(0, 2, 3, 1, 4).reshape(p1 - p0, chunks, 16, 32)
    return out


class InvariantLinear(nn.Module):
    """``y = x W^T + b`` through kvserve's batch-invariant CPU GEMM.

    Input [..., in_features] float32 or bfloat16 -> [..., out_features] in the input's dtype.
    The weight (float32 or bfloat16) is packed at construction into ``linear.cpp``'s panels and
    kept in its dtype (a bfloat16 model reads half the bytes per decode step); the bias is kept
    as float32. Holds no ``nn.Parameter`` (weights are fixed for inference). Built by
    ``use_invariant_linears``.

    Args:
        linear: the layer to replace (its weight is copied into the packed layout).
        kernels: the compiled module from ``kvserve.kernels.kernels_for("cpu")``.
        amx: run a bfloat16 layer on AMX tiles: None (default) where the CPU has them, False
            never (tests of the vector path), True insists (an error where they are missing).
    """

    def __init__(self, linear: nn.Linear, kernels: ModuleType, amx: bool | None = None):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self._kernels = kernels
        self.weight_dtype = linear.weight.dtype
        available = linear.weight.dtype == torch.bfloat16 and kernels.amx_linear_available()
        if amx and not available:
            raise ValueError("AMX tiles need a bfloat16 weight and a CPU (and OS) that provides AMX-BF16")
        self.amx = available if amx is None else amx
        weight = linear.weight.detach()
        self.packed = pack_amx_weight(weight) if self.amx else huge_pages.place(kernels.pack_linear_weight(weight))
        self.bias = None if linear.bias is None else linear.bias.detach().to(torch.float32).contiguous()
        self._vector_packed: torch.Tensor | None = None  # an AMX layer's panels for float32 inputs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        rows = x.reshape(-1, self.in_features).contiguous()
        amx, packed = self.kernel_weights(rows.dtype)
        kernel = self._kernels.amx_linear if amx else self._kernels.invariant_linear
        return kernel(rows, packed, self.bias, self.out_features).reshape(*shape[:-1], self.out_features)

    def kernel_weights(self, dtype: torch.dtype) -> tuple[bool, torch.Tensor]:
        """(AMX tiles?, the packed weight) the forward of ``dtype`` activations passes to its kernel
        (``amx_linear`` or ``invariant_linear``); also what ``kvserve.model.fused_decoder`` calls."""
        if self.amx and dtype == torch.bfloat16:
            return True, self.packed
        return False, self._vector_panels()

    def _vector_panels(self) -> torch.Tensor:
        """linear.cpp's panels: ``packed`` itself, or for an AMX layer (whose tiles take only
        bfloat16 activations) made once from its tiles when float32 activations first arrive."""
        if not self.amx:
            return self.packed
        if self._vector_packed is None:
            panels, chunks, rows, cols = self.packed.shape  # [N/16, K/32, 16, 32]: pairs of k per column
            weight = self.packed.view(panels, chunks, rows, cols // 2, 2).permute(0, 3, 1, 2, 4)
            weight = weight.reshape(panels * cols // 2, chunks * rows * 2)[: self.out_features, : self.in_features]
            self._vector_packed = huge_pages.place(self._kernels.pack_linear_weight(weight.contiguous()))
        return self._vector_packed

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, weight_dtype={self.weight_dtype}, amx={self.amx}")


def use_invariant_linears(model: nn.Module) -> int:
    """Replace every float32 or bfloat16 CPU ``nn.Linear`` of ``model`` (incl. ``MergedLinear``
    and a tied ``lm_head``; the embedding keeps its own weight) by an ``InvariantLinear``, in
    place. Call after the weights are loaded. Returns how many were replaced.

    Where the C++ kernels cannot be built (no compiler), nothing is replaced and returns 0: the
    model keeps ``nn.Linear`` (``F.linear``: MKL / oneDNN), whose rows may differ in the last
    bits between batch sizes, so batch invariance is then not guaranteed.
    """
    kernels = kernels_for("cpu")  # CPU linears only
    if kernels is None:
        return 0
    # (parent, name) only: each float weight is freed as soon as its layer is packed, so the peak
    # is the model plus one layer, not the model twice (an 11 GB MoE checkpoint hit 23 GB).
    targets = [
        (parent, name)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear)
        and child.weight.dtype in SUPPORTED_DTYPES
        and child.weight.device.type == "cpu"
    ]
    trimmer = HeapTrimmer()
    for parent, name in targets:
        child = getattr(parent, name)
        nbytes = child.weight.numel() * child.weight.element_size()
        setattr(parent, name, InvariantLinear(child, kernels))
        del child
        trimmer.freed(nbytes)
    trim()
    return len(targets)
