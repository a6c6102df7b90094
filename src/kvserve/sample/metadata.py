"""What the sampler needs for one step's ``[N, V]`` logits, built by the model runner's persistent
batch (``kvserve.model.input_batch.InputBatch.sampling_metadata``).

Row ``i`` of every tensor belongs to logits row ``i``. Flags such as ``all_greedy`` let the
sampler skip whole stages, so a greedy batch without logprobs or processors costs one argmax.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvserve.sample.logits_processor import LogitsProcessor
from kvserve.sample.penalties import PenaltyBatch


@dataclass(frozen=True)
class SamplingMetadata:
    """Everything the sampler needs for one batch of ``N`` rows over a vocabulary of ``V``.

    Attributes:
        temperature: float32 ``[N]``; greedy rows hold 1.0 (they are argmax'ed, never divided).
        greedy_mask: bool ``[N]``, True where the row is greedy (temperature < 1e-5).
        all_greedy / all_random: every row greedy / no row greedy.
        top_k: int64 ``[N]`` with ``V`` meaning "off", or ``None`` when no row uses top-k.
        top_p: float32 ``[N]`` (1.0 = off), or ``None`` when no row uses top-p.
        min_p: float32 ``[N]`` (0.0 = off), or ``None`` when no row uses min-p.
        generators: per row, the request's own generator (it has a ``seed``) or None.
        uniforms: float64 ``[N]`` draws in [0, 1) taken ahead by the caller (the model runner
            draws once per step, so a retried row reuses its number), or None: the sampler then
            draws them (``draw_uniforms``).
        penalties: the penalized rows, or None.
        num_logprobs: per row, how many top alternatives to return, or None (no logprobs).
        logits_processors: the active processors, applied in this order.
        batch_rows: per logits row, its row in the persistent batch (what processors key on).
    """

    temperature: torch.Tensor
    greedy_mask: torch.Tensor
    all_greedy: bool
    all_random: bool
    top_k: torch.Tensor | None
    top_p: torch.Tensor | None
    min_p: torch.Tensor | None
    generators: list[torch.Generator | None]
    uniforms: torch.Tensor | None
    penalties: PenaltyBatch | None
    num_logprobs: list[int | None]
    logits_processors: Sequence[LogitsProcessor]
    batch_rows: Sequence[int]

    @property
    def num_rows(self) -> int:
        return len(self.num_logprobs)

    @property
    def max_num_logprobs(self) -> int | None:
        wanted = [k for k in self.num_logprobs if k is not None]
        return max(wanted) if wanted else None
