"""The sampling kernels in Triton, for NVIDIA GPUs: what ``argmax.cpp``, ``sample.cpp``,
``top_p.cpp`` and ``bitmask.cpp`` are on the CPU (``ops_sample.SampleOps``), with the same
signatures, so the sampler, greedy decoding, top-p and the structured-output bitmask call either
the same way. :func:`sample_ops_for` picks the kernels for a device: the C++ ones on the CPU, these
on CUDA where Triton imports, else None (the callers' torch code). On a CPU they run only under
Triton's interpreter (``TRITON_INTERPRET=1``), which is how the tests check them against the C++
kernels and a float64 reference.

One program per row walks the vocabulary in blocks of :data:`BLOCK` positions (a 201,088-token
row is 50 blocks), so a row's result depends only on its own logits (and T, p, u): the same alone
or in any batch. What each kernel guarantees:

- ``argmax_rows``: torch.argmax's index, exactly (the first maximum; the first NaN wins).
- ``top_p_rows``: the rule of ``top_p.cpp`` without a sort: on l = x / T (correctly rounded, as
  torch divides), e = exp(l - max), target = p * sum(e) in float32, a bisection over the float
  order finds the smallest logit u whose mass above, f(u) = sum of e over l > u, is below the
  target; every l > u stays, and of the ties at u, in index order, the t-th while f(u) + t * e(u)
  < target. The sums run in other orders than the C++ kernel's (a block's tree, then the blocks in
  order) and ``exp`` is the GPU's approximation, so the kept set can differ from the C++ kernel's
  only where the mass at the boundary lies within float32 rounding of p; each row takes at most
  67 passes over its logits (64 bisection steps, every other one halving the float order).
- ``sample_rows``: ``sample.cpp``'s inverse transform: e = exp(x / T - max), block sums in
  float32 added in float64, target = u * total in float64, the first block whose running sum
  passes it, in it the first token with e > 0 whose running float64 sum passes it (else its last
  such token; the row's last such token when none passes). The same token as the C++ kernel
  except where u lies within float rounding of a CDF step; V for a row with a NaN or +inf logit
  or only -inf ones.
- ``apply_token_bitmask``: the same bits as ``bitmask.cpp``.
"""

from __future__ import annotations


import torch

from kvserve.kernels import kernels_for
from kvserve.kernels.ops_sample import SampleOps, check_bitmask_args, check_sample_args, top_p_args
from kvserve.kernels.tensors import FLOAT_DTYPES, require
from kvserve.kernels.triton_support import triton_available

# Imported at first use (``_kernels``): Triton decides between its compiler and its interpreter
# when it is imported, and a process that never runs these kernels need not pay for the import.
triton = None

# Positions per block of a row's walk (a fixed number: a row's sums never depend on the batch).
BLOCK = 4096
# Tokens per program of the bitmask kernel.
BITMASK_BLOCK = 1024
# How the row kernels launch: 8 warps (a 4,096-position block is 16 values a thread; no register
# spills at sm_90), and no fused multiply-adds, so every float operation rounds as the C++ ones do.
ROW_LAUNCH = {"num_warps": 8, "enable_fp_fusion": False}


def _kernels():
    """The kernels' module, imported at first use."""
    global triton
    import triton

    from kvserve.kernels import triton_sample_kernels

    return triton_sample_kernels


def _same_device(logits: torch.Tensor, *tensors: torch.Tensor) -> None:
    require(all(t.device == logits.device for t in tensors),
            "the sampling kernels take every tensor on the logits' device")


