"""Truncation of the sampling distribution: top-k, top-p (nucleus) and min-p.

All functions take temperature-scaled float32 logits ``[N, V]`` and set the logits of removed
tokens to ``-inf`` in place; a row whose parameter is "off" is left unchanged. At least one token
(the most likely) always survives.
"""

from __future__ import annotations

import torch

from kvserve.kernels.triton_sample import SampleKernels

_NEG_INF = float("-inf")
# Candidates of the torch top-p path (no kernels: no C++ compiler, or CUDA without Triton; the
# threshold search of kernels/csrc/top_p.cpp, or of its Triton twin on CUDA, takes every row). A
# trained model's nucleus is usually far smaller; a wider one (a flat distribution, a high
# temperature) takes a sort of the whole vocabulary.
_TOP_P_CANDIDATES = 256


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None,
                      ops: SampleKernels | None) -> None:
    """Keep the ``top_k`` most likely tokens, then the smallest most-likely-first set whose
    probability mass (after top-k) is at least ``top_p``.

    Top-p follows Holtzman et al. 2019 ("The Curious Case of Neural Text Degeneration"): a token
    is kept when the mass of the tokens before it, most likely first, is below ``top_p`` (the
    kernels order equal logits by index and sum the mass in index order). Top-k
    keeps every token whose logit is >= the k-th largest, so ties at the boundary all survive (as
    in vLLM and Hugging Face).

    Args:
        logits: float32 ``[N, V]``, modified in place.
        top_k: int64 ``[N]`` (``V`` = off), or None.
        top_p: float32 ``[N]`` (1.0 = off), or None.
        ops: the caller's kernels (``Sampler.ops``), or None for the torch code.
    """
    if top_k is not None:
        _apply_top_k_only(logits, top_k)
    if top_p is None:
        return
    off = top_p >= 1.0
    if ops is not None and logits.dtype == torch.float32 and logits.is_contiguous():
        # every active row through the kernels' threshold search (kernels/csrc/top_p.cpp)
        apply_top_p_kernel(ops, logits, (~off).nonzero().squeeze(1), top_p)
        return
    wide = _apply_top_p_from_candidates(logits, top_p, off, _TOP_P_CANDIDATES)
    if not bool(wide.any()):
        return
    # Only those rows sort: a row's path never depends on the rows beside it.
    rows = wide.nonzero().squeeze(1)
    sub = logits[rows]
    _apply_top_p_sorted(sub, top_p[rows], off[rows])
    logits[rows] = sub


def apply_top_p_kernel(kernels: SampleKernels, logits: torch.Tensor, rows: torch.Tensor, top_p: torch.Tensor,
                       temperature: torch.Tensor | None = None) -> None:
    """Top-p of ``rows`` of contiguous ``logits`` on the kernels' device (float32, or also
    bfloat16 with ``temperature``) in place through ``kernels.top_p_rows`` (kernels/csrc/top_p.cpp
    or its Triton twin); with ``temperature`` ([N]) the decisions are taken on ``logits / T`` and
    the raw logits masked."""
    if not rows.numel():
        return
    # A top_p below float32's range (validation allows any p > 0) keeps the top token only.
    p = top_p[rows].to(torch.float32).clamp_min(torch.finfo(torch.float32).tiny).contiguous()
    t = None if temperature is None else temperature[rows].to(torch.float32).contiguous()
    kernels.top_p_rows(logits, rows, p, t)


def _top_p_drop(sorted_probs: torch.Tensor, top_p: torch.Tensor, off: torch.Tensor) -> torch.Tensor:
    """bool mask over most-likely-first probabilities: True where the mass before is >= top_p."""
    drop = (sorted_probs.cumsum(dim=1) - sorted_probs) >= top_p.unsqueeze(1)
    drop[:, 0] = False
    return drop & ~off.unsqueeze(1)


def _apply_top_p_from_candidates(logits: torch.Tensor, top_p: torch.Tensor, off: torch.Tensor, k: int) -> torch.Tensor:
    """Top-p over the ``k`` most likely tokens only, exact for a row that drops its k-th
    candidate (all later tokens have even more mass before them). Returns bool ``[N]``: the
    active rows whose nucleus may reach past the candidates, left unchanged."""
    k = min(k, logits.shape[1])
    probs = logits.softmax(dim=1)
    top_probs, top_ids = probs.topk(k, dim=1)
    drop = _top_p_drop(top_probs, top_p, off)
    wide = ~(drop[:, -1] | off) if k < logits.shape[1] else torch.zeros_like(off)
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, top_ids, ~drop)
    logits.masked_fill_(~(keep | (off | wide).unsqueeze(1)), _NEG_INF)
    return wide


def _apply_top_p_sorted(logits: torch.Tensor, top_p: torch.Tensor, off: torch.Tensor) -> None:
    """Top-p with a full sort of the vocabulary (wide nuclei: flat distributions)."""
    sorted_logits, sorted_ids = logits.sort(dim=1, descending=True)
    drop = _top_p_drop(sorted_logits.softmax(dim=1), top_p, off)
    sorted_logits.masked_fill_(drop, _NEG_INF)
    logits.scatter_(1, sorted_ids, sorted_logits)


def _apply_top_k_only(logits: torch.Tensor, top_k: torch.Tensor) -> None:
    """Top-k without a full sort: one ``topk`` of the largest k in the batch."""
    vocab_size = logits.shape[1]
    active = top_k < vocab_size
    max_k = int(top_k[active].max()) if bool(active.any()) else vocab_size
    top_values = logits.topk(max_k, dim=1).values
    kth = top_values.gather(1, (top_k.clamp(max=max_k) - 1).unsqueeze(1))
    kth = torch.where(active.unsqueeze(1), kth, torch.full_like(kth, _NEG_INF))
    logits.masked_fill_(logits < kth, _NEG_INF)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> None:
    """Drop tokens whose probability is below ``min_p`` times the most likely token's
    (Nguyen et al. 2024, "Min P Sampling"; as vLLM and Hugging Face ``MinPLogitsWarper``).

    Args:
        logits: float32 ``[N, V]``, temperature already applied; modified in place.
        min_p: float32 ``[N]`` in [0, 1] (0 = off).
    """
    probs = logits.softmax(dim=1)
    threshold = min_p.unsqueeze(1) * probs.amax(dim=1, keepdim=True)
    logits.masked_fill_(probs < threshold, _NEG_INF)
