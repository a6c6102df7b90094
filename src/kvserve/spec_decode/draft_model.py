"""A draft model: a smaller model with the target's tokenizer proposes ``k`` tokens by greedy
decoding, for all speculating requests of the step at once.

Its paged K/V cache has the target's block ids (one tensor per draft layer, ``[2, num_blocks,
block_size, draft_kv_heads, draft_head_dim]``), so it needs no block manager of its own: a
request's draft K/V lives in the same blocks as its target K/V. The scheduler allocates
``k`` lookahead slots past each speculating request's tokens (``num_lookahead_tokens``) for the
K/V of the drafts themselves.

Per request the proposer keeps how far its draft K/V is valid (:class:`DraftState`), and catches
up lazily, so requests that do not speculate cost nothing::

    after step t:  tokens [0, n)       draft K/V valid [0, v)
    forward 1:     draft computes [v, n) (usually the 1-2 tokens the last step added) -> d1
    forward i:     draft computes d(i-1) at position n + i - 2 -> di       (i = 2 .. k)
    afterwards:    valid = n + k - 1 (d1 .. d(k-1) included); the next step keeps the part of
                   it the target accepted (the drafts that equal the real tokens)

A request new to the runner (first scheduled, or resumed after preemption) starts with nothing
valid: its draft recomputes the whole context once (the blocks of a prefix-cache hit hold the
target's K/V but not necessarily the draft's). Writing the same tokens' draft K/V into a shared
block twice writes the same values (every kernel is batch-invariant), so sharing is safe.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from kvserve.errors import ConfigError
from kvserve.kernels import kernels_for
from kvserve.model.fused_decoder import FusedDecoder, model_hidden
from kvserve.model.invariant_linear import use_invariant_linears
from kvserve.model.loader import LoadedModel
from kvserve.model.model_inputs import make_flat_batch, to_model_inputs
from kvserve.sample.greedy import greedy_argmax
from kvserve.spec_decode.proposer import Proposer, register_proposer

logger = logging.getLogger(__name__)


@dataclass
class DraftState:
    """One request's draft K/V progress: positions ``[0, num_computed)`` hold valid draft K/V if
    the tokens at ``[base, base + len(draft_token_ids) - 1)`` are still the drafts proposed then."""

    num_computed: int = 0
    base: int = 0
    draft_token_ids: list[int] = field(default_factory=list)

    def valid(self, tokens: np.ndarray) -> int:
        """Positions of valid draft K/V given the request's tokens now."""
        if not self.draft_token_ids:
            return min(self.num_computed, len(tokens))
        written = self.draft_token_ids[:-1]  # the last draft's K/V was never computed
        real = tokens[self.base : self.base + len(written)].tolist()
        same = 0
        while same < len(real) and real[same] == written[same]:
            same += 1
        return min(self.base + same, self.num_computed)


def check_draft_model(draft: LoadedModel, target_vocab_size: int, max_model_len: int) -> None:
    """Raises ConfigError: the draft's vocabulary is larger than the target's, or its context is
    shorter than ``max_model_len``."""
    if draft.arch.vocab_size > target_vocab_size:
        raise ConfigError(f"the draft model {draft.model_dir} has {draft.arch.vocab_size} tokens, more than the "
                          f"target's {target_vocab_size}: it must share the target's tokenizer")
    if draft.arch.max_position_embeddings < max_model_len:
        raise ConfigError(f"the draft model {draft.model_dir} handles {draft.arch.max_position_embeddings} tokens, "
                          f"fewer than max_model_len={max_model_len}; lower --max-model-len")


def draft_kv_bytes_per_block(draft: LoadedModel, block_size: int) -> int:
    """Bytes of the draft's K and V of one block over its layers."""
    arch = draft.arch
    element = torch.empty((), dtype=draft.dtype).element_size()
    return 2 * arch.num_hidden_layers * block_size * arch.num_key_value_heads * arch.head_dim * element


