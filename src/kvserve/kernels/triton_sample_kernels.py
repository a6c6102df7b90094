"""The Triton kernels of :mod:`kvserve.kernels.triton_sample` (imported by it at first use: Triton
decides between its compiler and its interpreter when it is imported, and a ``@triton.jit``
function calls only functions of its own module).

Every kernel runs one program per logits row and walks the row in blocks of ``BLOCK`` positions,
in the same order whatever the batch holds, so a row's result depends only on its own values.
"""

import triton
import triton.language as tl


@triton.jit
def load_block(row_ptr, start, vocab, temperature, BLOCK: tl.constexpr, SCALE: tl.constexpr):
    """Positions ``[start, start + BLOCK)`` of a row and their values in float32 (-inf past the
    vocabulary), divided by ``temperature`` when SCALE: correctly rounded, as torch's division
    (Triton's ``/`` is an approximate division on NVIDIA GPUs)."""
    idx = start + tl.arange(0, BLOCK)
    x = tl.load(row_ptr + idx, mask=idx < vocab, other=float("-inf")).to(tl.float32)
    if SCALE:
        x = tl.math.div_rn(x, temperature)
    return idx, x


@triton.jit
def order_key(v):
    """A float32 as an int64 in the same order (-inf < ... < +0 == -0 < ... < +inf): the two zeros
    share a key, so a key's neighbour is always another value."""
    bits = v.to(tl.int32, bitcast=True).to(tl.int64)
    return tl.where(bits >= 0, bits, -(bits + 2147483648))


@triton.jit
def from_order_key(key):
    bits = tl.where(key >= 0, key, -key - 2147483648)
    return bits.to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def argmax_kernel(logits_ptr, out_ptr, vocab, BLOCK: tl.constexpr):
    """Per lane (position mod BLOCK) its largest value and first index of it, and its first NaN;
    then the smallest index among the lanes holding the row's maximum."""
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * vocab
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_index = tl.arange(0, BLOCK)
    first_nan = tl.full([BLOCK], vocab, tl.int32)
    for start in range(0, vocab, BLOCK):
        idx, x = load_block(row_ptr, start, vocab, 1.0, BLOCK, False)
        nan = x != x
        first_nan = tl.minimum(first_nan, tl.where(nan, idx, vocab))
        x = tl.where(nan, float("-inf"), x)
        best_index = tl.where(x > best, idx, best_index)  # strict: a lane keeps its first maximum
        best = tl.maximum(best, x)
    row_best = tl.max(best, 0)
    index = tl.min(tl.where(best == row_best, best_index, vocab), 0)
    nan_index = tl.min(first_nan, 0)
    tl.store(out_ptr + row, tl.where(nan_index < vocab, nan_index, index).to(tl.int64))


@triton.jit
def row_range(row_ptr, vocab, temperature, BLOCK: tl.constexpr, SCALE: tl.constexpr):
    """A row's largest value and least value above -inf (x, or x / T when SCALE), and whether it
    has a distribution (no NaN, no +inf, not only -inf)."""
    largest = tl.full([BLOCK], float("-inf"), tl.float32)
    lowest = tl.full([BLOCK], float("inf"), tl.float32)
    bad = tl.zeros([BLOCK], tl.int32)
    for start in range(0, vocab, BLOCK):
        idx, x = load_block(row_ptr, start, vocab, temperature, BLOCK, SCALE)
        bad += ((x != x) | (x == float("inf"))).to(tl.int32)
        largest = tl.maximum(largest, tl.where(x == x, x, float("-inf")))
        lowest = tl.minimum(lowest, tl.where(x > float("-inf"), x, float("inf")))
    largest = tl.max(largest, 0)
    return largest, tl.min(lowest, 0), (tl.sum(bad, 0) == 0) & (largest > float("-inf"))


