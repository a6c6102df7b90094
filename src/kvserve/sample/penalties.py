"""Repetition, frequency and presence penalties, applied by the sampler after the logits
processors, in place on float32 ``[N, V]`` logits, vectorized over the rows that use them."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PenaltyBatch:
    """The rows of a batch with a penalty (unpenalized rows cost no ``[V]`` statistics).

    Attributes:
        rows: int64 ``[P]``, logits rows.
        presence_penalties, frequency_penalties, repetition_penalties: float32 ``[P]``.
        prompt_token_mask: bool ``[P, V]``, the token occurs in the row's prompt.
        output_token_counts: int32 ``[P, V]``, occurrences in the row's output so far.
    """

    rows: torch.Tensor
    presence_penalties: torch.Tensor
    frequency_penalties: torch.Tensor
    repetition_penalties: torch.Tensor
    prompt_token_mask: torch.Tensor
    output_token_counts: torch.Tensor


def apply_penalties(logits: torch.Tensor, penalties: PenaltyBatch) -> None:
    """Apply the repetition, then the frequency and presence penalties, in place.

    Repetition (CTRL, Keskar et al. 2019, as in Hugging Face's
    ``RepetitionPenaltyLogitsProcessor``): for every token that occurs in the prompt or the output,
    ``logit / r`` if ``logit > 0`` else ``logit * r``.

    Frequency and presence (OpenAI's formula, over output tokens only):
    ``logit -= frequency * count + presence * (count > 0)``.

    Args:
        logits: float32 ``[N, V]``, modified in place; only ``penalties.rows`` change.
        penalties: the penalized rows.
    """
    rows = penalties.rows
    # Advanced indexing copies the P penalized rows out and back (CPU index_select is slow).
    selected = logits[rows]
    counts = penalties.output_token_counts
    seen = penalties.prompt_token_mask | (counts > 0)
    penalty = penalties.repetition_penalties.unsqueeze(1)
    # Rows with r == 1 go through the same arithmetic: x / 1 and x * 1 are exact.
    selected = torch.where(seen, torch.where(selected > 0, selected / penalty, selected * penalty), selected)
    selected -= penalties.frequency_penalties.unsqueeze(1) * counts
    selected -= penalties.presence_penalties.unsqueeze(1) * (counts > 0)
    logits[rows] = selected