class TritonSampleOps:
    """The four kernels with ``SampleOps``' signatures, on tensors of any device Triton runs on.

    Args:
        block: positions per block of a row's walk (tests choose small ones to walk several).
    """

    def __init__(self, block: int = BLOCK):
        self.block = block

    def argmax_rows(self, logits: torch.Tensor) -> torch.Tensor:
        """Index of the largest value of each row of contiguous [N, V] float32/bfloat16 logits
        (torch.argmax's: the first maximum; a NaN is larger) -> int64 [N]."""
        require(logits.dim() == 2 and logits.is_contiguous() and logits.shape[1] > 0, "logits must be contiguous [N, V]")
        require(logits.dtype in FLOAT_DTYPES, "argmax_rows supports float32 and bfloat16")
        out = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)
        if logits.shape[0]:
            _kernels().argmax_kernel[(logits.shape[0],)](logits, out, logits.shape[1], BLOCK=self.block, **ROW_LAUNCH)
        return out

    def sample_rows(self, logits: torch.Tensor, rows: torch.Tensor, temperature: torch.Tensor,
                    uniforms: torch.Tensor) -> torch.Tensor:
        """A token per row ``rows`` (int64 [R]) drawn from softmax(logits / T) by inverse transform
        with ``uniforms`` (float64 [R] in [0, 1)); temperature float32 [R] > 0; logits contiguous
        [N, V] float32/bfloat16 -> int64 [R] (V where the row has no distribution)."""
        require(logits.dim() == 2 and logits.is_contiguous() and logits.dtype in FLOAT_DTYPES,
                "sample_rows takes contiguous 2-D float32 or bfloat16 logits")
        check_sample_args(rows, temperature, uniforms)
        count = rows.numel()
        _same_device(logits, rows, temperature, uniforms)
        out = torch.empty(count, dtype=torch.int64, device=logits.device)
        if count:
            _kernels().sample_kernel[(count,)](logits, rows, temperature, uniforms, out, logits.shape[1], BLOCK=self.block,
                                               **ROW_LAUNCH)
        return out

    def top_p_rows(self, logits: torch.Tensor, rows: torch.Tensor, top_p: torch.Tensor,
                   temperature: torch.Tensor | None) -> None:
        """Top-p of rows ``rows`` of contiguous [N, V] float32/bfloat16 logits in place (dropped
        tokens -inf; a row with a NaN or +inf logit, or only -inf ones, is left as is); top_p
        float32 [R] in (0, 1) (not checked: that would wait for the device); temperature None or
        float32 [R] > 0 (decide on logits / T, mask the raw logits)."""
        require(logits.dim() == 2 and logits.is_contiguous() and logits.dtype in FLOAT_DTYPES,
                "top_p_rows takes contiguous 2-D float32 or bfloat16 logits")
        rows, top_p, temperature = top_p_args(rows, top_p, temperature)
        _same_device(logits, rows, top_p, *([] if temperature is None else [temperature]))
        if rows.numel():
            _kernels().top_p_kernel[(rows.numel(),)](logits, rows, top_p, top_p if temperature is None else temperature,
                                                     logits.shape[1], BLOCK=self.block, SCALE=temperature is not None,
                                                     **ROW_LAUNCH)

    def apply_token_bitmask(self, logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
        """logits[r, t] = -inf where bitmask[r] (int32 [N, W]) bans token t, for each r in rows (int64)."""
        check_bitmask_args(logits, bitmask, rows)
        rows = rows.contiguous()
        _same_device(logits, bitmask, rows)
        if rows.numel() and logits.shape[1]:
            grid = (rows.numel(), -(-logits.shape[1] // BITMASK_BLOCK))
            _kernels().bitmask_kernel[grid](logits, bitmask, rows, logits.stride(0), logits.shape[1], bitmask.shape[1],
                                            BLOCK=BITMASK_BLOCK)


# What ``sample_ops_for`` gives besides None: the C++ kernels (``CpuKernels`` is a ``SampleOps``) or these.
SampleKernels = SampleOps | TritonSampleOps


def sample_ops_for(device: torch.device | str | None) -> SampleKernels | None:
    """The sampling kernels for logits on ``device``: the C++ ones on the CPU where they load
    (``kernels_for``), these on CUDA where Triton is installed, else None (the callers' torch code).
    Asked once, where a sampler or logits processor is built."""
    if device is not None and torch.device(device).type == "cuda":
        return TritonSampleOps() if triton_available() else None
    return kernels_for(device)
