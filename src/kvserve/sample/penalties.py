"""Logit processors that run before greedy/random selection: logit_bias, the min_tokens mask and
the repetition / presence / frequency penalties. Each works in place on float32 ``[N, V]`` logits,
vectorized over the whole batch."""

from __future__ import annotations

import torch

from kvserve.sample.metadata import SamplingMetadata, SparseLogitUpdate


def apply_logit_bias(logits: torch.Tensor, logit_bias: SparseLogitUpdate) -> None:
    """Add each ``(row, token, bias)`` triple to ``logits[row, token]`` (OpenAI ``logit_bias``).

    Args:
        logits: float32 ``[N, V]``, modified in place.
        logit_bias: the batch's bias triples (token ids already checked against ``V``).
    """
    logits.index_put_((logit_bias.rows, logit_bias.token_ids), logit_bias.values, accumulate=True)


def ban_tokens(logits: torch.Tensor, banned: SparseLogitUpdate) -> None:
    """Set ``logits[row, token] = -inf`` for every pair in ``banned``, so they cannot be sampled:
    the EOS and stop token ids of requests below ``min_tokens``, and the tokens that would
    complete a bad word (``kvserve.sample.bad_words``).

    Args:
        logits: float32 ``[N, V]``, modified in place.
        banned: the (row, token) pairs; ``banned.values`` is ignored.
    """
    logits.index_put_((banned.rows, banned.token_ids), torch.tensor(float("-inf"), device=logits.device))


def apply_penalties(logits: torch.Tensor, metadata: SamplingMetadata) -> None:
    """Apply the repetition, then the frequency and presence penalties, in place.

    Repetition (CTRL, Keskar et al. 2019, as in Hugging Face's
    ``RepetitionPenaltyLogitsProcessor``): for every token that occurs in the prompt or the output,
    ``logit / r`` if ``logit > 0`` else ``logit * r``.

    Frequency and presence (OpenAI's formula, over output tokens only):
    ``logit -= frequency * count + presence * (count > 0)``.

    Args:
        logits: float32 ``[N, V]``, modified in place.
        metadata: must have ``no_penalties == False``; only ``metadata.penalty_rows`` change.
    """
    assert metadata.prompt_token_mask is not None and metadata.output_token_counts is not None
    rows = metadata.penalty_rows
    # Advanced indexing copies the P penalized rows out and back (CPU index_select is slow).
    selected = logits[rows]
    counts = metadata.output_token_counts
    seen = metadata.prompt_token_mask | (counts > 0)
    penalty = metadata.repetition_penalties.unsqueeze(1)
    # Rows with r == 1 go through the same arithmetic: x / 1 and x * 1 are exact.
    selected = torch.where(seen, torch.where(selected > 0, selected / penalty, selected * penalty), selected)
    selected -= metadata.frequency_penalties.unsqueeze(1) * counts
    selected -= metadata.presence_penalties.unsqueeze(1) * (counts > 0)
    logits[rows] = selected
