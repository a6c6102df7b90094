"""The device memory a step's activations take at most, measured before the KV cache is sized.

``--gpu-memory-utilization`` has vLLM's meaning: the share of the GPU's memory this engine may
hold in all, weights, activations, CUDA graphs and KV cache together. The weights are loaded when
the cache is planned; the activations are not. This runs the largest step the scheduler can make
(``max_num_batched_tokens`` tokens, as requests of at most ``max_model_len``, then the logits of
``max_num_seqs`` rows, times 1 + the draft tokens verified per step) against a scratch KV cache
just large enough for it, and reports the peak allocation above what was held before (the
scratch cache excluded). The KV cache gets the rest, less a margin for CUDA
graphs and the libraries' workspaces (:data:`GRAPH_AND_WORKSPACE_BYTES`).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from kvserve.model.kv_cache_layout import allocate_kv_caches
from kvserve.model.loader import LoadedModel
from kvserve.model.model_inputs import make_flat_batch, to_model_inputs

# Kept free beside the measured peak: the decode graphs' shared pool (decode batches are small
# next to the profiled prefill) and cuBLAS / Triton workspaces.
GRAPH_AND_WORKSPACE_BYTES = 512 * 2**20


@torch.inference_mode()
def profile_step(loaded: LoadedModel, num_tokens: int, max_model_len: int, num_rows: int, block_size: int,
                 kv_cache_dtype: str, device: torch.device) -> int:
    """Run the largest step once: ``num_tokens`` tokens, as requests of at most ``max_model_len``,
    through the model into a scratch KV cache, then the logits of ``num_rows`` of them (in
    float32, as the sampler takes them). Nothing of the engine's state is touched. Returns the
    scratch cache's bytes."""
    lengths = [min(max_model_len, num_tokens - start) for start in range(0, num_tokens, max_model_len)]
    blocks = [math.ceil(length / block_size) for length in lengths]
    caches = allocate_kv_caches(loaded.arch, sum(blocks) + 1, block_size, kv_cache_dtype, loaded.dtype, device,
                                loaded.cached_kv_heads)
    table = np.zeros((len(lengths), max(blocks)), dtype=np.int64)
    first = 1  # block 0 is the null block
    for row, count in enumerate(blocks):
        table[row, :count] = np.arange(first, first + count)
        first += count
    flat = make_flat_batch(np.zeros((len(lengths), max(lengths)), dtype=np.int64), np.zeros(len(lengths), np.int64),
                           np.array(lengths), table, block_size, np.zeros(len(lengths), dtype=bool))
    inputs = to_model_inputs(flat, device)
    hidden = loaded.model(inputs.input_ids, inputs.positions, caches, inputs.attn_metadata)
    rows = torch.arange(min(num_rows, num_tokens), device=device)
    loaded.model.compute_logits(hidden[rows]).float().softmax(dim=-1)
    return sum(cache.numel() * cache.element_size() for cache in caches)


def peak_activation_bytes(loaded: LoadedModel, num_tokens: int, max_model_len: int, num_rows: int, block_size: int,
                          kv_cache_dtype: str, device: torch.device) -> int:
    """Bytes :func:`profile_step` allocated at its peak above what was held before it, its scratch
    KV cache excluded (CUDA only: its allocator counts them)."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    scratch_bytes = profile_step(loaded, num_tokens, max_model_len, num_rows, block_size, kv_cache_dtype, device)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before - scratch_bytes
    torch.cuda.empty_cache()
    return max(0, peak)
