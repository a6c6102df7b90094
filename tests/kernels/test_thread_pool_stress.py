"""Trying to break the kernels' worker pool (``csrc/thread_pool.h``).

``pool_self_check`` (C++, without the GIL) runs thousands of tiny regions with random sizes,
offsets, grains and thread counts (up and down between regions), some nested, some after a pause
long enough for the workers to fall asleep, some throwing from one item, and counts the faults it
sees: an item run other than once, a run outside its region or after its region returned (a late
worker on stale parameters), a nested region not run inline, an exception lost. It runs from one
and from two threads at once (one holds the pool, the other's regions run inline), on the pool
and on OpenMP's threads, and in a forked child of a process whose pool has workers.

Then every kernel with a parallel region (linears, quantized linears int8/int4 on the vector and
AMX paths, paged attention decode and prefill, LoRA, argmax, the elementwise kernels, the token
bitmask) gives, with the pool and any thread count, the bits of a one-thread run."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch
from torch import nn

from kvserve.kernels import cpu_kernels, cpu_kernels_available

pytestmark = pytest.mark.skipif(not cpu_kernels_available(), reason="no C++ compiler for the kernels")

# pool_self_check's fault counts: items run other than once, runs outside their region or after it
# returned, nested regions not run inline, exceptions lost or changed.
NO_FAULTS = [0, 0, 0, 0]


@pytest.fixture
def kernels():
    """The kernels with the pool on; the pool's settings and torch's thread count restored."""
    module = cpu_kernels()
    enabled, spin_us, threads = module.pool_enabled(), module.pool_spin_us(), torch.get_num_threads()
    module.set_pool_enabled(True)
    yield module
    module.set_pool_enabled(enabled)
    module.set_pool_spin_us(spin_us)
    torch.set_num_threads(threads)


@pytest.mark.parametrize("spin_us", [0, 200])
@pytest.mark.parametrize("enabled", [True, False])
def test_random_regions_on_one_caller(kernels, enabled, spin_us):
    kernels.set_pool_enabled(enabled)
    kernels.set_pool_spin_us(spin_us)
    assert kernels.pool_self_check(4000, 1, 6, 0) == NO_FAULTS
    assert kernels.pool_self_check(2000, 2, 6, 10) == NO_FAULTS  # one region in ten throws


@pytest.mark.parametrize("enabled", [True, False])
def test_random_regions_from_two_threads_at_once(kernels, enabled):
    kernels.set_pool_enabled(enabled)
    faults: dict[int, list[int]] = {}

    def check(seed: int) -> None:
        faults[seed] = kernels.pool_self_check(4000, seed, 5, 15)

    callers = [threading.Thread(target=check, args=(seed,)) for seed in (11, 12)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(timeout=120)
    assert faults == {11: NO_FAULTS, 12: NO_FAULTS}


def _wait(pid: int, seconds: float) -> int | None:
    """The child's exit status, or None (the child killed) when it has not ended in time."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def test_a_forked_child_gets_a_pool_of_its_own(kernels):
    """The parent's pool has workers (which the child does not inherit); the child's regions must
    neither hang on them nor lose items, and a real kernel gives the parent's bits."""
    torch.set_num_threads(3)
    assert kernels.pool_self_check(300, 3, 3, 0) == NO_FAULTS
    linear = _linear(torch.bfloat16)
    x = torch.randn(16, 256, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    with torch.no_grad():
        expected = linear(x)
    pid = os.fork()
    if pid == 0:  # the child: report by exit code only, never return into pytest
        code = 1
        try:
            with torch.no_grad():
                same = torch.equal(_bits(linear(x)), _bits(expected))
            code = 0 if kernels.pool_self_check(1000, 5, 3, 10) == NO_FAULTS and same else 2
        finally:
            os._exit(code)
    assert _wait(pid, 60) == 0


# -- real kernels: the pool with any thread count gives the one-thread bits ---------------------

def _bits(t: torch.Tensor) -> torch.Tensor:
    if t.dtype in (torch.bfloat16, torch.float16):
        return t.view(torch.int16)
    if t.dtype == torch.float32:
        return t.view(torch.int32)
    return t


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _linear(dtype: torch.dtype):
    from kvserve.model.invariant_linear import InvariantLinear

    torch.manual_seed(0)
    layer = nn.Linear(256, 384, bias=True)
    return InvariantLinear(layer.to(dtype), cpu_kernels())


def _case_linear():
    layers = [_linear(torch.bfloat16), _linear(torch.float32)]
    inputs = [torch.randn(rows, 256, generator=_generator(rows)) for rows in (1, 5, 40)]

    def run():
        with torch.no_grad():
            return [layer(x.to(layer.weight_dtype)) for layer in layers for x in inputs]
    return run


def _case_quantized(method: str, group_size: int, amx: bool | None):
    from kvserve.model.quant_linear import QuantizedLinear, quantize_weight

    kernels = cpu_kernels()
    if amx is None and not kernels.amx_linear_available():
        pytest.skip("no AMX tiles here")
    weight = torch.randn(384, 256, generator=_generator(7))
    bias = torch.randn(384, generator=_generator(8))
    layer = QuantizedLinear(quantize_weight(weight, method, group_size), bias, kernels, amx=False if amx is False else None)
    assert layer.amx == (amx is None)
    inputs = [torch.randn(rows, 256, generator=_generator(rows)) for rows in (1, 5, 40)]
    dtypes = (torch.bfloat16,) if amx is None else (torch.bfloat16, torch.float32)

    def run():
        with torch.no_grad():
            return [layer(x.to(dtype)) for dtype in dtypes for x in inputs]
    return run


def _case_paged_attention(dtype: torch.dtype, prefill: bool):
    kernels = cpu_kernels()
    heads, kv_heads, dim, block = 4, 2, 64, 16
    contexts, q_lens = [40, 70, 5, 23], ([8, 20, 5, 1] if prefill else [1, 1, 1, 1])
    seq_lens = [c + q for c, q in zip(contexts, q_lens)]
    width = (max(seq_lens) + block - 1) // block
    num_blocks = width * len(seq_lens) + 1
    g = _generator(9)
    kv_cache = torch.randn(2, num_blocks, block, kv_heads, dim, generator=g).to(dtype)
    tables = torch.randperm(num_blocks - 1, generator=g)[: width * len(seq_lens)].add(1)
    tables = tables.reshape(len(seq_lens), width).to(torch.int32).contiguous()
    starts = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    tokens = sum(q_lens)
    query = torch.randn(tokens, heads, dim, generator=g).to(dtype)
    lens = torch.tensor(seq_lens, dtype=torch.int32)

    def run():
        out = torch.zeros(tokens, heads, dim, dtype=dtype)
        kernels.paged_attention(out, query, kv_cache, tables, lens, starts, dim**-0.5, 0, max(q_lens))
        return [out]
    return run


def _case_lora(dtype: torch.dtype):
    kernels = cpu_kernels()
    g = _generator(10)
    tokens, k, n, rank, slots = 12, 64, 96, 8, 3
    shard_offsets = torch.tensor([0, 48, 96])
    x = torch.randn(tokens, k, generator=g).to(dtype)
    y0 = torch.randn(tokens, n, generator=g).to(dtype)
    a = torch.randn(slots, k, 2 * rank, generator=g).to(dtype)
    b = torch.randn(slots, rank, n, generator=g).to(dtype)
    order = torch.tensor([0, 3, 6, 2, 5, 7, 9, 11, 1])
    seg_starts, seg_slots = torch.tensor([0, 3, 7, 9]), torch.tensor([0, 2, 1])

    def run():
        y = y0.clone()
        kernels.lora_apply(x, y, a, b, order, seg_starts, seg_slots, shard_offsets, rank)
        return [y]
    return run


def _case_small_kernels():
    kernels = cpu_kernels()
    g = _generator(11)
    logits = torch.randn(7, 3000, generator=g)
    gate_up = torch.randn(40, 512, generator=g)
    x, residual, weight = (torch.randn(40, 384, generator=g), torch.randn(40, 384, generator=g),
                           torch.randn(384, generator=g))
    rot = torch.randn(40, 4, 64, generator=g).to(torch.bfloat16)
    cos, sin = torch.randn(40, 64, generator=g).to(torch.bfloat16), torch.randn(40, 64, generator=g).to(torch.bfloat16)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (7, 94), generator=g, dtype=torch.int32)
    rows = torch.tensor([6, 0, 3, 2, 5])

    def run():
        out = [kernels.argmax_rows(logits), kernels.argmax_rows(logits.to(torch.bfloat16))]
        for dtype in (torch.float32, torch.bfloat16):
            out.append(kernels.silu_and_mul(gate_up.to(dtype)))
            out.extend(kernels.rms_norm(x.to(dtype), weight.to(dtype), residual.to(dtype), 1e-6))
        out.append(kernels.rotary_embedding(rot, cos, sin))
        masked = logits.clone()
        kernels.apply_token_bitmask(masked, bitmask, rows)
        return out + [masked]
    return run


