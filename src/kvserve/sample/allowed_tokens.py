"""``allowed_token_ids`` (vLLM's extension): a request may generate only the listed token ids.

Every other logit of the row becomes ``-inf`` before any other stage (logit_bias, penalties,
temperature, top-k/p), so a greedy row takes the argmax over the allowed ids and a random row
draws only from them. Logprobs stay those of the raw model (taken before any processing), as
for every other logit processor; vLLM's default ``raw_logprobs`` mode does the same.

    row's logits   [ 2.1  0.3  5.0 -1.2  0.9 ]      allowed_token_ids = [1, 4]
    after the mask [-inf  0.3 -inf -inf  0.9 ]  ->  greedy picks 4
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvserve.request import Request


@dataclass(frozen=True)
class AllowedTokenMask:
    """The rows of a batch that restrict their tokens, and what each allows.

    Attributes:
        rows: int64 ``[R]``, the batch rows with ``allowed_token_ids``.
        allowed: bool ``[R, V]``, True where row ``rows[i]`` may generate the token.
    """

    rows: torch.Tensor
    allowed: torch.Tensor


def build_allowed_token_mask(
    requests: list[Request], vocab_size: int, device: torch.device | str
) -> AllowedTokenMask | None:
    """The mask of the requests (one per logits row) that set ``allowed_token_ids``; None when
    no request does. Ids were checked against the vocabulary on admission
    (``SamplingParams.validate_for_vocab``); any outside ``[0, vocab_size)`` is skipped here."""
    rows = [i for i, r in enumerate(requests) if r.sampling_params.allowed_token_ids is not None]
    if not rows:
        return None
    allowed = torch.zeros(len(rows), vocab_size, dtype=torch.bool)
    for k, row in enumerate(rows):
        ids = [t for t in requests[row].sampling_params.allowed_token_ids if 0 <= t < vocab_size]
        allowed[k, torch.tensor(ids, dtype=torch.int64)] = True
    return AllowedTokenMask(torch.tensor(rows, dtype=torch.int64, device=device), allowed.to(device))


def apply_allowed_token_mask(logits: torch.Tensor, mask: AllowedTokenMask) -> None:
    """Set every logit a row does not allow to ``-inf``.

    Args:
        logits: float32 ``[N, V]``, modified in place.
        mask: the batch's mask (its rows index ``logits``).
    """
    if mask.rows.numel() == logits.shape[0]:  # every row restricts: no gather/scatter
        logits.masked_fill_(~mask.allowed, float("-inf"))
        return
    selected = logits[mask.rows]
    selected.masked_fill_(~mask.allowed, float("-inf"))
    logits[mask.rows] = selected
