"""RMSNorm (with the residual add), SiLU-and-multiply and the rotary embedding in Triton, for
NVIDIA GPUs: what ``elementwise.cpp`` is on the CPU, one pass each instead of several torch
operators (each a kernel launch and a round trip through memory).

:func:`triton_kernels_for` gives them to the layers that call only these three
(``KernelLayer.triton_kernels``) when the model is on a CUDA device and Triton imports. On a CPU
they run only under Triton's interpreter (``TRITON_INTERPRET=1``), which is how the tests check
them against the torch code of ``kvserve.model.layers``.

Numerics are torch's, rounding for rounding: a sum or product in bfloat16 is computed in float32
and rounded to bfloat16 where torch rounds it (the residual sum, ``x * cos``, ``rotated * sin``,
their sum, ``silu(gate)``, its product with ``up``), so those are the same bits. RMSNorm's sum of
squares and SiLU's exponential are computed in another order or approximation than torch's and
may differ in the last float32 place, and so may float32 sums of products on a GPU (where Triton
fuses a multiply and an add). One program per row (per token and head for the rotary
embedding): a row's result never depends on the other rows of the batch.
"""

from __future__ import annotations

import torch

from kvserve.kernels.tensors import require

# Imported at first use (``_kernels``): Triton decides between its compiler and its interpreter
# when it is imported, and a process that never runs these kernels need not pay for the import.
triton = None

# Columns per SiLU-and-multiply program.
SILU_BLOCK = 1024


def _kernels():
    """The kernels' module, imported at first use."""
    global triton
    import triton

    from kvserve.kernels import triton_elementwise_kernels

    return triton_elementwise_kernels


class TritonElementwise:
    """The three kernels with the signatures of ``CpuKernels``' (``ops_elementwise``), so a layer
    calls either the same way; any float dtype, any device Triton runs on."""

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None,
                 eps: float) -> list[torch.Tensor]:
        """x [T, n] (unit stride in n), weight [n], residual [T, n] contiguous or None, one dtype
        -> [RMSNorm(h) * weight, h] with h = x + residual (or x itself)."""
        require(x.dim() == 2 and x.stride(1) == 1 and weight.is_contiguous() and weight.numel() == x.shape[1]
                and weight.dtype == x.dtype, "rms_norm: x [T, n] with unit stride in n, weight [n] of x's dtype")
        kernels = _kernels()
        rows, n = x.shape
        out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
        total = x
        if residual is not None:
            require(residual.is_contiguous() and residual.shape == x.shape and residual.dtype == x.dtype,
                    "rms_norm: the residual must be contiguous, shaped and typed like x")
            total = torch.empty_like(out)
        if rows:
            kernels.rms_norm_kernel[(rows,)](x, residual if residual is not None else x, weight, out, total,
                                             x.stride(0), n, eps, HAS_RESIDUAL=residual is not None,
                                             BLOCK=triton.next_power_of_2(n))
        return [out, total]

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, 2d] contiguous -> silu(x[:, :d]) * x[:, d:], [T, d]."""
        require(x.dim() == 2 and x.is_contiguous() and x.shape[1] % 2 == 0, "silu_and_mul: x [T, 2d] contiguous")
        kernels = _kernels()
        rows, d = x.shape[0], x.shape[1] // 2
        out = torch.empty((rows, d), dtype=x.dtype, device=x.device)
        if rows and d:
            block = min(SILU_BLOCK, triton.next_power_of_2(d))
            kernels.silu_and_mul_kernel[(rows, triton.cdiv(d, block))](x, out, d, BLOCK=block)
        return out

    @staticmethod
    def rotary_takes(x: torch.Tensor, cos: torch.Tensor) -> bool:
        """Whether :meth:`rotary_embedding` takes x and cos (else the caller runs torch code)."""
        return x.dim() == 3 and x.stride(-1) == 1 and x.shape[-1] % 2 == 0 and cos.dtype == x.dtype

    def rotary_embedding(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [T, H, D] (unit stride in D), cos/sin [T, D] contiguous of x's dtype -> contiguous
        [T, H, D], the same bits as ``RotaryEmbedding.apply``'s torch operators."""
        require(x.dim() == 3 and x.stride(2) == 1 and x.shape[2] % 2 == 0,
                "rotary_embedding: x [T, H, D] with unit stride in D, D even")
        require(cos.is_contiguous() and sin.is_contiguous() and cos.shape == (x.shape[0], x.shape[2])
                and sin.shape == cos.shape and cos.dtype == x.dtype and sin.dtype == x.dtype,
                "rotary_embedding: cos and sin [T, D], contiguous, of x's dtype")
        kernels = _kernels()
        rows, heads, dim = x.shape
        out = torch.empty((rows, heads, dim), dtype=x.dtype, device=x.device)
        if rows and heads:
            half = dim // 2
            kernels.rotary_kernel[(rows, heads)](x, cos, sin, out, x.stride(0), x.stride(1), heads, HALF=half,
                                                 HALF_PAD=triton.next_power_of_2(half))
        return out


def triton_kernels_for(device: torch.device | str | None) -> TritonElementwise | None:
    """The Triton kernels for tensors on ``device``: on CUDA, else None (asked for a model whose
    attention backend is Triton's, which is offered only where Triton is installed)."""
    if device is None or torch.device(device).type != "cuda":
        return None
    return TritonElementwise()
