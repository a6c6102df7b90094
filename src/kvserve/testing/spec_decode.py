"""Test hooks for speculative decoding: proposers that force chosen drafts, and a K/V integrity
check that recomputes every running request's cache.

Install a forced proposer on an engine built with a ``--speculative-config`` (so the scheduler
schedules drafts)::

    llm = LLM(model, speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    llm.llm_engine.core.proposer = ForcedProposer(reference_drafts(reference, k=4))
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from kvserve.spec_decode.proposer import Proposer

DraftFn = Callable[[list[int], list[int]], list[int]]


class ForcedProposer(Proposer):
    """Proposes ``drafts_for(prompt_token_ids, output_token_ids)`` for each request."""

    name = "forced"

    def __init__(self, drafts_for: DraftFn):
        self.drafts_for = drafts_for
        self.proposed: list[tuple[list[int], list[int]]] = []  # (output so far, drafts), in order

    def propose(self, batch: Any, rows: list[int]) -> list[list[int]]:
        drafts = []
        for row in rows:
            state = batch.states[row]
            draft = list(self.drafts_for(list(state.spec.prompt_token_ids), list(state.output_token_ids)))
            self.proposed.append((list(state.output_token_ids), draft))
            drafts.append(draft)
        return drafts


def reference_drafts(reference: dict[tuple[int, ...], list[int]], k: int, mode: str = "all",
                     seed: int = 0, vocab_size: int = 1000) -> DraftFn:
    """Drafts from each prompt's reference output (``reference[tuple(prompt)]``, the tokens a
    non-speculative run produced).

    Args:
        mode: ``all`` (the next ``k`` reference tokens: every draft is accepted), ``none`` (each
            one off by one id: none is accepted), ``prefix`` (the next ``k``, the one at a random
            cut replaced: exactly the tokens before it are accepted).
        seed: seeds the cuts of ``prefix``.
    """
    rng = random.Random(seed)

    def wrong(token_id: int) -> int:
        return (token_id + 1) % vocab_size

    def drafts_for(prompt: list[int], output: list[int]) -> list[int]:
        ahead = reference[tuple(prompt)][len(output) : len(output) + k]
        if mode == "none":
            return [wrong(t) for t in ahead]
        if mode == "prefix" and ahead:
            cut = rng.randrange(len(ahead) + 1)
            return ahead[:cut] + [wrong(t) for t in ahead[cut : cut + 1]] + ahead[cut + 1 :]
        return ahead

    return drafts_for


def check_kv_integrity(core: Any) -> int:
    """Recompute the K/V of every running request's computed tokens into free uncached blocks
    (all requests in one forward) and compare them bit for bit with what its own blocks hold;
    also the KV manager's accounting (``check_integrity``). Positions past
    ``num_computed_tokens`` (e.g. rejected drafts) are not compared: they are not part of the
    cache. Requests for which no scratch blocks are left are skipped (a tiny cache).

    Returns:
        the number of positions compared.

    Raises:
        AssertionError: naming the request, layer and first differing position.
    """
    manager, runner = core.kv_cache_manager, core.runner
    manager.check_integrity()
    pool, block_size = manager.block_pool, manager.block_size
    free = [b.block_id for b in pool.blocks[1:] if b.ref_cnt == 0 and b.block_hash is None]
    checked = []  # (request, computed, scratch block ids)
    for request in core.scheduler.running:
        computed = request.num_computed_tokens
        assert computed <= request.num_tokens, f"{request.request_id}: computed {computed} > {request.num_tokens} tokens"
        needed = -(-computed // block_size)
        if computed == 0 or len(free) < needed:
            continue
        checked.append((request, computed, free[:needed]))
        free = free[needed:]
    if not checked:
        return 0
    runner.forward([r.all_token_ids[:n] for r, n, _ in checked], [scratch for _, _, scratch in checked])
    for request, computed, scratch in checked:
        own = manager.req_to_block_ids[request.request_id][: len(scratch)]
        positions = np.arange(computed)
        for layer, cache in enumerate(runner.kv_caches):
            mine = cache[:, own][:, positions // block_size, positions % block_size]
            fresh = cache[:, scratch][:, positions // block_size, positions % block_size]
            if not torch.equal(mine, fresh):
                bad = int((mine != fresh).flatten(2).any(-1).any(0).nonzero()[0])
                raise AssertionError(f"{request.request_id}: layer {layer} K/V differ from a recomputation "
                                     f"at position {bad} (of {computed} computed)")
    return sum(n for _, n, _ in checked)
