"""RMSNorm (with the residual add), SiLU-and-multiply and the bfloat16 rotary embedding, one pass
each (``csrc/elementwise.cpp``)."""

from __future__ import annotations

import torch

from kvserve.kernels.tensors import FLOAT_DTYPES, code, optional_ptr, ptr, require


class ElementwiseOps:
    """The elementwise kernels' wrappers."""

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None,
                 eps: float) -> list[torch.Tensor]:
        """x [T, n] (unit stride in n), weight [n], residual [T, n] contiguous or None, one dtype
        (float32 or bfloat16) -> [RMSNorm(h) * weight, h] with h = x + residual (or x itself)."""
        require(x.dim() == 2 and x.stride(1) == 1 and weight.is_contiguous() and weight.numel() == x.shape[1]
                and weight.dtype == x.dtype and x.dtype in FLOAT_DTYPES,
                "rms_norm: x [T, n] with unit stride in n, weight [n], float32 or bfloat16")
        rows, n = x.shape
        out = torch.empty((rows, n), dtype=x.dtype)
        total = x
        if residual is not None:
            require(residual.is_contiguous() and residual.shape == x.shape and residual.dtype == x.dtype,
                    "rms_norm: the residual must be contiguous, shaped and typed like x")
            total = torch.empty((rows, n), dtype=x.dtype)
        self._lib.call("kvserve_rms_norm", code(x.dtype), ptr(x), x.stride(0), ptr(weight), optional_ptr(residual),
                       ptr(out), ptr(total), rows, n, eps)
        return [out, total]

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, 2d] contiguous float32 or bfloat16 -> silu(x[:, :d]) * x[:, d:], [T, d]."""
        require(x.dim() == 2 and x.is_contiguous() and x.shape[1] % 2 == 0 and x.dtype in FLOAT_DTYPES,
                "silu_and_mul: x [T, 2d] contiguous, float32 or bfloat16")
        rows, d = x.shape[0], x.shape[1] // 2
        out = torch.empty((rows, d), dtype=x.dtype)
        self._lib.call("kvserve_silu_and_mul", code(x.dtype), ptr(x), ptr(out), rows, d)
        return out

    def sigmoid(self, x: torch.Tensor) -> torch.Tensor:
        """Elementwise sigmoid of a contiguous float32/bfloat16 tensor, in float32 and rounded to
        its dtype; a value's bits do not depend on how many values there are (torch's do)."""
        require(x.is_contiguous() and x.dtype in FLOAT_DTYPES and x.device.type == "cpu",
                "sigmoid: a contiguous float32 or bfloat16 CPU tensor")
        out = torch.empty_like(x)
        self._lib.call("kvserve_sigmoid", code(x.dtype), ptr(x), ptr(out), x.numel())
        return out

    def softmax_prefix_rows(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """x float32 [R, S] contiguous, lengths int32 [R] in [1, S] -> x, each row softmaxed over
        its first ``lengths[r]`` values in place, zeros after them; a value's bits depend only on
        those values (not on S, R or the row's place)."""
        require(x.dim() == 2 and x.is_contiguous() and x.dtype == torch.float32 and x.device.type == "cpu",
                "softmax_prefix_rows: x float32 [R, S], contiguous, on the CPU")
        require(lengths.dtype == torch.int32 and lengths.is_contiguous() and lengths.shape == (x.shape[0],),
                "softmax_prefix_rows: lengths int32 [R], contiguous")
        if x.shape[0]:
            require(1 <= int(lengths.min()) and int(lengths.max()) <= x.shape[1],
                    "softmax_prefix_rows: each length in [1, S]")
            self._lib.call("kvserve_softmax_prefix_rows", ptr(x), ptr(lengths), x.shape[0], x.shape[1])
        return x

    @staticmethod
    def rotary_takes(x: torch.Tensor, cos: torch.Tensor) -> bool:
        """Whether :meth:`rotary_embedding` takes x and cos (else the caller runs torch code)."""
        return (x.dtype == torch.bfloat16 and x.dim() == 3 and x.shape[-1] % 32 == 0 and x.stride(-1) == 1
                and cos.dtype == torch.bfloat16)

    def rotary_embedding(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x bfloat16 [T, H, D] (unit stride in D), cos/sin bfloat16 [T, D] contiguous -> contiguous
        [T, H, D], bit-identical to RotaryEmbedding.apply's torch operators; D % 32 == 0."""
        require(x.dim() == 3 and x.dtype == torch.bfloat16 and x.stride(2) == 1,
                "rotary_embedding: x bfloat16 [T, H, D] with unit stride in D")
        require(cos.dtype == torch.bfloat16 and sin.dtype == torch.bfloat16 and cos.is_contiguous()
                and sin.is_contiguous() and cos.shape[0] == x.shape[0] and cos.shape[1] == x.shape[2]
                and sin.shape == cos.shape, "rotary_embedding: cos and sin bfloat16 [T, D], contiguous")
        rows, heads, dim = x.shape
        require(dim % 32 == 0, "rotary_embedding: head_dim must be a multiple of 32")
        out = torch.empty((rows, heads, dim), dtype=torch.bfloat16)
        self._lib.call("kvserve_rotary_embedding", ptr(x), x.stride(0), x.stride(1), ptr(cos), ptr(sin), ptr(out), rows,
                       heads, dim)
        return out
