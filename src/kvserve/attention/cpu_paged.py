"""A fast paged-attention backend for CPUs: a small C++ kernel (``kvserve/kernels/csrc/paged_attention.cpp``)
that reads each request's K/V in place from the block cache.

Why: the reference backend gathers every request's whole context into a new tensor each step and,
to stay batch-invariant, makes one SDPA call per distinct context length; at batch 32 on the
Qwen2.5-0.5B shape that was about half of a decode step (768 SDPA calls, 24 layers x 32 lengths,
plus the gathers; see ``docs/benchmarks.md``). The kernel instead runs one task per (tile of up
to 8 query rows of a request, KV head), walks the request's blocks in order of absolute position
with an online softmax in float32 and never reads a padded or masked slot::

    request r, KV head g:   block_table[r] = [b0, b1, b2]      seq_len = 37, block_size = 16
                            K/V rows read:   b0[0:16] b1[0:16] b2[0:5]   (nothing else, no copy)

so a request's result never depends on the rest of the batch (batch invariance by construction).

Every query row goes through the kernel by default, prefill chunks included: a row's result
then depends only on its position and the K/V values, not on how the prompt was chunked or how
much of it came from the prefix cache (with bfloat16 weights, where SDPA's blocked kernels round
differently for different chunkings, this is what keeps a prefix-cache hit from changing a
sampled token). In bfloat16 on CPUs with AVX512-BF16 the kernel uses ``vdpbf16ps`` for q.K and
P.V (see the C++ source header); on CPUs with AMX-BF16 tiles it runs both products on the tiles
instead (``attend_tile_amx``: other bits than the vector path's, the same for every way a row is
computed; ``KVSERVE_AMX=0`` keeps the vector path, as for the linears). ``max_kernel_query_len``
sends longer queries to per-request SDPA instead (the reference path). The kernel is built
on first use (``kvserve.kernels``); ``cpu_paged_available()`` says whether that worked,
and ``get_attention_backend("auto")`` falls back to the portable torch backend when it did not.
"""

from __future__ import annotations

import torch

from kvserve.attention.backend import AttentionBackend, AttentionMetadata
from kvserve.attention.torch_backend import Softmax, TorchAttentionBackend, _varlen_attention, write_kv_cache
from kvserve.errors import ConfigError
from kvserve.kernels import cpu_kernels_available, kernels_for

MAX_GROUP, MAX_HEAD_DIM = 16, 256  # kMaxGroup, kMaxHeadDim in the C++ source


def cpu_paged_available() -> bool:
    """True when the C++ kernel builds and loads on this machine (first call compiles, ~1 min)."""
    return cpu_kernels_available()


class CpuPagedAttentionBackend(AttentionBackend):
    """Paged attention with the C++ kernel for short queries (see module docstring).

    Args:
        max_kernel_query_len: requests with at most this many new tokens use the kernel (default:
            all); longer ones use per-request SDPA as the reference backend does.
        amx: bfloat16 on AMX tiles: None (default) where the CPU has them, False never (the
            AVX512-BF16 vector path), True required.

    Raises:
        RuntimeError: at construction, when the kernel cannot be built (use
            ``get_attention_backend("auto")`` for a silent fallback).
        ValueError: ``amx=True`` on a CPU (or process) without AMX-BF16 tiles.
    """

    name = "cpu_paged"

    def __init__(self, max_kernel_query_len: int = 1 << 30, amx: bool | None = None):
        self._ops = kernels_for("cpu")
        if self._ops is None:
            raise ConfigError("--attention-backend cpu_paged: its C++ kernel could not be built here (see the log); "
                              "use --attention-backend torch or auto")
        if amx and not self._ops.amx_linear_available():
            raise ValueError("amx=True: this CPU (or process) has no AMX-BF16 tiles")
        self.max_kernel_query_len = max_kernel_query_len
        self.kernel_amx = -1 if amx is None else int(amx)  # the kernel's amx argument: -1 auto, 0 never, 1 required
        self._reference = TorchAttentionBackend()

    @staticmethod
    def supports(num_heads: int, num_kv_heads: int, head_dim: int, device: torch.device) -> bool:
        """Shapes the kernel handles (others go to the reference backend): CPU tensors, at most
        ``MAX_GROUP`` query heads per KV head and ``head_dim <= MAX_HEAD_DIM`` (its stack buffers)."""
        group = num_heads // num_kv_heads
        return device.type == "cpu" and group <= MAX_GROUP and head_dim <= MAX_HEAD_DIM

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
        *,
        scale: float,
        sliding_window: int | None = None,
        softcap: float = 0.0,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if not self.supports(query.shape[1], kv_cache.shape[3], query.shape[2], query.device):
            return self._reference.forward(query, key, value, kv_cache, metadata, scale=scale,
                                           sliding_window=sliding_window, softcap=softcap, sinks=sinks)
        if (kv_cache.dtype == key.dtype == value.dtype and key.stride(-1) == 1 and value.stride(-1) == 1
                and metadata.slot_mapping.dtype == torch.int64):
            self._ops.write_kv_cache(key, value, kv_cache, metadata.slot_mapping)
        else:  # one-byte caches quantize their rows
            write_kv_cache(key, value, kv_cache, metadata.slot_mapping)
        query = query.contiguous()
        out = torch.empty_like(query)
        self._ops.paged_attention(
            out, query, kv_cache, metadata.block_tables, metadata.seq_lens_cpu, metadata.query_start_loc_cpu,
            scale, sliding_window or 0, self.max_kernel_query_len, self.kernel_amx, softcap,
            None if sinks is None else sinks.float().contiguous(),
        )
        if metadata.max_query_len > self.max_kernel_query_len:  # the rest: per-request SDPA
            _varlen_attention(query, kv_cache, metadata, scale, sliding_window, Softmax(softcap, sinks), out=out,
                              min_query_len=self.max_kernel_query_len + 1)
        return out
