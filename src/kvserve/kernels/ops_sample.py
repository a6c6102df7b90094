"""The sampling kernels: greedy argmax (``csrc/argmax.cpp``), the one-pass draw (``sample.cpp``),
top-p without a sort (``top_p.cpp``) and the structured-output bitmask (``bitmask.cpp``)."""

from __future__ import annotations

import torch

from kvserve.kernels.tensors import FLOAT_DTYPES, code, cpu_contiguous, index_tensor, optional_ptr, ptr, require


def check_sample_args(rows: torch.Tensor, temperature: torch.Tensor, uniforms: torch.Tensor) -> None:
    """``sample_rows``' row arguments (this wrapper's and its Triton twin's)."""
    count = rows.numel()
    require(rows.dtype == torch.int64 and rows.dim() == 1 and rows.is_contiguous()
            and temperature.dtype == torch.float32 and temperature.numel() == count and temperature.is_contiguous()
            and uniforms.dtype == torch.float64 and uniforms.numel() == count and uniforms.is_contiguous(),
            "sample_rows: rows int64 [R], temperature float32 [R], uniforms float64 [R]")


def top_p_args(rows: torch.Tensor, top_p: torch.Tensor, temperature: torch.Tensor | None):
    """``top_p_rows``' row arguments, checked and contiguous (this wrapper's and its Triton twin's)."""
    require(rows.dim() == 1 and rows.dtype == torch.int64 and top_p.dim() == 1 and top_p.dtype == torch.float32
            and top_p.shape[0] == rows.shape[0], "top_p_rows takes int64 rows [R] and float32 top_p [R]")
    if temperature is not None:
        temperature = temperature.contiguous()
        require(temperature.dim() == 1 and temperature.dtype == torch.float32
                and temperature.shape[0] == rows.shape[0], "top_p_rows takes float32 temperature [R]")
    return rows.contiguous(), top_p.contiguous(), temperature


def check_bitmask_args(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    """``apply_token_bitmask``'s arguments (this wrapper's and its Triton twin's)."""
    require(logits.dim() == 2 and logits.dtype == torch.float32 and logits.stride(1) == 1,
            "logits must be float32 [N, V] with contiguous rows")
    require(bitmask.dim() == 2 and bitmask.dtype == torch.int32 and bitmask.is_contiguous(),
            "bitmask must be contiguous int32 [N, W]")
    require(rows.dim() == 1 and rows.dtype == torch.int64, "rows must be int64 [M]")


class SampleOps:
    """The sampling kernels' wrappers."""

    def argmax_rows(self, logits: torch.Tensor) -> torch.Tensor:
        """Index of the largest value of each row of contiguous [N, V] float32/bfloat16 logits
        (torch.argmax's: the first maximum; a NaN is larger) -> int64 [N]."""
        require(logits.dim() == 2 and logits.is_contiguous() and logits.shape[1] > 0, "logits must be contiguous [N, V]")
        require(logits.dtype in FLOAT_DTYPES, "argmax_rows supports float32 and bfloat16")
        out = torch.empty(logits.shape[0], dtype=torch.int64)
        self._lib.call("kvserve_argmax_rows", code(logits.dtype), ptr(logits), logits.shape[0], logits.shape[1], ptr(out))
        return out

    def sample_rows(self, logits: torch.Tensor, rows: torch.Tensor, temperature: torch.Tensor,
                    uniforms: torch.Tensor) -> torch.Tensor:
        """A token per row ``rows`` (int64 [R]) drawn from softmax(logits / T) by inverse transform
        with ``uniforms`` (float64 [R]); temperature float32 [R] -> int64 [R] (V where the row has
        no distribution)."""
        cpu_contiguous(logits, 2, FLOAT_DTYPES, "sample_rows takes contiguous 2-D float32 or bfloat16 CPU logits")
        check_sample_args(rows, temperature, uniforms)
        count = rows.numel()
        out = torch.empty(count, dtype=torch.int64)
        self._lib.call("kvserve_sample_rows", code(logits.dtype), ptr(logits), logits.shape[0], logits.shape[1], ptr(rows),
                       count, ptr(temperature), ptr(uniforms), ptr(out))
        return out

    def top_p_rows(self, logits: torch.Tensor, rows: torch.Tensor, top_p: torch.Tensor,
                   temperature: torch.Tensor | None) -> None:
        """Top-p of rows ``rows`` of contiguous [N, V] float32/bfloat16 logits in place (dropped
        tokens -inf); top_p float32 [R] in (0, 1); temperature None or float32 [R] > 0 (decide on
        logits / T)."""
        cpu_contiguous(logits, 2, FLOAT_DTYPES, "top_p_rows takes contiguous 2-D float32 or bfloat16 CPU logits")
        rows, top_p, temperature = top_p_args(rows, top_p, temperature)
        self._lib.call("kvserve_top_p_rows", code(logits.dtype), ptr(logits), logits.shape[0], logits.shape[1], ptr(rows),
                       rows.numel(), ptr(top_p), optional_ptr(temperature))

    def apply_token_bitmask(self, logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
        """logits[r, t] = -inf where bitmask[r] (int32 [N, W]) bans token t, for each r in rows (int64)."""
        check_bitmask_args(logits, bitmask, rows)
        rows = index_tensor(rows)
        self._lib.call("kvserve_apply_token_bitmask", ptr(logits), logits.shape[0], logits.shape[1], logits.stride(0),
                       ptr(bitmask), bitmask.shape[0], bitmask.shape[1], ptr(rows), rows.numel())
