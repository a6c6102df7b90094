"""The model runner: owns the paged KV cache, turns a ``SchedulerOutput`` into one flat batch and
runs the model on it.

Flat batch of one step (see ``kvserve.attention.backend`` for the cache layout)::

    scheduled:      r0 (c=0, n=5)        r1 (c=36, n=1)   r2 (c=16, n=3)
    input_ids:      r0.all_token_ids[0:5] | r1[36:37]     | r2[16:19]
    positions:      0 1 2 3 4             | 36            | 16 17 18
    slot_mapping:   block_ids[p // bs] * bs + p % bs, per position p
    logits_indices: index of each sampling request's last token in the batch

Sampling is not done here (see ``kvserve.sample.sampler.Sampler``); ``execute_model`` returns the
logits to sample from.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection
from typing import NamedTuple

import numpy as np
import torch

from kvserve.attention.backend import AttentionMetadata
from kvserve.model.arch_config import ModelArchConfig
from kvserve.model.invariant_linear import use_invariant_linears
from kvserve.model.loader import LoadedModel
from kvserve.scheduler.output import SchedulerOutput


def kv_cache_bytes_per_block(arch: ModelArchConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of K and V of one block over all layers:
    ``2 * num_layers * block_size * num_kv_heads * head_dim * dtype size``."""
    element_size = torch.empty((), dtype=dtype).element_size()
    return 2 * arch.num_hidden_layers * block_size * arch.num_key_value_heads * arch.head_dim * element_size


