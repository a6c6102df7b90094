"""Weight-only int8/int4: the quantizers against an independent numpy implementation of their
rules, the packed panels dequantize to exactly those weights, the kernel's bits are exactly its
documented sequence (emulated here) on every instruction set this CPU runs (each variant library,
``kernels_for_variant``), rows do not depend on the batch, and the error against the float layer
stays within stated bounds."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from model_fixtures import code_values
from torch import nn

from kvserve.kernels import build, cpu_kernels, cpu_kernels_available, kernels_for_variant
from kvserve.model.quant_linear import QuantizedLinear, quantize_linears, quantize_weight
from kvserve.model.quant_tensor import quantize_int4, quantize_int8, quantize_mxfp4

pytestmark = pytest.mark.skipif(not cpu_kernels_available(), reason="no C++ compiler for the kernels")

CLIP_RATIOS = (1.0, 0.95, 0.9, 0.85, 0.8)
# (in_features, out_features): K one group and several, N past one 64-column panel and odd.
SHAPES = [(64, 16), (128, 67), (896, 130)]
KINDS = ["int8", "int4-symmetric", "int4-zero-points", "mxfp4"]


# Every variant library this CPU runs (test ids: the variant's name), each with the instruction set
# its quantized kernel is compiled for (csrc/quant_vector.h): 1 portable, 2 AVX2, 3 AVX-512, 4
# AVX-512 with AVX512-BF16, whose bfloat16 activations take the pair sequence.
VARIANTS = [variant.name for variant in build.host_variants()]
ISA_OF_VARIANT = {"x86_64": 1, "avx2": 2, "avx512": 3, "avx512_bf16": 4, "native": 1}  # native: not x86-64
PAIRS_VARIANT = "avx512_bf16"


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_variant_library_computes_with_its_own_instruction_set(variant):
    """The library of each variant reports its variant's instruction set (one process holds them
    all side by side), and packs for that instruction set's panel width."""
    kernels = kernels_for_variant(variant)
    assert kernels.variant == variant
    assert kernels.quant_linear_isa() == ISA_OF_VARIANT[variant]
    assert kernels.quant_linear_layout()[0] == {1: 4, 2: 8, 3: 16, 4: 16}[ISA_OF_VARIANT[variant]]


def weight(n: int, k: int, seed: int) -> torch.Tensor:
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed))


def quantized(kind: str, w: torch.Tensor, group: int):
    if kind == "int8":
        return quantize_int8(w)
    if kind == "mxfp4":
        return quantize_mxfp4(w)
    return quantize_int4(w, group, symmetric=kind == "int4-symmetric")


# -- an independent numpy implementation of the quantizers' rules (quant_tensor's docstring) ------

def np_int8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    scale = (np.abs(w).max(axis=1, keepdims=True) / np.float32(127)).astype(np.float32)
    scale[scale == 0] = 1
    return np.clip(np.rint(w / scale), -127, 127).astype(np.int8), scale


