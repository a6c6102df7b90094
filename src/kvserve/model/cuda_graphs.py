"""Decode steps replayed from CUDA graphs, one per batch-size bucket (vLLM's capture sizes).

A decode step on a GPU launches some fifteen kernels per layer; at small batches their launch
cost, paid by the CPU one kernel at a time, exceeds the GPU's work. A CUDA graph records the whole
forward once per bucket and replays it with one launch. A step is replayed when every request
computes one token (no prefill chunk, no draft tokens to verify) and the batch fits the largest
bucket; others run eagerly (``--enforce-eager`` runs every step eagerly).

The graphs read their inputs from static buffers: a step's tokens, positions, sequence lengths,
block tables and cache slots are copied into the first ``n`` rows; rows ``n..bucket`` are padding
(token 0 at position 0, one token of context, slot -1: the KV write skips it), their outputs
dropped. Each row's result depends only on its own inputs (the batch-invariance rule of the
kernels), so a padded replay gives the bits of the eager step.

Capture needs a forward without host synchronisation: the Triton attention backend (the torch
backend loops over requests in Python) and no data-dependent shapes: a mixture-of-experts layer
is captured when its experts run in Triton's grouped GEMMs (``kernels/triton_moe.py``, whose
layout of the tokens by expert has a size fixed by the batch size), else its steps stay eager.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from kvserve.attention.backend import AttentionBackend, AttentionMetadata
from kvserve.model.model_inputs import ModelInputs
from kvserve.model.moe import SparseMoeBlock

# vLLM's default capture sizes: 1, 2, 4, then every multiple of 8 up to 512.
CAPTURE_SIZES = (1, 2, 4, *range(8, 513, 8))

# (forward) -> (replay, output): records ``forward`` and returns what replays it and the tensor the
# replay writes. ``capture_cuda_graph`` on a GPU; the tests pass an eager stand-in.
Capturer = Callable[[Callable[[], torch.Tensor]], tuple[Callable[[], None], torch.Tensor]]


def capture_sizes(max_num_seqs: int) -> list[int]:
    """The buckets for at most ``max_num_seqs`` requests per step (the last one covers them all)."""
    largest = min(max_num_seqs, CAPTURE_SIZES[-1])
    return [size for size in CAPTURE_SIZES if size < largest] + [largest]


def capture_cuda_graph(forward: Callable[[], torch.Tensor], pool=None) -> tuple[Callable[[], None], torch.Tensor]:
    """Record ``forward`` in a CUDA graph (after two warm-up runs on a side stream, as torch's
    documentation asks); ``pool``: a memory pool the graphs share."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            forward()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        output = forward()
    return graph.replay, output


def why_not_captured(model: nn.Module, dtype: torch.dtype, device: torch.device) -> str | None:
    """None when the decode forward of ``model`` (activations of ``dtype`` on ``device``) can be
    captured, else why not."""
    backends = {module.backend.name for module in model.modules() if isinstance(getattr(module, "backend", None),
                                                                                AttentionBackend)}
    if backends != {"triton"}:
        return f"attention backend {', '.join(sorted(backends)) or 'none'} (graphs need triton's)"
    for module in model.modules():
        if isinstance(module, SparseMoeBlock) and module.expert_tables(dtype, device) is None:
            return "mixture-of-experts layers whose experts are not in Triton's grouped GEMMs"
    return None


class DecodeGraphs:
    """Captured decode forwards of ``model``, one per size in ``sizes``.

    Args:
        model: the decoder (``model(input_ids, positions, kv_caches, metadata) -> hidden``).
        kv_caches: the runner's caches (the graphs read and write them in place).
        sizes: bucket sizes, ascending.
        max_model_len: most tokens of one request.
        block_size: tokens per KV block.
        device: the model's device.
        capturer: records one forward (``capture_cuda_graph`` on a GPU).
    """

    def __init__(self, model: nn.Module, kv_caches: list[torch.Tensor], sizes: list[int], max_model_len: int,
                 block_size: int, device: torch.device, capturer: Capturer):
        self.sizes = sorted(sizes)
        self.max_model_len = max_model_len
        largest = self.sizes[-1]
        self.input_ids = torch.zeros(largest, dtype=torch.int64, device=device)
        self.positions = torch.zeros(largest, dtype=torch.int64, device=device)
        self.query_start_loc = torch.arange(largest + 1, dtype=torch.int32, device=device)  # one token each
        self.seq_lens = torch.ones(largest, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(largest, math.ceil(max_model_len / block_size), dtype=torch.int32,
                                        device=device)
        self.slot_mapping = torch.full((largest,), -1, dtype=torch.int64, device=device)
        self._replays: dict[int, tuple[Callable[[], None], torch.Tensor]] = {}
        for size in reversed(self.sizes):  # the largest first: the smaller ones reuse its memory
            metadata = self._metadata(size)
            self._replays[size] = capturer(
                lambda size=size, metadata=metadata: model(self.input_ids[:size], self.positions[:size], kv_caches,
                                                           metadata))

    def _metadata(self, size: int) -> AttentionMetadata:
        query_start_loc_cpu = torch.arange(size + 1, dtype=torch.int32)
        return AttentionMetadata(
            query_start_loc=self.query_start_loc[:size + 1], seq_lens=self.seq_lens[:size],
            block_tables=self.block_tables[:size], slot_mapping=self.slot_mapping[:size], max_query_len=1,
            max_seq_len=self.max_model_len, query_start_loc_cpu=query_start_loc_cpu,
            seq_lens_cpu=torch.ones(size, dtype=torch.int32))

    def handles(self, inputs: ModelInputs) -> bool:
        """Whether this step replays a graph: one token per request, at most the largest bucket."""
        metadata = inputs.attn_metadata
        return (inputs.token_type_ids is None and metadata.max_query_len == 1
                and inputs.input_ids.shape[0] == metadata.num_requests <= self.sizes[-1]
                and metadata.block_tables.shape[1] <= self.block_tables.shape[1])

    def bucket(self, num_tokens: int) -> int:
        return next(size for size in self.sizes if size >= num_tokens)

    def __call__(self, inputs: ModelInputs) -> torch.Tensor:
        """The step's hidden states [n, hidden], from the replay of its bucket's graph."""
        n = inputs.input_ids.shape[0]
        size = self.bucket(n)
        metadata = inputs.attn_metadata
        self.input_ids[:n].copy_(inputs.input_ids)
        self.positions[:n].copy_(inputs.positions)
        self.seq_lens[:n].copy_(metadata.seq_lens)
        self.block_tables[:n, :metadata.block_tables.shape[1]].copy_(metadata.block_tables)
        self.slot_mapping[:n].copy_(metadata.slot_mapping)
        if size > n:  # padding rows: one token at position 0, written nowhere
            self.input_ids[n:size].zero_()
            self.positions[n:size].zero_()
            self.seq_lens[n:size].fill_(1)
            self.slot_mapping[n:size].fill_(-1)
        replay, output = self._replays[size]
        replay()
        return output[:n]