class ModelInputs(NamedTuple):
    """One step's flat batch (device tensors).

    Attributes:
        input_ids: int64 [T].
        positions: int64 [T].
        attn_metadata: layout for the attention backend.
        logits_indices: int64 [num_sampling_requests], rows of the hidden states to sample from,
            in scheduled order.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    attn_metadata: AttentionMetadata
    logits_indices: torch.Tensor


class ModelStepOutput(NamedTuple):
    """Result of ``execute_model_with_prompt_logits``.

    Attributes:
        logits: [num_sampling_requests, vocab] in the model dtype, as ``execute_model`` returns.
        prompt_logits: request id -> [num_new_tokens, vocab] (model dtype); row i holds the logits
            computed at position ``num_computed_tokens + i`` (they score the token at the next
            position).
    """

    logits: torch.Tensor
    prompt_logits: dict[str, torch.Tensor]


class ModelRunner:
    """Runs a loaded model over paged KV blocks.

    ``kv_caches`` holds one tensor per layer, [2, num_blocks, block_size, num_kv_heads, head_dim]
    in the model dtype, zero-initialised (the backends rely on padded slots being finite).

    Args:
        loaded: the model from ``kvserve.model.loader.load_model``.
        num_blocks: KV blocks to allocate (block ids 0 .. num_blocks - 1).
        block_size: tokens per block.
        device: device of the cache and of the batch tensors (the model's device).
        prepack_linears: on the CPU, swap the model's bfloat16 linears for oneDNN-prepacked ones
            (``kvserve.model.layers.prepack_cpu_linears``; bit-identical, faster at small batch).
    """

    def __init__(
        self,
        loaded: LoadedModel,
        num_blocks: int,
        block_size: int,
        device: str | torch.device = "cpu",
        prepack_linears: bool = True,
    ):
        self.model = loaded.model
        self.arch = loaded.arch
        self.dtype = loaded.dtype
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.device = torch.device(device)
        self.kv_caches = self._init_kv_caches()
        # CPU: float32/bf16 linears through kvserve's batch-invariant GEMM (weights packed once).
        on_cpu = self.device.type == "cpu"
        self.num_prepacked_linears = use_invariant_linears(self.model) if on_cpu and prepack_linears else 0

    def _init_kv_caches(self) -> list[torch.Tensor]:
        shape = (2, self.num_blocks, self.block_size, self.arch.num_key_value_heads, self.arch.head_dim)
        return [
            torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.arch.num_hidden_layers)
        ]

    def prepare_inputs(self, scheduler_output: SchedulerOutput) -> ModelInputs:
        """Build the flat batch of ``scheduler_output.scheduled`` (see module docstring).

        Raises:
            ValueError: a request's ``block_ids`` do not cover its positions (a scheduler bug).
        """
        scheduled = scheduler_output.scheduled
        q_lens = np.array([s.num_new_tokens for s in scheduled], dtype=np.int64)
        computed = np.array([s.num_computed_tokens for s in scheduled], dtype=np.int64)
        seq_lens = computed + q_lens
        query_start_loc = np.zeros(len(scheduled) + 1, dtype=np.int64)
        np.cumsum(q_lens, out=query_start_loc[1:])
        block_tables = self._block_tables(scheduler_output, seq_lens)
        # Token t of request r sits at position computed[r] + (t - query_start_loc[r]); no
        # per-token Python loop.
        req_of_token = np.repeat(np.arange(len(scheduled)), q_lens)
        positions = computed[req_of_token] + np.arange(query_start_loc[-1]) - query_start_loc[req_of_token]
        slot_mapping = (
            block_tables[req_of_token, positions // self.block_size] * self.block_size + positions % self.block_size
        )
        token_ids = [s.request.all_token_ids[s.num_computed_tokens : s.num_computed_tokens + s.num_new_tokens]
                     for s in scheduled]
        input_ids = np.fromiter(itertools.chain.from_iterable(token_ids), dtype=np.int64, count=query_start_loc[-1])
        logits_indices = query_start_loc[1:][[s.samples for s in scheduled]] - 1
        metadata = self._attention_metadata(query_start_loc, seq_lens, block_tables, slot_mapping)
        return ModelInputs(self._device_tensor(input_ids), self._device_tensor(positions), metadata,
                           self._device_tensor(logits_indices))

    def _block_tables(self, scheduler_output: SchedulerOutput, seq_lens: np.ndarray) -> np.ndarray:
        """int64 [B, max_blocks], padded with block 0."""
        scheduled = scheduler_output.scheduled
        width = max((len(s.block_ids) for s in scheduled), default=0) or 1
        block_tables = np.zeros((len(scheduled), width), dtype=np.int64)
        for i, s in enumerate(scheduled):
            if len(s.block_ids) * self.block_size < seq_lens[i]:
                raise ValueError(
                    f"request {s.request_id}: {len(s.block_ids)} blocks of {self.block_size} tokens "
                    f"cannot hold {seq_lens[i]} tokens"
                )
            block_tables[i, : len(s.block_ids)] = s.block_ids
        return block_tables

    def _device_tensor(self, array: np.ndarray, dtype: torch.dtype = torch.int64) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array)).to(device=self.device, dtype=dtype)

    def _attention_metadata(
        self, query_start_loc: np.ndarray, seq_lens: np.ndarray, block_tables: np.ndarray, slot_mapping: np.ndarray
    ) -> AttentionMetadata:
        query_start_loc_cpu = torch.from_numpy(query_start_loc).to(torch.int32)
        seq_lens_cpu = torch.from_numpy(seq_lens).to(torch.int32)
        return AttentionMetadata(
            query_start_loc=query_start_loc_cpu.to(self.device),
            seq_lens=seq_lens_cpu.to(self.device),
            block_tables=self._device_tensor(block_tables, torch.int32),
            slot_mapping=self._device_tensor(slot_mapping),
            max_query_len=int(np.diff(query_start_loc).max(initial=0)),
            max_seq_len=int(seq_lens.max(initial=0)),
            query_start_loc_cpu=query_start_loc_cpu,
            seq_lens_cpu=seq_lens_cpu,
        )

    @torch.inference_mode()
    def _forward(self, scheduler_output: SchedulerOutput) -> tuple[torch.Tensor, ModelInputs]:
        inputs = self.prepare_inputs(scheduler_output)
        hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.attn_metadata)
        return hidden, inputs

    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput) -> torch.Tensor:
        """Run one step: write the K/V of every scheduled token into the cache and return the
        logits [num_sampling_requests, vocab] (model dtype) of the requests whose ``samples`` is
        True, in scheduled order (an empty [0, vocab] tensor when none samples)."""
        hidden, inputs = self._forward(scheduler_output)
        return self.model.compute_logits(hidden[inputs.logits_indices])

    @torch.inference_mode()
    def execute_model_with_prompt_logits(
        self, scheduler_output: SchedulerOutput, request_ids: Collection[str]
    ) -> ModelStepOutput:
        """As ``execute_model``, and also the logits of every new token of the requests in
        ``request_ids`` (for prompt logprobs; see ``ModelStepOutput``)."""
        hidden, inputs = self._forward(scheduler_output)
        logits = self.model.compute_logits(hidden[inputs.logits_indices])
        starts = inputs.attn_metadata.query_start_loc_cpu.tolist()
        prompt_logits = {
            s.request_id: self.model.compute_logits(hidden[starts[i] : starts[i + 1]])
            for i, s in enumerate(scheduler_output.scheduled)
            if s.request_id in request_ids
        }
        return ModelStepOutput(logits, prompt_logits)
