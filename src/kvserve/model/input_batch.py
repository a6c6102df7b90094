"""The model runner's persistent batch: per-request state kept across steps, so each step only
applies small deltas instead of rebuilding the batch from Python objects (vLLM v1's
``InputBatch``).

Rows ``0 .. num_reqs - 1`` hold the requests scheduled in the current step, with no gaps (a
request that leaves frees its row and the last row moves into the hole)::

    row:            0        1        2
    req_ids:        r3       r7       r1
    token_ids:      [prompt | output ...      ]  int32 [max_num_reqs, max_model_len]
    block_table:    [b4 b9 b12 0 ...]            int32 [max_num_reqs, max_blocks_per_req]
    num_tokens, num_computed_tokens, max_tokens  int64 [max_num_reqs]
    lora_key:       0 0 3                        int64 [max_num_reqs], the row's adapter (0: base)
    temperature, top_p, min_p, top_k, greedy     per-row sampling parameters (tensors)

A request keeps its ``CachedRequestState`` (tokens, blocks, generator) while it runs, also in a
step it is not scheduled in; it holds a row only while scheduled. The logits processors
(``kvserve.sample.logits_processor``) are told of every add, removal and move.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from kvserve.sample.logits_processor import LogitsProcessor
from kvserve.sample.metadata import SamplingMetadata
from kvserve.sample.penalties import PenaltyBatch
from kvserve.sampling_params import SamplingParams

if TYPE_CHECKING:
    from kvserve.engine.engine_request import EngineRequest

SEED_MODULUS = 2**64


@dataclass(eq=False)
class CachedRequestState:
    """What the runner knows about one request it holds.

    Attributes:
        spec: the request's frozen spec (``EngineRequest``: id, prompt, sampling parameters, EOS
            ids, bad words, grammar, adapter), referenced as ``NewRequestData`` brought it.
        output_token_ids: tokens sampled so far; the runner appends to this list (logits
            processors read it live).
        block_ids: its block table.
        num_computed_tokens: tokens whose K/V are in the cache.
        generator: its own generator when it has a ``seed`` (kept across preemption).
        prompt_token_mask, output_token_counts: bool / int32 ``[V]`` statistics for penalties
            (None without penalties).
        proposer_state: what the speculative proposer keeps per request (the draft model's
            K/V progress), or None.
        lora_key: the runner's dense key of its adapter (``LoRAManager.key_of``; 0 = base).
    """

    spec: EngineRequest
    output_token_ids: list[int]
    block_ids: list[int]
    num_computed_tokens: int
    generator: torch.Generator | None = None
    prompt_token_mask: torch.Tensor | None = None
    output_token_counts: torch.Tensor | None = None
    proposer_state: Any = None
    lora_key: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.spec.prompt_token_ids) + len(self.output_token_ids)


def request_generator(seed: int | None, device: torch.device) -> torch.Generator | None:
    """A request's own generator, seeded with ``seed`` modulo 2**64 (torch's seed range; the input
    processor accepts int64 seeds, and a choice of an ``n > 1`` request draws from
    ``seed + index``, which may pass the int64 range)."""
    if seed is None:
        return None
    return torch.Generator(device=device).manual_seed(seed % SEED_MODULUS)


class InputBatch:
    """Rows of the requests scheduled in the current step (see the module docstring).

    Args:
        max_num_reqs: most requests in one step (``max_num_seqs``).
        max_model_len: most tokens of one request.
        max_num_blocks_per_req: block-table width.
        vocab_size: ``V``.
        device: where sampling tensors live (the logits' device).
        logits_processors: told of every row change.
    """

    def __init__(self, max_num_reqs: int, max_model_len: int, max_num_blocks_per_req: int, vocab_size: int,
                 device: torch.device, logits_processors: list[LogitsProcessor]):
        self.max_num_reqs = max_num_reqs
        self.vocab_size = vocab_size
        self.device = device
        self.logits_processors = logits_processors
        self.req_ids: list[str | None] = []  # None: a row freed by remove() until condense()
        self.states: list[CachedRequestState | None] = []
        self.req_id_to_index: dict[str, int] = {}
        self._init_token_arrays(max_num_reqs, max_model_len, max_num_blocks_per_req)
        self._init_sampling_arrays(max_num_reqs)

    def _init_token_arrays(self, rows: int, max_model_len: int, max_blocks: int) -> None:
        self.token_ids = np.zeros((rows, max_model_len), dtype=np.int32)
        self.num_tokens = np.zeros(rows, dtype=np.int64)
        self.num_computed_tokens = np.zeros(rows, dtype=np.int64)
        self.max_tokens = np.zeros(rows, dtype=np.int64)
        self.block_table = np.zeros((rows, max_blocks), dtype=np.int32)
        self.num_blocks = np.zeros(rows, dtype=np.int64)
        self.lora_key = np.zeros(rows, dtype=np.int64)

    def _init_sampling_arrays(self, rows: int) -> None:
        self.temperature = np.ones(rows, dtype=np.float32)
        self.greedy = np.zeros(rows, dtype=bool)
        self.top_k = np.zeros(rows, dtype=np.int64)
        self.top_p = np.ones(rows, dtype=np.float32)
        self.min_p = np.zeros(rows, dtype=np.float32)
        self.num_logprobs = np.full(rows, -1, dtype=np.int64)
        self.penalized = np.zeros(rows, dtype=bool)
        # Device copies of the sampling columns, refreshed when rows change (``_sampling_version``).
        self._sampling_version = 0
        self._device_version = -1
        self._device: dict[str, torch.Tensor] = {}

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)

    # -- rows ------------------------------------------------------------------------------------

    def add(self, state: CachedRequestState) -> int:
        """Give ``state`` the next free row (its tokens, blocks and sampling parameters)."""
        row = self.num_reqs
        if row >= self.max_num_reqs:
            raise RuntimeError(f"input batch is full ({self.max_num_reqs} rows)")
        self.req_ids.append(state.spec.request_id)
        self.states.append(state)
        self.req_id_to_index[state.spec.request_id] = row
        num_prompt, num_tokens = len(state.spec.prompt_token_ids), state.num_tokens
        self.token_ids[row, :num_prompt] = state.spec.prompt_token_ids
        self.token_ids[row, num_prompt:num_tokens] = state.output_token_ids
        self.num_tokens[row] = num_tokens
        self.num_computed_tokens[row] = state.num_computed_tokens
        self.max_tokens[row] = state.spec.max_tokens
        self.lora_key[row] = state.lora_key
        self.num_blocks[row] = 0
        self.append_block_ids(row, state.block_ids)
        self._set_sampling_row(row, state.spec.sampling_params)
        for processor in self.logits_processors:
            processor.add_request(row, state)
        return row

    def _set_sampling_row(self, row: int, params: SamplingParams) -> None:
        self.greedy[row] = params.is_greedy
        self.temperature[row] = 1.0 if params.is_greedy else params.temperature
        self.top_k[row] = params.top_k if 0 < params.top_k < self.vocab_size else self.vocab_size
        self.top_p[row] = params.top_p
        self.min_p[row] = params.min_p
        self.num_logprobs[row] = -1 if params.logprobs is None else params.logprobs
        self.penalized[row] = (params.presence_penalty != 0 or params.frequency_penalty != 0
                               or params.repetition_penalty != 1)
        self._sampling_version += 1

    def remove(self, req_id: str) -> None:
        """Free the row of ``req_id`` (leaving a gap until :meth:`condense`)."""
        row = self.req_id_to_index.pop(req_id)
        self.req_ids[row] = None
        self.states[row] = None
        self._sampling_version += 1
        for processor in self.logits_processors:
            processor.remove_request(row)

    def condense(self) -> None:
        """Close the gaps left by :meth:`remove`: the last rows move into the holes."""
        holes = [row for row, req_id in enumerate(self.req_ids) if req_id is None]
        while holes:
            last = len(self.req_ids) - 1
            if self.req_ids[last] is None:
                self.req_ids.pop()
                self.states.pop()
                holes.remove(last)
                continue
            self._move_last_to(holes.pop(0))

    def _move_last_to(self, dst: int) -> None:
        src = len(self.req_ids) - 1
        req_id = self.req_ids.pop()
        self.req_ids[dst] = req_id
        self.states[dst] = self.states.pop()
        self.req_id_to_index[req_id] = dst
        num_tokens = self.num_tokens[src]
        self.token_ids[dst, :num_tokens] = self.token_ids[src, :num_tokens]
        for array in (self.num_tokens, self.num_computed_tokens, self.max_tokens, self.num_blocks, self.lora_key,
                      self.temperature,
                      self.greedy, self.top_k, self.top_p, self.min_p, self.num_logprobs, self.penalized):
            array[dst] = array[src]
        self.block_table[dst, : self.num_blocks[dst]] = self.block_table[src, : self.num_blocks[dst]]
        self._sampling_version += 1
        for processor in self.logits_processors:
            processor.move_request(src, dst)

    def append_block_ids(self, row: int, block_ids: list[int]) -> None:
        if not block_ids:
            return
        start = self.num_blocks[row]
        self.block_table[row, start : start + len(block_ids)] = block_ids
        self.num_blocks[row] = start + len(block_ids)

    def append_token(self, row: int, token_id: int) -> None:
        """Record a sampled token in the row and its request state."""
        state = self.states[row]
        self.token_ids[row, self.num_tokens[row]] = token_id
        self.num_tokens[row] += 1
        state.output_token_ids.append(token_id)
        if state.output_token_counts is not None:
            state.output_token_counts[token_id] += 1

    def truncate_tokens(self, row: int, num_tokens: int) -> None:
        """Take back the tokens of ``row`` past ``num_tokens`` (accepted draft tokens of a
        verification that then failed): the inverse of :meth:`append_token`."""
        state = self.states[row]
        num_removed = int(self.num_tokens[row]) - num_tokens
        if num_removed <= 0:
            return
        removed = state.output_token_ids[-num_removed:]
        del state.output_token_ids[-num_removed:]
        self.num_tokens[row] = num_tokens
        if state.output_token_counts is not None:
            for token_id in removed:
                state.output_token_counts[token_id] -= 1

    def set_draft_tokens(self, row: int, draft_token_ids: list[int]) -> None:
        """Write draft tokens after the row's known tokens (its ``num_tokens`` is unchanged), so
        the step's inputs include them."""
        start = int(self.num_tokens[row])
        self.token_ids[row, start : start + len(draft_token_ids)] = draft_token_ids

    # -- sampling --------------------------------------------------------------------------------

    def _device_columns(self) -> dict[str, torch.Tensor]:
        """The sampling columns of all rows on the device, copied once per change of rows."""
        if self._device_version != self._sampling_version:
            n = self.num_reqs
            self._device = {
                "temperature": torch.from_numpy(self.temperature[:n].copy()).to(self.device),
                "greedy": torch.from_numpy(self.greedy[:n].copy()).to(self.device),
                "top_k": torch.from_numpy(self.top_k[:n].copy()).to(self.device),
                "top_p": torch.from_numpy(self.top_p[:n].copy()).to(self.device),
                "min_p": torch.from_numpy(self.min_p[:n].copy()).to(self.device),
            }
            self._device_version = self._sampling_version
        return self._device

    def sampling_metadata(self, rows: np.ndarray, uniforms: torch.Tensor | None) -> SamplingMetadata:
        """The sampler's view of the batch rows ``rows`` (in logits order).

        Args:
            rows: int64 batch rows that sample this step.
            uniforms: float64 ``[len(rows)]`` draws for random rows taken ahead, or None.
        """
        columns = self._device_columns()
        if len(rows) == self.num_reqs and (len(rows) == 0 or rows[-1] == len(rows) - 1):
            pick = lambda name: columns[name]  # noqa: E731 - every row samples: no gather
        else:
            index = torch.from_numpy(rows).to(self.device)
            pick = lambda name: columns[name][index]  # noqa: E731
        greedy = self.greedy[rows]
        num_logprobs = self.num_logprobs[rows]
        return SamplingMetadata(
            temperature=pick("temperature"),
            greedy_mask=pick("greedy"),
            all_greedy=bool(greedy.all()),
            all_random=not bool(greedy.any()),
            top_k=pick("top_k") if bool((self.top_k[rows] < self.vocab_size).any()) else None,
            top_p=pick("top_p") if bool((self.top_p[rows] < 1).any()) else None,
            min_p=pick("min_p") if bool((self.min_p[rows] > 0).any()) else None,
            # Only a sampler that draws its own uniforms reads the generators.
            generators=[self.states[row].generator for row in rows.tolist()] if uniforms is None else [],
            uniforms=uniforms,
            penalties=self._penalties(rows),
            num_logprobs=([None] * len(rows) if (num_logprobs < 0).all()
                          else [None if k < 0 else k for k in num_logprobs.tolist()]),
            logits_processors=[p for p in self.logits_processors if p.is_active()],
            batch_rows=rows.tolist(),
        )

    def _penalties(self, rows: np.ndarray) -> PenaltyBatch | None:
        positions = np.flatnonzero(self.penalized[rows])
        if len(positions) == 0:
            return None
        penalized = [(int(i), self.states[int(rows[i])]) for i in positions]
        for _, state in penalized:
            if state.output_token_counts is None:
                self._init_penalty_statistics(state)

        def floats(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float32, device=self.device)

        params = [state.spec.sampling_params for _, state in penalized]
        return PenaltyBatch(
            rows=torch.tensor([i for i, _ in penalized], dtype=torch.int64, device=self.device),
            presence_penalties=floats([p.presence_penalty for p in params]),
            frequency_penalties=floats([p.frequency_penalty for p in params]),
            repetition_penalties=floats([p.repetition_penalty for p in params]),
            prompt_token_mask=torch.stack([state.prompt_token_mask for _, state in penalized]),
            output_token_counts=torch.stack([state.output_token_counts for _, state in penalized]),
        )

    def _init_penalty_statistics(self, state: CachedRequestState) -> None:
        """Prompt-occurrence mask and output counts of a request, built once; the counts then
        grow with each appended token."""
        mask = torch.zeros(self.vocab_size, dtype=torch.bool, device=self.device)
        mask[torch.tensor(state.spec.prompt_token_ids, dtype=torch.int64, device=self.device)] = True
        counts = torch.zeros(self.vocab_size, dtype=torch.int32, device=self.device)
        if state.output_token_ids:
            ids = torch.tensor(state.output_token_ids, dtype=torch.int64, device=self.device)
            counts.scatter_add_(0, ids, torch.ones_like(ids, dtype=torch.int32))
        state.prompt_token_mask, state.output_token_counts = mask, counts
