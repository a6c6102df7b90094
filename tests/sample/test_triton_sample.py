"""The Triton sampling kernels (kernels/triton_sample.py, run by Triton's interpreter here) against
the C++ ones (kernels/csrc/argmax.cpp, sample.cpp, top_p.cpp, bitmask.cpp) and a float64
reference: argmax exactly torch's, top-p keeping the C++ kernel's set (and the float64 rule's,
except within float rounding of p), draws the C++ kernel's tokens (and the float64 inverse CDF's,
except within rounding of a CDF step), V for rows without a distribution, every row the same alone
as in a batch, the whole sampler giving the C++ sampler's tokens, and every kernel compiling for an
H100 (sm_90) with Triton's own compiler."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from kvserve.kernels import cpu_kernels
from kvserve.kernels.triton_sample import TritonSampleOps
from kvserve.sample.sampler import Sampler
from kvserve.structured_output.bitmask import allocate_token_bitmask, apply_token_bitmask_

pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(cpu_kernels() is None, reason="no C++ compiler for the kernels")

OPS = TritonSampleOps()
SMALL_BLOCKS = TritonSampleOps(block=256)  # several blocks and a tail over a few thousand tokens


def scaled_rows(vocab: int, scales: list[float], seed: int) -> torch.Tensor:
    """float32 [len(scales), vocab]: normal logits, row i times scales[i]."""
    return torch.randn(len(scales), vocab, generator=torch.Generator().manual_seed(seed)) * torch.tensor(scales)[:, None]


def top_p_both(logits: torch.Tensor, top_p: list[float], temperature: list[float] | None,
               ops: TritonSampleOps = OPS) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton and the C++ top-p of every row of a copy of ``logits``."""
    rows = torch.arange(logits.shape[0])
    p = torch.tensor(top_p, dtype=torch.float32)
    t = None if temperature is None else torch.tensor(temperature, dtype=torch.float32)
    ours, theirs = logits.clone(), logits.clone()
    ops.top_p_rows(ours, rows, p, t)
    cpu_kernels().top_p_rows(theirs, rows, p, t)
    return ours, theirs