@register_proposer
class DraftModelProposer(Proposer):
    """Args:
    draft: the loaded draft model (on the target's device and attention backend).
    num_blocks, block_size: the target's KV cache geometry (same block ids).
    num_speculative_tokens: ``k``.
    max_model_len: no draft reaches past the context length.
    prepack_linears: on the CPU, run the draft's linears through the batch-invariant GEMM (and its
        decoder layers in one C++ call, ``kvserve.model.fused_decoder``, unless ``enforce_eager``).
    enforce_eager: the engine's ``--enforce-eager``: the draft's PyTorch modules layer by layer.
    """

    name = "draft_model"

    def __init__(self, draft: LoadedModel, num_blocks: int, block_size: int, num_speculative_tokens: int,
                 max_model_len: int, prepack_linears: bool = True, enforce_eager: bool = False):
        self.model = draft.model
        self.arch = draft.arch
        self.block_size = block_size
        self.k = num_speculative_tokens
        self.max_model_len = max_model_len
        self.device = next(self.model.parameters()).device
        self.ops = kernels_for(self.device)
        shape = (2, num_blocks, block_size, draft.arch.num_key_value_heads, draft.arch.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=draft.dtype, device=self.device)
                          for _ in range(draft.arch.num_hidden_layers)]
        self.fused_decoder = None
        if self.device.type == "cpu" and prepack_linears:
            use_invariant_linears(self.model)
            self.fused_decoder = None if enforce_eager else FusedDecoder.build(self.model, self.kv_caches)

    @classmethod
    def from_config(cls, config: Any, *, max_model_len: int, draft: LoadedModel, num_blocks: int,
                    block_size: int, enforce_eager: bool = False, **_: Any) -> DraftModelProposer:
        return cls(draft, num_blocks, block_size, config.num_speculative_tokens, max_model_len,
                   enforce_eager=enforce_eager)

    @torch.inference_mode()
    def propose(self, batch: Any, rows: list[int]) -> list[list[int]]:
        states = []
        for row in rows:
            state = batch.states[row]
            if not isinstance(state.proposer_state, DraftState):
                state.proposer_state = DraftState()
            states.append(state.proposer_state)
        rows_arr = np.asarray(rows, dtype=np.int64)
        num_tokens = batch.num_tokens[rows_arr].astype(np.int64)
        capacity = batch.num_blocks[rows_arr] * self.block_size  # slots held, lookahead included
        ks = np.minimum(np.minimum(self.k, self.max_model_len - num_tokens), capacity - num_tokens + 1)
        ks = np.maximum(ks, 0)
        valid = np.array([min(s.valid(batch.token_ids[row, :n]), n - 1)
                          for s, row, n in zip(states, rows, num_tokens.tolist())], dtype=np.int64)
        width = int((num_tokens + ks).max())
        tokens = batch.token_ids[rows_arr, :width].astype(np.int64)
        tables = batch.block_table[rows_arr, : -(-width // self.block_size)]
        drafts = self._decode(tokens, tables, valid, num_tokens, ks)
        for state, n, k, v, draft in zip(states, num_tokens.tolist(), ks.tolist(), valid.tolist(), drafts):
            state.num_computed, state.base, state.draft_token_ids = (n + k - 1 if k else v), n, draft
        return drafts

    def _decode(self, tokens: np.ndarray, tables: np.ndarray, start: np.ndarray, end: np.ndarray,
                ks: np.ndarray) -> list[list[int]]:
        """Greedy decoding: forward 1 computes tokens ``[start, end)`` of each request, forward
        ``i`` its draft ``i - 1``; request ``r`` takes part in forwards ``1 .. ks[r]``."""
        drafts: list[list[int]] = [[] for _ in range(len(ks))]
        active = np.flatnonzero(ks > 0)
        computed, scheduled = start.copy(), end - start
        for step in range(int(ks.max(initial=0))):
            if step > 0:
                active = active[ks[active] > step]
            flat = make_flat_batch(tokens[active], computed[active], scheduled[active], tables[active],
                                   self.block_size, np.ones(len(active), dtype=bool))
            inputs = to_model_inputs(flat, self.device)
            hidden = model_hidden(self.model, self.fused_decoder, inputs, self.kv_caches)
            next_ids = greedy_argmax(self.model.compute_logits(hidden[inputs.logits_indices]), self.ops).tolist()
            for r, token_id in zip(active.tolist(), next_ids):
                drafts[r].append(token_id)
                position = int(end[r]) + step
                if position < tokens.shape[1]:
                    tokens[r, position] = token_id
            computed[active] += scheduled[active]
            scheduled[active] = 1
        return drafts
