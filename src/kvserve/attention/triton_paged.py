"""Paged attention in Triton, for NVIDIA GPUs (``--attention-backend triton``; ``auto`` on CUDA when
Triton imports). On a CPU it runs only under Triton's interpreter (``TRITON_INTERPRET=1``), which
is how the tests check it against the torch reference backend.

Two kernels per call::

    write   one program per new token: its K and V rows stored at its slot (none for slot -1,
            the padding rows of a CUDA graph's batch)
    attend  one program per (new token, query head): the token's request's context read block by
            block through the block table, positions <= its own (and inside the sliding window),
            online softmax in float32 (scores soft-capped, the sink logit added to the
            denominator where the model has them), GQA by ``kv head = head // group``

Prefill chunks and decode tokens go through the same kernel, so a mixed step is one launch. A
row's result depends only on its own request (each program walks its context in the same block
order whatever else the batch holds): batch-invariant, as kvserve's CPU kernels are. Not yet:
splitting one long context over several programs (flash-decoding), which would need a fixed split
size to stay batch-invariant; one-byte KV caches (``--kv-cache-dtype int8|fp8``).
"""

from __future__ import annotations


import torch

from kvserve.attention.backend import AttentionBackend, AttentionMetadata
from kvserve.attention.kv_quant import ONE_BYTE_DTYPES
from kvserve.kernels.triton_support import triton_available

# Imported at first use (``_kernels``): Triton decides between its compiler and its interpreter
# (``TRITON_INTERPRET=1``) when it is imported, and a process that never runs these kernels
# need not pay for the import.
triton = tl = None
_KERNELS: tuple | None = None


def triton_refuses(one_byte_kv: bool, block_size: int) -> str | None:
    """Why this backend cannot serve a cache (a one-byte ``--kv-cache-dtype``, a block size that
    is not a power of two), with the fix; None when it can."""
    if one_byte_kv:
        return ("the triton attention backend reads a model-dtype KV cache; --kv-cache-dtype int8/fp8 needs "
                "--attention-backend torch")
    if block_size & (block_size - 1):
        return f"the triton attention backend needs a power-of-two --block-size, got {block_size}"
    return None


def _kernels() -> tuple:
    """The two kernels, defined at first use."""
    global _KERNELS, triton, tl
    if _KERNELS is None:
        import triton
        import triton.language as tl

        _KERNELS = _define_kernels()
    return _KERNELS


