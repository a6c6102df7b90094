"""``InvariantLinear``: the vector path's result is exactly the documented sequence of float32 FMAs
(emulated here); every path (vector, and AMX tiles where the CPU has them) lies within the error
bound of that sequence from a float64 reference and handles bias and odd shapes; swapping a
model's linears keeps its logits (against ``F.linear``)."""

from __future__ import annotations

import pytest
import torch
from model_fixtures import flat_prompt_logits
from torch import nn

from kvserve.kernels import cpu_kernels, cpu_kernels_available
from kvserve.model import invariant_linear
from kvserve.model.invariant_linear import InvariantLinear, use_invariant_linears
from kvserve.model.layers import MergedLinear
from kvserve.model.loader import load_model
from kvserve.model.runner import ModelRunner

pytestmark = pytest.mark.skipif(not cpu_kernels_available(), reason="no C++ compiler for the kernels")

DTYPES = [torch.float32, torch.bfloat16]
# (in_features, out_features): tile multiples, odd sizes on both sides, K = 1, K past the cache
# block (256) and the Qwen2.5-0.5B down_proj width.
SHAPES = [(64, 32), (53, 37), (1, 16), (300, 130), (896, 81), (4864, 24)]
# The vector path everywhere, and AMX tiles (bfloat16 layers) on a CPU that has them.
PATHS = [False] + ([True] if cpu_kernels_available() and cpu_kernels().amx_linear_available() else [])