@triton.jit
def sample_kernel(logits_ptr, rows_ptr, temperature_ptr, uniforms_ptr, out_ptr, vocab, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    row_ptr = logits_ptr + tl.load(rows_ptr + i) * vocab
    t = tl.load(temperature_ptr + i)
    # m = max x / T (rounding is monotonic: the largest x / T)
    largest, _, valid = row_range(row_ptr, vocab, t, BLOCK, False)
    m = tl.math.div_rn(largest, t)
    valid = valid & (m < float("inf"))  # a tiny T: no distribution (sample.cpp: V)
    m = tl.where(valid, m, 0.0)
    # total = the blocks' float32 sums of e = exp(x / T - m), added in float64
    total = tl.full([], 0.0, tl.float64)
    last_positive = -1
    for start in range(0, vocab, BLOCK):
        idx, y = load_block(row_ptr, start, vocab, t, BLOCK, True)
        e = tl.exp(y - m)
        total += tl.sum(e, 0).to(tl.float64)
        last_positive = tl.maximum(last_positive, tl.max(tl.where(e > 0, idx, -1), 0))
    target = tl.load(uniforms_ptr + i) * total
    # Up to the first block whose running sum passes the target; in it, the first token with
    # e > 0 whose running float64 sum passes it (else the block's last such token).
    token = last_positive
    running = tl.full([], 0.0, tl.float64)
    start = 0
    searching = valid
    while searching & (start < vocab):
        idx, y = load_block(row_ptr, start, vocab, t, BLOCK, True)
        e = tl.exp(y - m)
        block_sum = tl.sum(e, 0).to(tl.float64)
        passed = tl.cumsum(e.to(tl.float64), 0) + running > target
        first = tl.min(tl.where(passed & (e > 0), idx, vocab), 0)
        last = tl.max(tl.where(e > 0, idx, -1), 0)
        found = running + block_sum > target
        token = tl.where(found, tl.where(first < vocab, first, last), token)
        searching = ~found
        running += block_sum
        start += BLOCK
    tl.store(out_ptr + i, tl.where(valid, token, vocab).to(tl.int64))


@triton.jit
def mass_above(row_ptr, vocab, temperature, m, mid, lo, hi, BLOCK: tl.constexpr, SCALE: tl.constexpr):
    """f(mid), the float32 mass of the positions with l > mid (BLOCK partial sums by position,
    then Triton's tree: a fixed order for a row); the largest l in (lo, mid] and the smallest in
    (mid, hi]."""
    mass = tl.zeros([BLOCK], tl.float32)
    below = tl.full([BLOCK], float("-inf"), tl.float32)
    above = tl.full([BLOCK], float("inf"), tl.float32)
    for start in range(0, vocab, BLOCK):
        idx, l = load_block(row_ptr, start, vocab, temperature, BLOCK, SCALE)
        mass += tl.where(l > mid, tl.exp(l - m), 0.0)
        below = tl.maximum(below, tl.where((l > lo) & (l <= mid), l, float("-inf")))
        above = tl.minimum(above, tl.where((l > mid) & (l <= hi), l, float("inf")))
    return tl.sum(mass, 0), tl.max(below, 0), tl.min(above, 0)


@triton.jit
def top_p_kernel(logits_ptr, rows_ptr, top_p_ptr, temperature_ptr, vocab, BLOCK: tl.constexpr, SCALE: tl.constexpr):
    i = tl.program_id(0)
    row_ptr = logits_ptr + tl.load(rows_ptr + i) * vocab
    t = 1.0
    if SCALE:
        t = tl.load(temperature_ptr + i)
    # l = x / T (or x); a row with a NaN or +inf, or only -inf, is left as it is
    largest, lowest, valid = row_range(row_ptr, vocab, t, BLOCK, SCALE)
    m = tl.where(valid, largest, 0.0)
    total, _, _ = mass_above(row_ptr, vocab, t, m, float("-inf"), 0.0, 0.0, BLOCK, SCALE)
    target = tl.load(top_p_ptr + i) * total
    # Bisection with f(lo) >= target > f(hi), hi always a logit: it ends with hi the smallest
    # logit u with f(u) < target (the same u whichever midpoints it took: f of a set of positions
    # is one fixed sum). Each step moves hi down to the largest logit <= mid or lo up to just
    # below the smallest logit > mid, so it ends once one value is left; midpoints by value on even
    # steps where one lies strictly between (fast on a trained model's logits), else by the float
    # order (which halves the range): at most 64 steps.
    hi = m
    lo = tl.where(valid, from_order_key(order_key(lowest) - 1), from_order_key(order_key(m) - 1))
    before = 0.0  # f(hi)
    step = 0
    while order_key(hi) - order_key(lo) > 1:
        mid = lo + (hi - lo) * 0.5
        mid = tl.where((mid > lo) & (mid < hi) & (step % 2 == 0), mid,
                       from_order_key(order_key(lo) + (order_key(hi) - order_key(lo)) // 2))
        step += 1
        f, below, above = mass_above(row_ptr, vocab, t, m, mid, lo, hi, BLOCK, SCALE)
        inside = f < target
        lo = tl.where(inside, lo, from_order_key(order_key(above) - 1))
        hi = tl.where(inside, below, hi)
        before = tl.where(inside, f, before)
    # Drop every l < u; of the ties at u, in index order, keep the t-th while before + t * e(u) < target.
    e_u = tl.exp(hi - m)
    end = tl.where(valid, vocab, 0)  # a row without a distribution stays as it is
    ties_before = 0
    for start in range(0, vocab, BLOCK):
        idx, l = load_block(row_ptr, start, vocab, t, BLOCK, SCALE)
        tie = l == hi
        rank = tl.cumsum(tie.to(tl.int32), 0) - tie.to(tl.int32) + ties_before
        drop = (l < hi) | (tie & ~(before + rank.to(tl.float32) * e_u < target))
        neg_inf = tl.full([BLOCK], float("-inf"), logits_ptr.dtype.element_ty)
        tl.store(row_ptr + idx, neg_inf, mask=drop & (idx < end))
        ties_before += tl.sum(tie.to(tl.int32), 0)


@triton.jit
def bitmask_kernel(logits_ptr, bitmask_ptr, rows_ptr, stride_row, vocab, width, BLOCK: tl.constexpr):
    row = tl.load(rows_ptr + tl.program_id(0))
    tokens = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    word = tokens // 32
    words = tl.load(bitmask_ptr + row * width + word, mask=(tokens < vocab) & (word < width), other=0)
    banned = ((words >> (tokens % 32)) & 1) == 0
    neg_inf = tl.full([BLOCK], float("-inf"), logits_ptr.dtype.element_ty)
    tl.store(logits_ptr + row * stride_row + tokens, neg_inf, mask=banned & (tokens < vocab))