def _define_kernels() -> tuple:
    @triton.jit
    def _write_kv_kernel(key_ptr, value_ptr, cache_ptr, slots_ptr, stride_kt, stride_kh, stride_vt, stride_vh,
                         stride_c, stride_cs, stride_ch, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                         HEAD_DIM_PAD: tl.constexpr):
        t = tl.program_id(0)
        slot = tl.load(slots_ptr + t).to(tl.int64)
        d = tl.arange(0, HEAD_DIM_PAD)
        dmask = d < tl.where(slot >= 0, HEAD_DIM, 0)  # slot -1: a CUDA graph's padding row, written nowhere
        for h in range(NUM_KV_HEADS):
            k = tl.load(key_ptr + t * stride_kt + h * stride_kh + d, mask=dmask)
            v = tl.load(value_ptr + t * stride_vt + h * stride_vh + d, mask=dmask)
            tl.store(cache_ptr + slot * stride_cs + h * stride_ch + d, k, mask=dmask)
            tl.store(cache_ptr + stride_c + slot * stride_cs + h * stride_ch + d, v, mask=dmask)

    @triton.jit
    def _attention_kernel(q_ptr, cache_ptr, out_ptr, block_tables_ptr, seq_lens_ptr, query_start_ptr,
                          token_request_ptr, sinks_ptr, scale, softcap, window,
                          stride_qt, stride_qh, stride_ot, stride_oh, stride_c, stride_cb, stride_cs, stride_ch,
                          stride_bt, GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
                          HEAD_DIM_PAD: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_SINKS: tl.constexpr,
                          HAS_WINDOW: tl.constexpr):
        t = tl.program_id(0)
        h = tl.program_id(1)
        r = tl.load(token_request_ptr + t)
        q_start = tl.load(query_start_ptr + r)
        q_len = tl.load(query_start_ptr + r + 1) - q_start
        pos = tl.load(seq_lens_ptr + r) - q_len + (t - q_start)  # this token's position
        kv_head = h // GROUP
        d = tl.arange(0, HEAD_DIM_PAD)
        dmask = d < HEAD_DIM
        q = tl.load(q_ptr + t * stride_qt + h * stride_qh + d, mask=dmask, other=0.0).to(tl.float32)
        offsets = tl.arange(0, BLOCK_SIZE)
        first = 0
        if HAS_WINDOW:
            first = tl.maximum(pos - window + 1, 0) // BLOCK_SIZE
        m = tl.full((), float("-inf"), tl.float32)
        total = tl.zeros((), tl.float32)
        acc = tl.zeros((HEAD_DIM_PAD,), tl.float32)
        for b in range(first, pos // BLOCK_SIZE + 1):
            block = tl.load(block_tables_ptr + r * stride_bt + b).to(tl.int64)
            key_pos = b * BLOCK_SIZE + offsets
            valid = key_pos <= pos
            if HAS_WINDOW:
                valid = valid & (key_pos > pos - window)
            rows = block * stride_cb + offsets[:, None] * stride_cs + kv_head * stride_ch + d[None, :]
            both = valid[:, None] & dmask[None, :]
            k = tl.load(cache_ptr + rows, mask=both, other=0.0).to(tl.float32)
            v = tl.load(cache_ptr + stride_c + rows, mask=both, other=0.0).to(tl.float32)
            s = tl.sum(k * q[None, :], axis=1) * scale
            if HAS_SOFTCAP:  # softcap * tanh(s / softcap), tanh written with exp
                s = softcap * (1.0 - 2.0 / (tl.exp(2.0 * s / softcap) + 1.0))
            s = tl.where(valid, s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=0))
            alpha = tl.exp(m - m_new)
            p = tl.exp(s - m_new)
            total = total * alpha + tl.sum(p, axis=0)
            acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
            m = m_new
        if HAS_SINKS:
            sink = tl.load(sinks_ptr + h).to(tl.float32)
            m_new = tl.maximum(m, sink)
            alpha = tl.exp(m - m_new)
            total = total * alpha + tl.exp(sink - m_new)
            acc = acc * alpha
        out = acc / total
        tl.store(out_ptr + t * stride_ot + h * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=dmask)

    return _write_kv_kernel, _attention_kernel


class TritonPagedAttentionBackend(AttentionBackend):
    """See the module docstring. Stateless."""

    name = "triton"

    def __init__(self):
        if not triton_available():
            raise RuntimeError("the triton attention backend needs the triton package (pip install triton)")

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                metadata: AttentionMetadata, *, scale: float, sliding_window: int | None = None,
                softcap: float = 0.0, sinks: torch.Tensor | None = None) -> torch.Tensor:
        num_tokens, num_heads, head_dim = query.shape
        _, _, block_size, num_kv_heads, _ = kv_cache.shape
        refusal = triton_refuses(kv_cache.dtype in ONE_BYTE_DTYPES, block_size)
        if refusal is not None:
            raise NotImplementedError(refusal)
        write_kv, attention = _kernels()
        pad = triton.next_power_of_2(head_dim)
        write_kv[(num_tokens,)](
            key, value, kv_cache, metadata.slot_mapping, key.stride(0), key.stride(1), value.stride(0),
            value.stride(1), kv_cache.stride(0), kv_cache.stride(2), kv_cache.stride(3),
            NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, HEAD_DIM_PAD=pad)
        out = torch.empty_like(query)
        lengths = metadata.query_start_loc[1:] - metadata.query_start_loc[:-1]
        token_request = torch.repeat_interleave(torch.arange(metadata.num_requests, device=query.device,
                                                             dtype=torch.int32), lengths, output_size=num_tokens)
        block_tables = metadata.block_tables
        attention[(num_tokens, num_heads)](
            query, kv_cache, out, block_tables, metadata.seq_lens, metadata.query_start_loc, token_request,
            sinks if sinks is not None else query, scale, float(softcap), int(sliding_window or 0),
            query.stride(0), query.stride(1), out.stride(0), out.stride(1), kv_cache.stride(0), kv_cache.stride(1),
            kv_cache.stride(2), kv_cache.stride(3), block_tables.stride(0),
            GROUP=num_heads // num_kv_heads, BLOCK_SIZE=block_size, HEAD_DIM=head_dim, HEAD_DIM_PAD=pad,
            HAS_SOFTCAP=bool(softcap), HAS_SINKS=sinks is not None, HAS_WINDOW=sliding_window is not None)
        return out