def fma_chain(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The kernel's documented sequence, acc = fma(x[m, k], w[n, k], acc) for k = 0, 1, ..., in
    float32; then acc + bias in float32. A float32 product is exact in float64 and the float64
    sum of it and a float32 is rounded once more to float32 (a double rounding that differs from
    one fma only on exact float64 ties: not met by these seeds)."""
    x64, w64 = x.double(), w.double()
    acc = torch.zeros(x.shape[0], w.shape[0], dtype=torch.float32)
    for k in range(x.shape[1]):
        acc = (acc.double() + x64[:, k : k + 1] * w64[None, :, k]).float()
    return acc if bias is None else acc + bias.float()


def _layer(in_features: int, out_features: int, dtype: torch.dtype, bias: bool, seed: int) -> nn.Linear:
    torch.manual_seed(seed)
    linear = nn.Linear(in_features, out_features, bias=bias)
    with torch.no_grad():
        linear.weight.normal_()
        if bias:
            linear.bias.normal_()
    return linear.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("in_features", "out_features"), SHAPES[:4])
@pytest.mark.parametrize("bias", [True, False])
def test_bits_are_the_fma_chain(dtype, in_features, out_features, bias):
    linear = _layer(in_features, out_features, dtype, bias, seed=in_features)
    x = torch.randn(23, in_features, generator=torch.Generator().manual_seed(1)).to(dtype)
    ours = InvariantLinear(linear, cpu_kernels(), amx=False)(x)
    assert ours.dtype == dtype
    assert torch.equal(ours, fma_chain(x, linear.weight, linear.bias).to(dtype))


@pytest.mark.parametrize("amx", PATHS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("in_features", "out_features"), SHAPES)
def test_within_the_summation_bound_of_float64(dtype, in_features, out_features, amx):
    """|fl32(y) - y| <= gamma_(K+1) * (sum_k |x_k w_k| + |b|) for K + 1 sequential roundings
    (Higham, "Accuracy and Stability of Numerical Algorithms", 3.1; u = 2^-24), then the rounding
    to the output dtype adds at most u_out * |fl32(y)| (u_out = 2^-24 float32, 2^-8 bfloat16).
    The bound holds for any order of the sum: the AMX tiles' too."""
    if amx and dtype != torch.bfloat16:
        pytest.skip("AMX tiles take bfloat16 layers only")
    linear = _layer(in_features, out_features, dtype, True, seed=7)
    x = torch.randn(9, in_features, generator=torch.Generator().manual_seed(2)).to(dtype)
    with torch.inference_mode():
        ours = InvariantLinear(linear, cpu_kernels(), amx=amx)(x).double()
        x64, w64, b64 = x.double(), linear.weight.double(), linear.bias.double()
        exact = x64 @ w64.T + b64
        u, steps = 2.0**-24, in_features + 1
        gamma = steps * u / (1 - steps * u)
        float32_bound = gamma * (x64.abs() @ w64.abs().T + b64.abs())
        u_out = 2.0**-8 if dtype == torch.bfloat16 else u
        bound = float32_bound + u_out * (exact.abs() + float32_bound)
    assert ((ours - exact).abs() <= bound).all()
    # and not vacuous: the bound is well under the values' scale
    assert bound.max() < 0.05 * exact.abs().max()


@pytest.mark.parametrize("amx", PATHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_shapes_and_mixed_dtypes(dtype, amx):
    if amx and dtype != torch.bfloat16:
        pytest.skip("AMX tiles take bfloat16 layers only")
    linear = _layer(40, 24, dtype, True, seed=3)
    layer = InvariantLinear(linear, cpu_kernels(), amx=amx)
    x = torch.randn(2, 5, 40).to(dtype)
    out = layer(x)
    assert out.shape == (2, 5, 24)
    assert torch.equal(out, layer(x.reshape(10, 40)).reshape(2, 5, 24))
    assert torch.equal(layer(x[0, 3]), out[0, 3])  # 1-D input: one row
    assert layer(x[:0]).shape == (0, 5, 24)
    assert torch.equal(layer(x.transpose(0, 1)), out.transpose(0, 1))  # non-contiguous input
    other = torch.float32 if dtype == torch.bfloat16 else torch.bfloat16  # activations of the other dtype
    mixed = layer(x.to(other))
    assert mixed.dtype == other
    assert torch.equal(mixed, fma_chain(x.to(other).reshape(10, 40), linear.weight, linear.bias).to(other).reshape(2, 5, 24))


@pytest.mark.parametrize(("out_features", "in_features"), [(37, 53), (130, 300), (64, 64)])
def test_amx_packing_in_slices_is_the_documented_layout(monkeypatch, out_features, in_features):
    """pack_amx_weight's tiles[p, c, r, 2j + h] = W[16p + j, 32c + 2r + h] (zero padding), also
    when it packs a panel at a time (the slices of a large weight)."""
    w = torch.randn(out_features, in_features).to(torch.bfloat16)
    panels, chunks = -(-out_features // 16), -(-in_features // 32)
    padded = torch.zeros(panels * 16, chunks * 32, dtype=torch.bfloat16)
    padded[:out_features, :in_features] = w
    want = torch.empty(panels, chunks, 16, 32, dtype=torch.bfloat16)
    for j in range(16):
        for h in range(2):
            want[:, :, :, 2 * j + h] = padded[j::16, h::2].reshape(panels, chunks, 16)
    assert torch.equal(invariant_linear.pack_amx_weight(w), want)
    monkeypatch.setattr(invariant_linear, "PACK_SLICE_BYTES", 1)  # one panel per slice
    assert torch.equal(invariant_linear.pack_amx_weight(w), want)


def test_replaces_float32_and_bfloat16_cpu_linears_only():
    model = nn.Sequential(nn.Linear(8, 8), MergedLinear(8, [4, 4], ["a", "b"], bias=False))
    assert use_invariant_linears(model) == 2
    assert all(isinstance(m, InvariantLinear) for m in model)
    bf16 = nn.Sequential(nn.Linear(8, 8)).to(torch.bfloat16)
    assert use_invariant_linears(bf16) == 1
    half = nn.Sequential(nn.Linear(8, 8)).to(torch.float16)
    assert use_invariant_linears(half) == 0  # float16: F.linear, untouched
    assert isinstance(half[0], nn.Linear)


def test_without_kernels_the_model_keeps_f_linear(monkeypatch):
    monkeypatch.setattr(invariant_linear, "kernels_for", lambda device: None)
    model = nn.Sequential(nn.Linear(8, 8))
    assert use_invariant_linears(model) == 0
    assert isinstance(model[0], nn.Linear)


@pytest.mark.parametrize("dtype", DTYPES)
def test_runner_logits_close_to_f_linear(tiny_checkpoint, dtype):
    """The swap changes only the summation order: the logits of a whole model stay within a few
    roundings of the unswapped model's: float32 1e-5 of the largest logit (~100 float32 ulps),
    bfloat16 1e-2 (between two and three bf16 ulps)."""
    path, _ = tiny_checkpoint("qwen2", dtype)
    prompts, tables = [[3, 1, 4, 1, 5, 9], [2, 7]], [[0], [1]]
    runner = ModelRunner(load_model(path), num_blocks=4, block_size=16)
    assert runner.num_prepacked_linears > 0
    plain = ModelRunner(load_model(path), num_blocks=4, block_size=16, prepack_linears=False)
    assert plain.num_prepacked_linears == 0
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    for ours, theirs in zip(flat_prompt_logits(runner, prompts, tables), flat_prompt_logits(plain, prompts, tables)):
        scale = theirs.float().abs().max()
        assert (ours.float() - theirs.float()).abs().max() <= tolerance * scale