def assert_float64_nucleus(logits: torch.Tensor, kept: torch.Tensor, top_p: list[float],
                           temperature: list[float] | None) -> None:
    """Each row keeps what the float64 rule keeps (a token stays when the mass before it, most
    likely first, ties by index, is below p), except tokens whose mass before lies within 1e-5 of p."""
    for r in range(logits.shape[0]):
        row = logits[r].float() if temperature is None else logits[r].float() / temperature[r]  # torch's float32 division
        order = torch.sort(-row.double(), stable=True).indices
        probs = torch.softmax(row.double(), 0)[order]
        before = torch.cumsum(probs, 0) - probs
        want = torch.zeros_like(kept[r])
        want[order] = before < top_p[r]
        unsure = torch.zeros_like(want)
        unsure[order] = (before - top_p[r]).abs() < 1e-5
        assert torch.equal(kept[r] | unsure, want | unsure), f"row {r}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_argmax_is_the_first_maximum_and_a_nan_wins(dtype):
    logits = scaled_rows(1000, [1.0] * 6, 1)
    logits[1, [17, 500, 999]] = 9.0  # ties: the first
    logits[2, 300] = torch.nan
    logits[2, 700] = torch.inf
    logits[3] = -torch.inf
    logits[4, 999] = torch.nan  # in the last block's tail
    logits[5, [0, 256]] = torch.inf
    logits = logits.to(dtype)
    want = logits.float().argmax(dim=1)
    assert want.tolist()[1:4] == [17, 300, 0]
    for ops in (OPS, SMALL_BLOCKS):
        assert torch.equal(ops.argmax_rows(logits), want)
    assert torch.equal(cpu_kernels().argmax_rows(logits), want)
    wide = scaled_rows(33_001, [1.0, 1.0], 2).to(dtype)
    wide[1, 33_000] = 99.0
    assert torch.equal(OPS.argmax_rows(wide), wide.float().argmax(dim=1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [None, [0.7, 1.0, 1.3, 0.4, 2.0, 1.0, 0.9, 1.1]])
def test_top_p_keeps_the_cpp_kernels_set(dtype, temperature):
    """Peaked to flat rows, p tiny to near 1; rows 6 and 7 hold many equal logits (a nucleus that
    ends inside a group of ties keeps its first ones by index)."""
    logits = scaled_rows(2000, [0.05, 1.0, 3.0, 6.0, 2.0, 0.5, 1.0, 1.0], 3)
    logits[6] = torch.randint(0, 4, (2000,), generator=torch.Generator().manual_seed(4)).float()
    logits[7, ::2] = 2.0
    logits = logits.to(dtype)
    top_p = [0.3, 1e-7, 0.9, 0.5, 0.999, 0.99, 0.37, 0.61]
    ours, theirs = top_p_both(logits, top_p, temperature)
    assert torch.equal(ours, theirs)
    assert torch.equal(ours[ours > -torch.inf], logits[ours > -torch.inf])  # kept tokens keep their raw bits
    assert_float64_nucleus(logits, ours > -torch.inf, top_p, temperature)
    kept = (ours > -torch.inf).sum(dim=1).tolist()
    assert kept[1] == 1 and 1 < kept[4] < 2000 and 0 < kept[7] < 1000  # the tie rows cut inside a group


def test_top_p_over_many_blocks_and_near_one():
    """A 33k vocabulary (9 blocks of 4,096), small blocks with a tail, and p = 1 - 1e-5: equal to
    the C++ kernel where the boundary is clear, and the float64 rule within rounding of p always."""
    for dtype in (torch.float32, torch.bfloat16):
        logits = scaled_rows(33_000, [2.0, 0.5], 5).to(dtype)
        ours, theirs = top_p_both(logits, [0.8, 0.95], [0.8, 1.2])
        assert torch.equal(ours, theirs)
    logits = scaled_rows(3000, [0.1, 1.0, 5.0, 2.0], 6)
    top_p = [0.5, 0.9, 0.99999, 0.99999]
    ours, theirs = top_p_both(logits, top_p, [1.0, 0.8, 0.8, 1.0], SMALL_BLOCKS)
    assert torch.equal(ours[:2], theirs[:2])
    assert_float64_nucleus(logits, ours > -torch.inf, top_p, [1.0, 0.8, 0.8, 1.0])


def test_rows_without_a_distribution():
    """A NaN, a +inf or only -inf: top-p leaves the row as it is, the draw returns V."""
    logits = scaled_rows(500, [1.0] * 4, 7)
    logits[0, 7] = torch.nan
    logits[1, 9] = torch.inf
    logits[2] = -torch.inf
    ours, theirs = top_p_both(logits, [0.5] * 4, [1.0] * 4)
    assert torch.equal(ours[:3].nan_to_num(), logits[:3].nan_to_num())
    assert torch.equal(ours.nan_to_num(), theirs.nan_to_num())
    rows, uniforms = torch.arange(4), torch.full((4,), 0.5, dtype=torch.float64)
    got = OPS.sample_rows(logits, rows, torch.ones(4), uniforms)
    assert got[:3].tolist() == [500] * 3 and 0 <= got[3] < 500
    assert torch.equal(got, cpu_kernels().sample_rows(logits, rows, torch.ones(4), uniforms))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_draws_are_the_cpp_kernels_and_follow_the_float64_inverse_cdf(dtype):
    """Equal tokens to the C++ kernel and the float64 inverse CDF, except where u lies within
    rounding of a CDF step (their sums run in other orders)."""
    vocab, uniforms = 3000, (np.arange(12) + 0.5) / 12
    logits = scaled_rows(vocab, [4.0, 1.0], 8)
    logits[1, ::3] = -torch.inf  # a truncated row: never drawn
    logits = logits.to(dtype)
    for r, temperature, ops in [(0, 0.7, OPS), (0, 1.0, OPS), (1, 1.3, SMALL_BLOCKS)]:
        rows = torch.full((len(uniforms),), r, dtype=torch.int64)
        temps = torch.full((len(uniforms),), temperature)
        u = torch.tensor(uniforms, dtype=torch.float64)
        got = np.array(ops.sample_rows(logits, rows, temps, u).tolist())
        y = (logits[r].float() / temperature).double().numpy()  # the kernels' float32 division, then float64
        p = np.exp(y - y.max())
        cdf = np.cumsum(p / p.sum())
        want = np.searchsorted(cdf, uniforms, side="right")
        near_step = ((np.abs(cdf[np.minimum(want, vocab - 1)] - uniforms) < 1e-5)
                     | (np.abs(cdf[np.maximum(want - 1, 0)] - uniforms) < 1e-5))
        assert np.all((got == want) | near_step) and np.all(p[got] > 0)
        assert np.all((got == np.array(cpu_kernels().sample_rows(logits, rows, temps, u).tolist())) | near_step)
    edges = torch.tensor([0.0, 1.0 - 2.0**-53], dtype=torch.float64)
    got = OPS.sample_rows(logits, torch.ones(2, dtype=torch.int64), torch.ones(2), edges).tolist()
    assert got == [1, 2999]  # the first and the last token left


def test_a_row_gives_the_same_result_alone_and_in_any_batch():
    row = scaled_rows(5000, [3.0], 9)[0]
    others = scaled_rows(5000, [0.5, 8.0, 1.0], 10)
    for dtype in (torch.float32, torch.bfloat16):
        alone, batch = row[None].to(dtype), torch.cat([others[:2], row[None], others[2:]]).to(dtype)
        assert torch.equal(OPS.argmax_rows(alone), OPS.argmax_rows(batch)[2:3])
        u, t = torch.tensor([0.123456789], dtype=torch.float64), torch.tensor([0.9])
        draws = OPS.sample_rows(batch, torch.arange(4), torch.tensor([1.0, 0.5, 0.9, 2.0]),
                                torch.tensor([0.9, 0.1, 0.123456789, 0.5], dtype=torch.float64))
        assert OPS.sample_rows(alone, torch.zeros(1, dtype=torch.int64), t, u)[0] == draws[2]
        cut_alone, cut_batch = alone.clone(), batch.clone()
        OPS.top_p_rows(cut_alone, torch.zeros(1, dtype=torch.int64), torch.tensor([0.8]), t)
        OPS.top_p_rows(cut_batch, torch.arange(4), torch.tensor([0.3, 0.99, 0.8, 0.5]), torch.tensor([1.0, 1.5, 0.9, 0.7]))
        assert torch.equal(cut_alone[0], cut_batch[2])


def test_bitmask_bans_what_the_cpp_kernel_bans():
    vocab = 3000
    bitmask = torch.randint(-2**31, 2**31 - 1, (4, 90), dtype=torch.int32, generator=torch.Generator().manual_seed(11))
    bitmask[1, :50] = 0
    bitmask[2] = -1
    logits = scaled_rows(vocab, [1.0] * 4, 12)
    ours, theirs = logits.clone(), logits.clone()
    OPS.apply_token_bitmask(ours, bitmask, torch.tensor([0, 1, 3]))  # 90 words: tokens past 2,880 banned
    cpu_kernels().apply_token_bitmask(theirs, bitmask, torch.tensor([0, 1, 3]))
    assert torch.equal(ours, theirs) and torch.equal(ours[2], logits[2]) and (ours[0, 2880:] == -torch.inf).all()
    full = allocate_token_bitmask(4, vocab)
    full[:, 5] = 0
    ours, theirs = logits.clone(), logits.clone()
    apply_token_bitmask_(ours, full, [2, 3], OPS)
    apply_token_bitmask_(theirs, full, [2, 3], cpu_kernels())
    assert torch.equal(ours, theirs) and torch.isinf(ours[2:, 160:192]).all() and torch.equal(ours[:2], logits[:2])


BATCH = [dict(temperature=0.0), dict(temperature=0.7), dict(temperature=1.0, top_k=20),
         dict(temperature=0.9, top_p=0.9), dict(temperature=1.2, min_p=0.05), dict(temperature=0.8, top_k=50, top_p=0.8),
         dict(temperature=0.0, top_p=0.5), dict(temperature=1.0)]
TOP_P_ONLY = [dict(temperature=0.8, top_p=0.9), dict(temperature=1.3, top_p=0.5), dict(temperature=0.0),
              dict(temperature=1.0, top_p=0.99), dict(temperature=0.6)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("params", [BATCH, TOP_P_ONLY], ids=["mixed", "top_p_only"])
def test_the_sampler_on_triton_kernels_draws_the_cpp_samplers_tokens(make_request, build, dtype, params):
    """Greedy, temperature, top-k, top-p and min-p rows in one batch (the scaled-copy path), and a
    top-p-only batch (the one-pass path); the last row holds a +inf (no distribution: its argmax)."""
    vocab = 2000
    logits = scaled_rows(vocab, [3.0, 1.0, 2.0, 4.0, 0.5, 2.0, 1.0, 1.5][: len(params)], 13).to(dtype)
    logits[-1, 1234] = torch.inf
    metadata = build([make_request(**p) for p in params], vocab)
    triton_sampler = Sampler()
    triton_sampler.ops = OPS
    for seed in range(3):
        uniforms = torch.rand(len(params), dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        metadata = type(metadata)(**{**metadata.__dict__, "uniforms": uniforms})
        got = triton_sampler(logits, metadata).sampled_token_ids
        assert torch.equal(got, Sampler()(logits, metadata).sampled_token_ids) and got[-1] == 1234


_COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kvserve.kernels import triton_sample_kernels as k
from kvserve.kernels.triton_sample import BITMASK_BLOCK, BLOCK, ROW_LAUNCH
row = {"rows_ptr": "*i64", "vocab": "i32", "BLOCK": "constexpr"}
kernels = [
    (k.argmax_kernel, {"logits_ptr": "*bf16", "out_ptr": "*i64", "vocab": "i32", "BLOCK": "constexpr"}, {}),
    (k.sample_kernel, {"logits_ptr": "*bf16", **row, "temperature_ptr": "*fp32", "uniforms_ptr": "*fp64",
                       "out_ptr": "*i64"}, {}),
    (k.top_p_kernel, {"logits_ptr": "*fp32", **row, "top_p_ptr": "*fp32", "temperature_ptr": "*fp32",
                      "SCALE": "constexpr"}, {"SCALE": True}),
    (k.bitmask_kernel, {"logits_ptr": "*fp32", "bitmask_ptr": "*i32", "rows_ptr": "*i64", "stride_row": "i32",
                        "vocab": "i32", "width": "i32", "BLOCK": "constexpr"}, {"BLOCK": BITMASK_BLOCK}),
]
for fn, signature, constants in kernels:
    source = ASTSource(fn=fn, signature=signature, constexprs={"BLOCK": BLOCK, **constants})
    triton.compile(source, target=GPUTarget("cuda", 90, 32), options=ROW_LAUNCH)
"""


@pytest.mark.slow
def test_the_kernels_compile_for_an_h100():
    """The interpreter runs what the compiler may refuse (a loop variable that changes type, an
    operation without a GPU lowering): Triton compiles each kernel to an sm_90 binary here, no GPU needed."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _COMPILE], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
