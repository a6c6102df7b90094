"""Draft verification: the target's tokens at every position of a speculating request, from one
forward over ``[last token, d1 .. dk]``, position by position.

Position ``j`` of a request is sampled exactly as a non-speculative step would sample it after
``d1 .. dj`` had been generated: the accepted drafts are appended to the request's live state
before position ``j + 1`` is sampled, so logits processors (allowed ids, bad words, the grammar's
bitmask, min_tokens, bias) and penalties see the output extended by the drafts before it; its
logprobs are the raw ``log_softmax`` of the target's logits there::

    logits rows:   [ p0      p1      p2      p3 ]      drafts [d1 d2 d3]
    position 0:    sample p0 -> x0;  x0 == d1 ?  yes: append d1, go on
    position 1:    sample p1 -> x1;  x1 == d2 ?  no:  stop, output [d1, x1]

Greedy rows take the argmax, so the output is token for token the non-speculative output.

Random rows: this is rejection sampling (Leviathan et al. 2023, "Fast Inference from Transformers
via Speculative Decoding"; Chen et al. 2023, "Accelerating Large Language Model Decoding with
Speculative Sampling") with a draft distribution ``q`` that is a point mass on the draft ``d``:
both proposers are deterministic (n-gram lookup, the draft model's argmax; vLLM's default
``draft_sample_method="greedy"`` treats draft probabilities as one-hot the same way). The test
accepts ``d`` with probability ``min(1, p(d) / q(d)) = p(d)`` and otherwise samples the residual
``max(0, p - q)`` normalized, i.e. ``p`` without ``d``. Here both come from one uniform ``u``
per position: the sampler's inverse-CDF draw ``x = F_p^{-1}(u)`` equals ``d`` with probability
``p(d)`` (accept) and is distributed as the residual when it does not (reject, ``x`` is the
recovered token). So every position's token has the target distribution ``p`` after the
processors, temperature, top-k/top-p/min-p, and a seeded request, which draws ``u`` from its own
generator once per position, produces exactly the tokens it would produce without speculation,
whatever else is in the batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from kvserve.outputs import TokenLogprobs
from kvserve.sample.sampler import Sampler


class VerifiedTokens(NamedTuple):
    """Per request (in the order given): its output tokens this step (accepted drafts, then the
    target's own next token) and their logprobs (None entries when not asked for)."""

    token_ids: list[list[int]]
    logprobs: list[list[TokenLogprobs | None]]


class RejectionSampler:
    """Args:
    sampler: the batch's ``Sampler`` (one token per logits row).
    """

    def __init__(self, sampler: Sampler):
        self.sampler = sampler

    def __call__(self, logits: torch.Tensor, rows: np.ndarray, drafts: list[list[int]], batch,
                 uniforms: Callable[[np.ndarray, int], torch.Tensor | None]) -> VerifiedTokens:
        """Sample and verify.

        Args:
            logits: ``[sum(1 + len(drafts[i])), V]``: request ``i``'s positions, consecutive, in
                the order of ``rows``.
            rows: int64 batch rows of the requests that sample.
            drafts: per request, its draft tokens (empty: an ordinary one-token step).
            batch: the persistent ``InputBatch``; accepted drafts are appended to it (and taken
                back if sampling raises, so a failed call leaves it as it was).
            uniforms: ``(rows, position) -> float64 [len(rows)]`` draws for random rows at that
                position, or None when all are greedy.

        Returns:
            the tokens and logprobs of each request. The last token of each is not appended to
            ``batch`` (the caller commits it).
        """
        lengths = np.array([1 + len(d) for d in drafts], dtype=np.int64)
        offsets = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        result = VerifiedTokens([[] for _ in drafts], [[] for _ in drafts])
        accepted = [0] * len(drafts)
        alive = list(range(len(drafts)))
        try:
            for position in range(int(lengths.max(initial=1))):
                if not alive:
                    break
                alive = self._sample_position(logits, rows, drafts, batch, uniforms, position, alive, offsets,
                                              result, accepted)
        except BaseException:
            for i, count in enumerate(accepted):
                if count:
                    batch.truncate_tokens(int(rows[i]), int(batch.num_tokens[rows[i]]) - count)
            raise
        return result

    def _sample_position(self, logits, rows, drafts, batch, uniforms, position, alive, offsets, result,
                         accepted) -> list[int]:
        """Sample position ``position`` of the requests still verifying; return those whose draft
        there was accepted (they go on to the next position)."""
        index = torch.as_tensor(offsets[alive] + position, device=logits.device)
        position_logits = logits[index]
        batch_rows = rows[alive]
        sampled = self.sampler(position_logits, batch.sampling_metadata(batch_rows, uniforms(batch_rows, position)))
        still = []
        for a, (i, token_id) in enumerate(zip(alive, sampled.sampled_token_ids.tolist())):
            result.token_ids[i].append(token_id)
            result.logprobs[i].append(sampled.logprobs[a])
            if position < len(drafts[i]) and token_id == drafts[i][position]:
                batch.append_token(int(rows[i]), token_id)
                accepted[i] += 1
                still.append(i)
        return still
