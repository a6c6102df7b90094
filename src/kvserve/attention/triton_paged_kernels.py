"""The Triton kernels of :mod:`kvserve.attention.triton_paged` (imported by it at first use)."""

import triton
import triton.language as tl


@triton.jit
def write_kv_kernel(key_ptr, value_ptr, cache_ptr, slots_ptr, stride_kt, stride_kh, stride_vt, stride_vh,
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
def _row(t, query_start_ptr, token_request_ptr, seq_lens_ptr, window, BLOCK_SIZE: tl.constexpr,
         PARTITION_BLOCKS: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """(request, position, first block, last block, first partition) of token ``t``: the
    blocks it reads and the partition of its first block."""
    r = tl.load(token_request_ptr + t)
    q_start = tl.load(query_start_ptr + r)
    q_len = tl.load(query_start_ptr + r + 1) - q_start
    pos = tl.load(seq_lens_ptr + r) - q_len + (t - q_start)
    first = 0
    if HAS_WINDOW:
        first = tl.maximum(pos - window + 1, 0) // BLOCK_SIZE
    return r, pos, first, pos // BLOCK_SIZE, first // PARTITION_BLOCKS


@triton.jit
def _partition(q, cache_ptr, block_tables_ptr, r, h, pos, lo, hi, scale, softcap, window, stride_c, stride_cb,
               stride_cs, stride_ch, stride_bt, GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr,
               HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
               HAS_WINDOW: tl.constexpr):
    """Online softmax over blocks ``lo..hi`` of request ``r``'s table for head ``h``: (max
    score, sum of exp(score - max), sum of exp(score - max) * value) in float32."""
    kv_head = h // GROUP
    d = tl.arange(0, HEAD_DIM_PAD)
    dmask = d < HEAD_DIM
    offsets = tl.arange(0, BLOCK_SIZE)
    m = tl.full((), float("-inf"), tl.float32)
    total = tl.zeros((), tl.float32)
    acc = tl.zeros((HEAD_DIM_PAD,), tl.float32)
    for b in range(lo, hi + 1):
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
    return m, total, acc


@triton.jit
def _merge(m, total, acc, m_part, total_part, acc_part):
    """The running softmax (m, total, acc) with one more partition's folded in."""
    m_new = tl.maximum(m, m_part)
    alpha = tl.exp(m - m_new)
    beta = tl.exp(m_part - m_new)
    return m_new, total * alpha + total_part * beta, acc * alpha + acc_part * beta


@triton.jit
def _finish(m, total, acc, out_ptr, sinks_ptr, t, h, stride_ot, stride_oh, HEAD_DIM: tl.constexpr,
            HEAD_DIM_PAD: tl.constexpr, HAS_SINKS: tl.constexpr):
    """The sink's logit added to the denominator where the model has one; the row stored."""
    d = tl.arange(0, HEAD_DIM_PAD)
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + h).to(tl.float32)
        m_new = tl.maximum(m, sink)
        alpha = tl.exp(m - m_new)
        total = total * alpha + tl.exp(sink - m_new)
        acc = acc * alpha
    out = acc / total
    tl.store(out_ptr + t * stride_ot + h * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM)


@triton.jit
def attention_kernel(q_ptr, cache_ptr, out_ptr, block_tables_ptr, seq_lens_ptr, query_start_ptr,
                     token_request_ptr, sinks_ptr, scale, softcap, window,
                     stride_qt, stride_qh, stride_ot, stride_oh, stride_c, stride_cb, stride_cs, stride_ch,
                     stride_bt, GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
                     HEAD_DIM_PAD: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_SINKS: tl.constexpr,
                     HAS_WINDOW: tl.constexpr, PARTITION_BLOCKS: tl.constexpr):
    """One program per (token, head): the token's partitions in order, each merged as it ends."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    r, pos, first, last, first_part = _row(t, query_start_ptr, token_request_ptr, seq_lens_ptr, window,
                                           BLOCK_SIZE, PARTITION_BLOCKS, HAS_WINDOW)
    d = tl.arange(0, HEAD_DIM_PAD)
    q = tl.load(q_ptr + t * stride_qt + h * stride_qh + d, mask=d < HEAD_DIM, other=0.0).to(tl.float32)
    m = tl.full((), float("-inf"), tl.float32)
    total = tl.zeros((), tl.float32)
    acc = tl.zeros((HEAD_DIM_PAD,), tl.float32)
    for part in range(first_part, last // PARTITION_BLOCKS + 1):
        lo = tl.maximum(part * PARTITION_BLOCKS, first)
        hi = tl.minimum(part * PARTITION_BLOCKS + PARTITION_BLOCKS - 1, last)
        m_part, total_part, acc_part = _partition(
            q, cache_ptr, block_tables_ptr, r, h, pos, lo, hi, scale, softcap, window, stride_c, stride_cb,
            stride_cs, stride_ch, stride_bt, GROUP, BLOCK_SIZE, HEAD_DIM, HEAD_DIM_PAD, HAS_SOFTCAP, HAS_WINDOW)
        m, total, acc = _merge(m, total, acc, m_part, total_part, acc_part)
    _finish(m, total, acc, out_ptr, sinks_ptr, t, h, stride_ot, stride_oh, HEAD_DIM, HEAD_DIM_PAD, HAS_SINKS)


@triton.jit
def split_kernel(q_ptr, cache_ptr, parts_ptr, block_tables_ptr, seq_lens_ptr, query_start_ptr,
                 token_request_ptr, scale, softcap, window, stride_qt, stride_qh, stride_pt, stride_ph,
                 stride_pp, stride_c, stride_cb, stride_cs, stride_ch, stride_bt, GROUP: tl.constexpr,
                 BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                 HAS_SOFTCAP: tl.constexpr, HAS_WINDOW: tl.constexpr, PARTITION_BLOCKS: tl.constexpr):
    """One program per (token, head, partition of the token's context): the partition's
    (max, total, acc) stored for ``combine_kernel`` (nothing past the token's last one)."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    i = tl.program_id(2)
    r, pos, first, last, first_part = _row(t, query_start_ptr, token_request_ptr, seq_lens_ptr, window,
                                           BLOCK_SIZE, PARTITION_BLOCKS, HAS_WINDOW)
    part = first_part + i
    if part <= last // PARTITION_BLOCKS:
        d = tl.arange(0, HEAD_DIM_PAD)
        q = tl.load(q_ptr + t * stride_qt + h * stride_qh + d, mask=d < HEAD_DIM, other=0.0).to(tl.float32)
        lo = tl.maximum(part * PARTITION_BLOCKS, first)
        hi = tl.minimum(part * PARTITION_BLOCKS + PARTITION_BLOCKS - 1, last)
        m_part, total_part, acc_part = _partition(
            q, cache_ptr, block_tables_ptr, r, h, pos, lo, hi, scale, softcap, window, stride_c, stride_cb,
            stride_cs, stride_ch, stride_bt, GROUP, BLOCK_SIZE, HEAD_DIM, HEAD_DIM_PAD, HAS_SOFTCAP, HAS_WINDOW)
        row = parts_ptr + t * stride_pt + h * stride_ph + i * stride_pp
        tl.store(row, m_part)
        tl.store(row + 1, total_part)
        tl.store(row + 2 + d, acc_part)


@triton.jit
def combine_kernel(parts_ptr, out_ptr, sinks_ptr, seq_lens_ptr, query_start_ptr, token_request_ptr, window,
                   stride_pt, stride_ph, stride_pp, stride_ot, stride_oh, BLOCK_SIZE: tl.constexpr,
                   HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, HAS_SINKS: tl.constexpr,
                   HAS_WINDOW: tl.constexpr, PARTITION_BLOCKS: tl.constexpr):
    """One program per (token, head): the token's partitions merged in order, as
    ``attention_kernel`` merges them (the same bits)."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    r, pos, first, last, first_part = _row(t, query_start_ptr, token_request_ptr, seq_lens_ptr, window,
                                           BLOCK_SIZE, PARTITION_BLOCKS, HAS_WINDOW)
    d = tl.arange(0, HEAD_DIM_PAD)
    m = tl.full((), float("-inf"), tl.float32)
    total = tl.zeros((), tl.float32)
    acc = tl.zeros((HEAD_DIM_PAD,), tl.float32)
    for i in range(0, last // PARTITION_BLOCKS - first_part + 1):
        row = parts_ptr + t * stride_pt + h * stride_ph + i * stride_pp
        m, total, acc = _merge(m, total, acc, tl.load(row), tl.load(row + 1), tl.load(row + 2 + d))
    _finish(m, total, acc, out_ptr, sinks_ptr, t, h, stride_ot, stride_oh, HEAD_DIM, HEAD_DIM_PAD, HAS_SINKS)