def np_int4(w: np.ndarray, group: int, symmetric: bool):
    """Per group: each clipping ratio's candidate, the one of least squared error (first on ties)."""
    n, k = w.shape
    q = np.zeros((n, k), np.uint8)
    scales = np.zeros((n, k // group), np.float16)
    offsets = np.zeros((n, k // group), np.float16)
    for r in range(n):
        for g in range(k // group):
            x = w[r, g * group:(g + 1) * group]
            best = None
            for ratio in CLIP_RATIOS:
                if symmetric:
                    peak = x[np.argmax(np.abs(x))] * np.float32(ratio)
                    s = np.float32(np.float16(peak / np.float32(-8)))
                    s = s if s != 0 else np.float32(1)
                    v = np.clip(np.rint(x / s + 8), 0, 15)
                    m = np.float32(8) * s
                else:
                    lo, hi = x.min(), x.max()
                    mid = (lo + hi) / np.float32(2)
                    lo, hi = mid + (lo - mid) * np.float32(ratio), mid + (hi - mid) * np.float32(ratio)
                    s = np.float32(np.float16((hi - lo) / np.float32(15)))
                    s = s if s > 0 else np.float32(1)
                    z = np.clip(np.rint(-lo / s), 0, 15)
                    m = np.float32(np.float16(s * z))
                    v = np.clip(np.rint((x + m) / s), 0, 15)
                error = np.square((v.astype(np.float32) * s - m - x).astype(np.float64)).sum()
                if best is None or error < best[0]:
                    best = (error, v, s, m)
            _, v, s, m = best
            q[r, g * group:(g + 1) * group] = v
            scales[r, g], offsets[r, g] = s, m
    return q, scales, (None if symmetric else offsets)


def np_dequantize(q: np.ndarray, scales: np.ndarray, offsets, group: int, bits: int) -> np.ndarray:
    s = np.repeat(scales.astype(np.float32), group, axis=1)
    if bits == 8:
        return q.astype(np.float32) * s
    if offsets is None:
        return (q.astype(np.float32) - 8) * s
    return q.astype(np.float32) * s - np.repeat(offsets.astype(np.float32), group, axis=1)


def test_int8_matches_numpy_and_dequantizes_exactly():
    w = weight(37, 96, seed=1)
    ours = quantize_int8(w)
    q, scale = np_int8(w.numpy())
    assert np.array_equal(ours.q.numpy(), q) and np.array_equal(ours.scales.numpy(), scale)
    layer = QuantizedLinear(ours, None, cpu_kernels())  # packed; dequantized back from the panels
    assert np.array_equal(layer.dequantized_weight().numpy(), np_dequantize(q, scale, None, 96, 8))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("group", [32, 64])
def test_int4_matches_numpy_and_dequantizes_exactly(symmetric, group, variant):
    w = weight(21, 128, seed=group)
    ours = quantize_int4(w, group, symmetric)
    q, scales, offsets = np_int4(w.numpy(), group, symmetric)
    assert np.array_equal(ours.q.numpy(), q)
    assert np.array_equal(ours.scales.numpy(), scales)
    assert ours.symmetric == symmetric
    if not symmetric:
        assert np.array_equal(ours.offsets.numpy(), offsets)
    layer = QuantizedLinear(ours, None, kernels_for_variant(variant))
    assert np.array_equal(layer.dequantized_weight().numpy(), np_dequantize(q, scales, offsets, group, 4))


# -- the kernel's sequence ---------------------------------------------------------------------

def f32(t: torch.Tensor) -> torch.Tensor:
    """A float64 tensor rounded to float32 (and back to float64)."""
    return t.float().double()


def ftz(t: torch.Tensor) -> torch.Tensor:
    """Float32 values below the normal range flushed to (signed) zero, as vdpbf16ps does."""
    return torch.where(t.abs() < 2.0**-126, t * 0, t)


def sequence(x: torch.Tensor, layer_weight, bias: torch.Tensor | None, pairs: bool = False) -> torch.Tensor:
    """quant_linear.cpp's sequence: per group, p = fma(x, v, p) in k order; acc = fma(p, s, acc);
    with offsets acc = fma(-m, xsum, acc) (xsum a float32 running sum); then acc + b, in float32.
    A float32 product is exact in float64, so each float64 sum rounded to float32 is the fma
    (up to double rounding on exact float64 ties: not met by these seeds). ``pairs``: the
    AVX512-BF16 sequence of bfloat16 activations, per pair (k, k + 1) vdpbf16ps's
    p = round(p + x[k + 1] v[k + 1]) then p = round(p + x[k] v[k]), each flushed to zero below the
    normal range."""
    qt = layer_weight
    n, k = qt.shape
    g_size = qt.group_size
    v = code_values(qt)
    scales = qt.scales.double()
    x64 = x.double()
    acc = torch.zeros(x.shape[0], n, dtype=torch.float64)
    for g in range(k // g_size):
        p = torch.zeros_like(acc)
        xsum = torch.zeros(x.shape[0], 1, dtype=torch.float64)
        for kk in range(g * g_size, (g + 1) * g_size):
            if pairs:
                if kk % 2 == 0:
                    p = ftz(f32(p + x64[:, kk + 1:kk + 2] * v[None, :, kk + 1]))
                    p = ftz(f32(p + x64[:, kk:kk + 1] * v[None, :, kk]))
            else:
                p = f32(p + x64[:, kk:kk + 1] * v[None, :, kk])
            xsum = f32(xsum + x64[:, kk:kk + 1])
        acc = f32(acc + p * scales[None, :, g])
        if qt.offsets is not None:
            acc = f32(acc - qt.offsets.double()[None, :, g] * xsum)
    if bias is not None:
        acc = f32(acc + bias.double())
    return acc.float()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("in_features", "out_features"), SHAPES[:2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bits_are_the_sequence_on_every_isa(kind, in_features, out_features, dtype, variant):
    w = weight(out_features, in_features, seed=in_features + out_features)
    qt = quantized(kind, w, 32)
    bias = torch.randn(out_features, generator=torch.Generator().manual_seed(3))
    x = torch.randn(9, in_features, generator=torch.Generator().manual_seed(4)).to(dtype)
    expected = sequence(x, qt, bias).to(dtype)
    out = QuantizedLinear(qt, bias, kernels_for_variant(variant), amx=False)(x)
    assert out.dtype == dtype
    pairs = variant == PAIRS_VARIANT and dtype == torch.bfloat16  # AVX512-BF16: bfloat16 activations in pairs
    assert torch.equal(out, sequence(x, qt, bias, pairs=True).to(dtype) if pairs else expected)


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_isa_sums_in_its_documented_order(variant):
    """Four terms whose float32 sum depends on the order: (t0 + t1) + t2 rounds t2 away that
    (t0 + t3) + t2 keeps. ISAs 1-3 (x86_64, avx2, avx512) add in k order (result 1 / 127), ISA 4's
    (avx512_bf16) bfloat16 pairs add x1 v1 then x0 v0 per pair (127 / 128 / 127): the two results
    differ in bfloat16."""
    w = torch.zeros(16, 64)
    w[0, :4] = 1.0  # int8 per channel: v = 127, scale 1 / 127
    qt = quantize_int8(w)
    x = torch.zeros(1, 64)
    x[0, :4] = torch.tensor([2.0**17, 0.0, 2.0**-7, -(2.0**17)])
    x = x.to(torch.bfloat16)
    sequential, pairs = sequence(x, qt, None), sequence(x, qt, None, pairs=True)
    assert sequential[0, 0].item() == pytest.approx(1 / 127) and pairs[0, 0].item() == pytest.approx(127 / 128 / 127)
    out = QuantizedLinear(qt, None, kernels_for_variant(variant), amx=False)(x)
    assert torch.equal(out, (pairs if variant == PAIRS_VARIANT else sequential).to(torch.bfloat16))


@pytest.mark.parametrize("kind", KINDS)
def test_rows_do_not_depend_on_the_batch(kind):
    """Row i alone, in a batch of 2..5 (one-row kernel, padded row groups) and of 70 (several row
    blocks, K blocks): the same bits, with one and two threads."""
    w = weight(130, 896, seed=5)
    layer = QuantizedLinear(quantized(kind, w, 32), torch.randn(130), cpu_kernels())
    x = torch.randn(70, 896, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        full = layer(x)
        torch.set_num_threads(1)
        for rows in (1, 2, 3, 5):
            assert torch.equal(layer(x[:rows]), full[:rows])
        assert torch.equal(layer(x[17:18]), full[17:18])
    finally:
        torch.set_num_threads(before)


# Relative Frobenius error bounds of the weight and of a layer's output on Gaussian inputs, for
# Gaussian weights of 896 inputs. Expected: int8 step max|w|/127 ~ 0.026 sigma, rms error
# step/sqrt(12) ~ 0.8% of sigma; int4, 16 levels over a group's range: ~8-10%. Measured (these
# seeds; weight / output): int8 0.78% / 0.78%, int4 g32 8.3% / 8.4%, g128 9.7% / 9.8%.
ERROR_BOUNDS = {("int8", 896): 0.01, ("int4", 32): 0.10, ("int4", 128): 0.11}


@pytest.mark.parametrize(("method", "group"), [("int8", 896), ("int4", 32), ("int4", 128)])
def test_relative_error_against_the_float_layer(method, group):
    w = weight(256, 896, seed=8)
    layer = QuantizedLinear(quantize_weight(w, method, group), None, cpu_kernels())
    weight_error = torch.linalg.norm(layer.dequantized_weight() - w) / torch.linalg.norm(w)
    x = torch.randn(16, 896, generator=torch.Generator().manual_seed(9))
    ref = x @ w.T
    output_error = torch.linalg.norm(layer(x) - ref) / torch.linalg.norm(ref)
    bound = ERROR_BOUNDS[(method, group)]
    assert weight_error <= bound and output_error <= bound
    assert weight_error >= bound / 4  # the bound is not vacuous


def test_quantize_linears_swaps_every_linear_and_the_head_on_request():
    model = nn.Module()
    model.proj = nn.Linear(64, 32)
    model.lm_head = nn.Linear(32, 100, bias=False)
    assert quantize_linears(model, "int8") == 1
    assert isinstance(model.proj, QuantizedLinear) and isinstance(model.lm_head, nn.Linear)
    assert quantize_linears(model, "int4", 32, lm_head=True) == 1
    assert isinstance(model.lm_head, QuantizedLinear) and model.lm_head.format() == "int4 (group 32, symmetric)"
    odd = nn.Module()
    odd.proj = nn.Linear(48, 8)
    with pytest.raises(ValueError, match="proj .48 inputs.: int4 group size 32 does not divide the 48 inputs"):
        quantize_linears(odd, "int4", 32)


def test_without_kernels_the_dequantized_path_gives_the_same_weight():
    w = weight(40, 64, seed=10)
    qt = quantize_int4(w, 32)
    plain = QuantizedLinear(qt, None, None)
    x = torch.randn(3, 64)
    assert torch.allclose(plain(x), x @ qt.dequantize().T, rtol=0, atol=0)
    packed = QuantizedLinear(qt, None, cpu_kernels())
    assert torch.allclose(packed(x), plain(x), rtol=1e-5, atol=1e-5)
