"""Weight-only int8/int4/MXFP4 linears in Triton, for NVIDIA GPUs: ``y = x W^T + b`` reading the
integers and their group scales (and offsets), never a dequantized copy of the weight.

What ``quant_linear.cpp`` is on the CPU: ``QuantizedLinear`` (``kvserve.model.quant_linear``)
packs its weight with :func:`pack` when the weight lives on a CUDA device and Triton imports
(:func:`triton_quant_for`), so ``--quantization int8|int4``, GPTQ, AWQ, GGUF and MXFP4 checkpoints
run on a GPU at their own bytes. On a CPU it runs only under Triton's interpreter
(``TRITON_INTERPRET=1``), which is how the tests check it.

Layout (:class:`PackedWeight`), K-major so a program's loads of N columns are contiguous::

    codes    int8  [K, N]        bits 8: row k holds input k
             uint8 [K / 2, N]    bits 4: row r holds input r (low nibble) and r + K / 2 (high)
    scales   float32 [K / group_size, N]
    offsets  float32 [K / group_size, N] or None

Numerics: each weight is ``QuantizedTensor.dequantize``'s float32 value rounded to the
activations' dtype (on a GPU the zero-point form ``s * q - m`` may be fused into one rounding), then
``tl.dot`` sums products in float32 (float32 activations in IEEE float32, never TF32), the bias
added in float32 and the sum rounded once. That is ``F.linear(x, W.to(x.dtype), b)`` up to the
order of the float32 sum. The order of that sum is fixed by ``BLOCK_K`` for every row count, and a
row never reads another row; whether the GPU's matrix instructions keep a row's bits when the row
tile changes size (``BLOCK_M`` follows the number of rows) is what ``scripts/gpu_check.py``'s
``quant`` section checks on the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvserve.kernels.tensors import require
from kvserve.kernels.triton_support import triton_available
from kvserve.model.quant_tensor import QuantizedTensor

# Imported at first use (``_kernels``), as in ``kvserve.kernels.triton_elementwise``.
triton = None

BLOCK_K = 64  # rows of packed codes per step of the sum (int4: 128 inputs)
_PRECISION = {torch.float32: "ieee"}


def _kernels():
    global triton
    import triton

    from kvserve.kernels import triton_quant_linear_kernels

    return triton_quant_linear_kernels


@dataclass(frozen=True)
class PackedWeight:
    """A ``QuantizedTensor`` in the kernel's layout (module docstring); ``shape`` is [N, K]."""

    codes: torch.Tensor
    scales: torch.Tensor
    offsets: torch.Tensor | None
    bits: int
    group_size: int
    e2m1: bool
    shape: tuple[int, int]


def pack(weight: QuantizedTensor) -> PackedWeight:
    """The kernel's layout of ``weight``, on its device.

    Raises:
        ValueError: a 4-bit weight with an odd number of inputs.
    """
    n, k = weight.shape
    codes = weight.q.t()
    if weight.bits == 4:
        if k % 2:
            raise ValueError(f"a 4-bit weight needs an even number of inputs, not {k}")
        codes = codes[: k // 2] | (codes[k // 2:] << 4)
    offsets = None if weight.offsets is None else weight.offsets.t().to(torch.float32).contiguous()
    return PackedWeight(codes.contiguous(), weight.scales.t().to(torch.float32).contiguous(), offsets, weight.bits,
                        weight.group_size, weight.codebook == "e2m1", (n, k))


def unpack(packed: PackedWeight, scale_dtype: torch.dtype, offset_dtype: torch.dtype | None) -> QuantizedTensor:
    """The ``QuantizedTensor`` of :func:`pack` (scales and offsets back in the given dtypes)."""
    codes = packed.codes.t()
    if packed.bits == 4:
        codes = torch.cat((codes & 15, codes >> 4), dim=1)
    offsets = None if packed.offsets is None else packed.offsets.t().to(offset_dtype).contiguous()
    return QuantizedTensor(codes.contiguous(), packed.scales.t().to(scale_dtype).contiguous(), offsets, packed.bits,
                           packed.group_size, "e2m1" if packed.e2m1 else "int")


class TritonQuantLinear:
    """The kernel's launcher; any float dtype, any device Triton runs on."""

    def linear(self, x: torch.Tensor, weight: PackedWeight, bias: torch.Tensor | None) -> torch.Tensor:
        """x [M, K] with unit stride in K, bias float32 [N] or None -> [M, N] in x's dtype."""
        n, k = weight.shape
        require(x.dim() == 2 and x.shape[1] == k and x.stride(1) == 1, f"quant_linear: x [M, {k}] with unit stride")
        require(bias is None or (bias.dtype == torch.float32 and bias.shape == (n,) and bias.is_contiguous()),
                "quant_linear: bias float32 [N]")
        kernels = _kernels()
        rows = x.shape[0]
        out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
        if rows == 0:
            return out
        # up to 16 rows (a decode step's CUDA-graph buckets include 16): narrower column tiles, twice
        # the programs for the GPU's SMs; the order of each sum (BLOCK_K) is the same
        block_m, block_n = (16, 32) if rows <= 16 else (64, 64)
        grid = (triton.cdiv(rows, block_m), triton.cdiv(n, block_n))
        kernels.quant_linear_kernel[grid](
            x, weight.codes, weight.scales, weight.offsets if weight.offsets is not None else weight.scales,
            bias if bias is not None else weight.scales, out, rows, n, weight.codes.shape[0], x.stride(0),
            weight.group_size, BITS=weight.bits, E2M1=weight.e2m1, HAS_OFFSETS=weight.offsets is not None,
            HAS_BIAS=bias is not None, PRECISION=_PRECISION.get(x.dtype),
            INTERPRETED=triton.knobs.runtime.interpret, BLOCK_M=block_m,
            BLOCK_N=block_n, BLOCK_K=BLOCK_K)
        return out


def triton_quant_for(device: torch.device | str | None) -> TritonQuantLinear | None:
    """The kernels for a quantized weight on ``device``: on CUDA where Triton imports, else None."""
    if device is None or torch.device(device).type != "cuda" or not triton_available():
        return None
    return TritonQuantLinear()
