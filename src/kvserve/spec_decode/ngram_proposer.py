"""N-gram prompt lookup: drafts copied from the request's own prompt and output.

As vLLM's ``NgramProposer`` (``vllm/v1/spec_decode/ngram_proposer.py``): find the longest
n-gram, ``prompt_lookup_min <= n <= prompt_lookup_max``, that ends the request's tokens and also
occurs earlier; propose the (up to) ``k`` tokens that followed it::

    tokens   = [a b c d a b c]   min 2, max 3, k 4
    suffix "a b c" occurs at 0..2  ->  drafts [d a b c]

One difference: among equally long matches kvserve takes the **most recent** occurrence (vLLM
the earliest). Text that repeats itself (a model's loops, a list, code) repeats what came last,
and a copy in progress is found either way when the n-gram occurs once. Replayed on the built-in
model's copy-edit outputs (``benchmarks/spec_lookup_sim.py``, ``docs/benchmarks.md`` section 5.3):
47.6% of the drafts accepted instead of 38.6% (k = 4, lookup 2-4), 1.36 tokens per step instead
of 1.33.

Method (numpy, no per-token Python loop): the candidates are the earlier positions holding the
last token; each step back extends every candidate that still matches, for at most
``prompt_lookup_max - 1`` steps. Cost O(L + C * max) per request for L tokens and C candidates
(vLLM runs KMP over the reversed tokens in numba: O(L)); not timed on its own (its share of a
step is inside the TPOT figures of ``docs/benchmarks.md`` section 5.3).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvserve.spec_decode.proposer import Proposer, register_proposer


def ngram_propose(tokens: np.ndarray, min_n: int, max_n: int, k: int) -> np.ndarray:
    """Drafts for one request (see the module docstring).

    Args:
        tokens: int ``[L]``, the request's known tokens.
        min_n, max_n: n-gram lengths, ``1 <= min_n <= max_n``.
        k: most drafts.

    Returns:
        int ``[<= k]`` the tokens after the most recent of the longest matches (empty when no
        n-gram of ``min_n`` tokens or more recurs).
    """
    length = len(tokens)
    if length < 2 or k <= 0:
        return tokens[:0]
    ends = np.flatnonzero(tokens[:-1] == tokens[-1])  # earlier occurrences of the last token
    if len(ends) == 0:
        return tokens[:0]
    matched = np.ones(len(ends), dtype=np.int64)
    alive = np.ones(len(ends), dtype=bool)
    for back in range(1, max_n):
        index = ends - back
        alive &= index >= 0
        alive[alive] = tokens[index[alive]] == tokens[length - 1 - back]
        if not alive.any():
            break
        matched += alive
    best = len(matched) - 1 - int(np.argmax(matched[::-1]))  # the last (most recent) of the longest
    if matched[best] < min_n:
        return tokens[:0]
    start = int(ends[best]) + 1
    return tokens[start : start + k]


@register_proposer
class NgramProposer(Proposer):
    """Args:
    num_speculative_tokens: ``k``.
    prompt_lookup_min, prompt_lookup_max: n-gram lengths tried.
    max_model_len: no draft reaches past the context length.
    """

    name = "ngram"

    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int,
                 max_model_len: int):
        self.k = num_speculative_tokens
        self.min_n = prompt_lookup_min
        self.max_n = prompt_lookup_max
        self.max_model_len = max_model_len

    @classmethod
    def from_config(cls, config: Any, *, max_model_len: int, **_: Any) -> NgramProposer:
        return cls(config.num_speculative_tokens, config.prompt_lookup_min, config.prompt_lookup_max, max_model_len)

    def propose(self, batch: Any, rows: list[int]) -> list[list[int]]:
        drafts = []
        for row in rows:
            num_tokens = int(batch.num_tokens[row])
            k = min(self.k, self.max_model_len - num_tokens)
            drafts.append(ngram_propose(batch.token_ids[row, :num_tokens], self.min_n, self.max_n, k).tolist())
        return drafts
