"""The token bitmask: allocation and one batched, in-place apply to logits.

Layout: ``int32 [B, W]`` with ``W = ceil(V / 32)``; bit ``j`` of word ``k`` allows token
``32*k + j`` (xgrammar's and llguidance's layout). Applying it sets every disallowed logit to
``-inf``, so softmax, sampling and greedy argmax see only allowed tokens::

    logits  [N, V] float  ──┐
    bitmask [N, W] int32  ──┼─► logits[r, t] = -inf  for r in indices (all rows if None)
    indices [M] (or None)  ─┘     where bit t of bitmask[r] is 0, or t >= 32*W

Row ``r`` of the bitmask belongs to row ``r`` of the logits (xgrammar's convention), so the
runner keeps one persistent ``[max_num_seqs, W]`` bitmask and fills the rows of constrained
requests; ``indices`` lists those rows and leaves the others untouched.

Implementations, same result bit for bit (tested):

* CPU float32: kvserve's C++ kernel (``kernels/csrc/bitmask.cpp``: whole 32-token runs for
  banned words, nothing for allowed ones); 4-8 ms at B=32, V=151,936 on this project's 2-core
  AVX2 host where xgrammar's CPU kernel (``xgrammar.apply_token_bitmask_inplace``, the next
  choice) took 24-46 ms (docs/benchmarks.md section 5.1);
* CUDA float32 with Triton installed: the Triton twin of that kernel
  (``kernels/triton_sample.py``), the bitmask copied to the device first;
* anywhere else (other dtypes, no compiler, no Triton): portable torch. Each word is ANDed with
  the 32 single-bit values into a boolean ban mask on the logits' device (independent of byte
  order), then one ``masked_fill_``. No kernel compilation, so it works the same on any device.
"""

from __future__ import annotations

import functools

import torch

from kvserve.kernels.triton_sample import SampleKernels


def bitmask_width(vocab_size: int) -> int:
    """Words per row: ``ceil(vocab_size / 32)``."""
    return (int(vocab_size) + 31) // 32


def allocate_token_bitmask(batch_size: int, vocab_size: int, device: str | torch.device = "cpu"
                           ) -> torch.Tensor:
    """An all-allowed (every bit 1, i.e. -1) bitmask ``int32 [batch_size, ceil(V/32)]``."""
    return torch.full((batch_size, bitmask_width(vocab_size)), -1, dtype=torch.int32, device=device)


@functools.lru_cache(maxsize=None)
def _bit_values(device: torch.device) -> torch.Tensor:
    """``int32 [32]``: ``1 << j`` for bit ``j`` (bit 31 is the sign bit)."""
    return torch.tensor([1 << j for j in range(31)] + [-(1 << 31)], dtype=torch.int32,
                        device=device)


def token_ban_mask(bitmask: torch.Tensor, vocab_size: int, device: torch.device) -> torch.Tensor:
    """``bool [M, vocab_size]`` on ``device``: True where the token is disallowed."""
    words = bitmask.to(device, non_blocking=True)
    rows = words.shape[0]
    banned = (words.unsqueeze(-1) & _bit_values(device)).eq(0).view(rows, -1)
    width = banned.shape[1]
    if width >= vocab_size:
        return banned[:, :vocab_size]
    pad = torch.ones(rows, vocab_size - width, dtype=torch.bool, device=device)
    return torch.cat([banned, pad], dim=1)


def apply_token_bitmask_torch_(logits: torch.Tensor, bitmask: torch.Tensor,
                               indices: list[int] | None = None) -> None:
    """Portable torch apply (any device, any float dtype); see the module docstring."""
    vocab = logits.shape[-1]
    if indices is None:
        logits.masked_fill_(token_ban_mask(bitmask, vocab, logits.device), float("-inf"))
        return
    if not indices:
        return
    banned = token_ban_mask(bitmask[list(indices)], vocab, logits.device)
    index = torch.as_tensor(indices, dtype=torch.long, device=logits.device)
    rows = logits.index_select(0, index).masked_fill_(banned, float("-inf"))
    logits.index_copy_(0, index, rows)


@functools.lru_cache(maxsize=1)
def _xgrammar_apply():
    try:
        import xgrammar
    except ImportError:
        return None
    return xgrammar.apply_token_bitmask_inplace


def warm_up_apply() -> None:
    """Import the CPU kernel ahead of time (importing xgrammar takes seconds)."""
    _xgrammar_apply()


def apply_token_bitmask_(logits: torch.Tensor, bitmask: torch.Tensor, indices: list[int] | None,
                         ops: SampleKernels | None) -> None:
    """Set disallowed logits to ``-inf`` in place, one batched op for all constrained rows.

    Args:
        logits: ``float [N, V]`` on any device.
        bitmask: ``int32 [N, W]`` (CPU or the logits' device); row ``r`` masks ``logits[r]``.
        indices: the rows to mask (distinct), or ``None`` for all ``N``.
        ops: the caller's kernels (``sample_ops_for`` the logits' device): contiguous float32
            logits take their kernel (C++ or Triton); None: xgrammar's CPU kernel or torch.

    Raises:
        ValueError: shapes or dtypes that do not fit together.
    """
    if bitmask.dtype != torch.int32 or bitmask.dim() != 2 or logits.dim() != 2:
        raise ValueError("bitmask must be int32 [M, W] and logits [N, V]")
    if bitmask.shape[0] != logits.shape[0]:
        raise ValueError(f"bitmask has {bitmask.shape[0]} rows for {logits.shape[0]} logits rows")
    if indices is not None:
        indices = [int(i) for i in indices]
    on_cpu = (logits.device.type == "cpu" and bitmask.device.type == "cpu" and logits.dtype == torch.float32
              and logits.is_contiguous() and bitmask.is_contiguous())
    if ops is not None and logits.dtype == torch.float32 and logits.is_contiguous():
        device = logits.device
        rows = (torch.arange(logits.shape[0], device=device) if indices is None
                else torch.tensor(indices, dtype=torch.int64, device=device))
        ops.apply_token_bitmask(logits, bitmask.to(device).contiguous(), rows)
        return
    kernel = _xgrammar_apply()
    if kernel is not None and on_cpu and 32 * bitmask.shape[1] >= logits.shape[1]:
        kernel(logits, bitmask, vocab_size=logits.shape[1], indices=indices, backend="cpu")
        return
    apply_token_bitmask_torch_(logits, bitmask, indices)