CASES = {
    "linear": _case_linear,
    "int8-vector": lambda: _case_quantized("int8", 256, False),
    "int4-g32-vector": lambda: _case_quantized("int4", 32, False),
    "int8-amx": lambda: _case_quantized("int8", 256, None),
    "int4-g64-amx": lambda: _case_quantized("int4", 64, None),
    "attention-decode-bf16": lambda: _case_paged_attention(torch.bfloat16, False),
    "attention-prefill-bf16": lambda: _case_paged_attention(torch.bfloat16, True),
    "attention-decode-f32": lambda: _case_paged_attention(torch.float32, False),
    "attention-prefill-f32": lambda: _case_paged_attention(torch.float32, True),
    "lora-f32": lambda: _case_lora(torch.float32),
    "lora-bf16": lambda: _case_lora(torch.bfloat16),
    "argmax-elementwise-bitmask": _case_small_kernels,
}


@pytest.mark.parametrize("case", list(CASES))
def test_kernels_give_the_one_thread_bits_on_the_pool(kernels, case):
    run = CASES[case]()
    torch.set_num_threads(1)
    reference = run()
    for spin_us in (0, 200):
        kernels.set_pool_spin_us(spin_us)
        for threads in (2, 5, 3, 8, 2):  # up and down
            torch.set_num_threads(threads)
            for _ in range(2):
                outputs = run()
                assert len(outputs) == len(reference)
                for out, ref in zip(outputs, reference):
                    assert out.dtype == ref.dtype and torch.equal(_bits(out), _bits(ref)), (case, threads, spin_us)
