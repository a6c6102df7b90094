"""int8/int4 weights on AMX tiles (``amx_quant_linear.cpp``), on CPUs that have them.

The tiles' arithmetic (TDPBF16PS) is measured here, on the bfloat16 kernel itself: each element
of a 32-input chunk is two fma chains from zero, over the even and over the odd inputs, added,
then added to the tile's value, with denormal inputs and results flushed to zero. The quantized
kernel's bits are that sequence (emulated here) for a lone row (its vector kernel) and for many
rows (the tiles), so rows do not depend on the batch; float32 activations get the vector kernel's
bits; the packed layout unpacks to the layer's weight."""

from __future__ import annotations

import pytest
import torch
from model_fixtures import code_values, quantized_weight as quantized

from kvserve.kernels import cpu_kernels, cpu_kernels_available
from kvserve.model.invariant_linear import pack_amx_weight
from kvserve.model.quant_linear import QuantizedLinear, quantize_weight
from kvserve.model.quant_tensor import QuantizedTensor, quantize_int8

pytestmark = pytest.mark.skipif(
    not cpu_kernels_available() or not cpu_kernels().amx_linear_available(),
    reason="this CPU (or OS) has no AMX-BF16 tiles: the layers use the vector kernel, tested elsewhere")

KINDS = ["int8", "int4-symmetric", "int4-zero-points", "mxfp4"]


def f32(t: torch.Tensor) -> torch.Tensor:
    """A float64 tensor rounded to float32 (and back to float64)."""
    return t.float().double()


def tile_sums(x: torch.Tensor, v: torch.Tensor, k0: int, k1: int) -> torch.Tensor:
    """[M, N] sums of x[:, k] * v[:, k] over k in [k0, k1) (32-input chunks) as the tiles make
    them: per chunk, an fma chain over the even inputs and one over the odd ones, both from zero,
    added; then added to the running value. A product of a bfloat16 and a bfloat16 (or a small
    integer) is exact in float32, so each float64 sum rounded to float32 is the fma."""
    x64, v64 = x.double(), v.double()
    c = torch.zeros(x.shape[0], v.shape[0], dtype=torch.float64)
    for chunk in range(k0, k1, 32):
        chains = []
        for parity in (0, 1):
            s = torch.zeros_like(c)
            for k in range(chunk + parity, min(chunk + 32, k1), 2):
                s = f32(s + x64[:, k:k + 1] * v64[None, :, k])
            chains.append(s)
        c = f32(c + f32(chains[0] + chains[1]))
    return c


def tile_sequence(x: torch.Tensor, qt: QuantizedTensor, bias: torch.Tensor | None) -> torch.Tensor:
    """amx_quant_linear.cpp's sequence: per group p = tile sums; acc = fma(p, s, acc); with offsets
    acc = fma(-m, xsum, acc) (xsum a float32 running sum); then acc + b, rounded to bfloat16.
    MXFP4 (power-of-two scales): the tile sums over all of K of the weights times their scales."""
    n, k = qt.shape
    g_size = qt.group_size
    v = code_values(qt)
    if qt.codebook == "e2m1":
        scales = qt.scales.double().repeat_interleave(g_size, dim=1)
        scales[scales < 2.0 ** -126] = 0  # denormal scales and weights read as zero (DAZ)
        scaled = f32(v * scales)
        assert torch.equal(scaled, v * scales)  # exact
        scaled[scaled.abs() < 2.0 ** -126] = 0
        acc = tile_sums(x, scaled, 0, k)
        return (acc if bias is None else f32(acc + bias.double())).float().to(torch.bfloat16)
    acc = torch.zeros(x.shape[0], n, dtype=torch.float64)
    for g in range(k // g_size):
        p = tile_sums(x, v, g * g_size, (g + 1) * g_size)
        acc = f32(acc + p * qt.scales.double()[None, :, g])
        if qt.offsets is not None:
            xsum = torch.zeros(x.shape[0], 1, dtype=torch.float64)
            for kk in range(g * g_size, (g + 1) * g_size):
                xsum = f32(xsum + x.double()[:, kk:kk + 1])
            acc = f32(acc - qt.offsets.double()[None, :, g] * xsum)
    if bias is not None:
        acc = f32(acc + bias.double())
    return acc.float().to(torch.bfloat16)


@pytest.mark.parametrize("k", [32, 96, 256])
def test_the_tiles_sum_two_chains_per_chunk(k):
    """The bfloat16 AMX kernel's float32 sums, seen through its bias (y = round(acc + b) is 0
    exactly when b = -acc), are the two-chain sequence for every element."""
    gen = torch.Generator().manual_seed(k)
    x = torch.randn(3, k, generator=gen).to(torch.bfloat16)
    w = torch.randn(64, k, generator=gen).to(torch.bfloat16)
    expected = tile_sums(x.float(), w.float(), 0, k)
    for row in range(3):
        y = cpu_kernels().amx_linear(x[row:row + 1].contiguous(), pack_amx_weight(w), (-expected[row]).float(), 64)
        assert torch.count_nonzero(y) == 0, row


def test_the_tiles_flush_denormals():
    """A denormal input, a denormal product and a denormal chain sum all count as zero."""
    x = torch.zeros(1, 32)
    w = torch.zeros(16, 32)
    x[0, 0], w[:, 0] = 1e-39, 1.0                       # denormal input
    x[0, 2], w[:, 2] = 2.0 ** -70, 2.0 ** -70           # denormal product
    x[0, 4], w[:, 4] = 1.5 * 2.0 ** -63, 2.0 ** -63     # even chain 1.5 * 2^-126 ...
    x[0, 5], w[:, 5] = 2.0 ** -63, -2.0 ** -63          # ... odd chain -2^-126: the sum is denormal
    y = cpu_kernels().amx_linear(x.to(torch.bfloat16), pack_amx_weight(w.to(torch.bfloat16)), None, 16)
    assert torch.count_nonzero(y) == 0


@pytest.mark.parametrize(("kind", "in_features", "out_features"),
                         [(kind, 128, 67) for kind in KINDS] + [("int8", 100, 40), ("int4-zero-points", 256, 40)])
def test_bits_are_the_tile_sequence_for_one_row_and_many(kind, in_features, out_features):
    qt = quantized(kind, out_features, in_features, seed=in_features + out_features)
    bias = torch.randn(out_features, generator=torch.Generator().manual_seed(3))
    layer = QuantizedLinear(qt, bias, cpu_kernels())
    assert layer.amx
    x = torch.randn(20, in_features, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    expected = tile_sequence(x.float(), qt, bias)
    assert torch.equal(layer(x), expected)                                          # tiles
    assert torch.equal(torch.cat([layer(x[i:i + 1]) for i in range(20)]), expected)  # one-row kernel


@pytest.mark.parametrize(("scales", "inputs"), [
    ((2.0 ** -100, 2.0 ** -126, 2.0 ** -127, 2.0 ** -128), 2.0 ** 115),  # the smallest in range; denormal ones
    ((2.0 ** -2, 2.0 ** 124, 2.0 ** 123, 2.0 ** 124), 2.0 ** -10),       # the largest in range
])
def test_mxfp4_scales_at_the_ends_of_the_exact_exponent_range(scales, inputs):
    """The tiles take MXFP4 weights with the scale's exponent added to theirs where every weight
    of a chunk's 16 columns is a normal number, and multiply otherwise: columns at the given
    scales (stored, halved: 2^-126 and 2^124 are the ends of that range) give the tile sequence's
    bits, scales and weights below the smallest normal counting as zero; inputs scaled to keep the
    sums normal and finite."""
    qt = quantized("mxfp4", 80, 128, seed=11)
    stored = qt.scales.clone()
    stored[:], stored[16:32], stored[32:48], stored[48:64] = scales
    qt = QuantizedTensor(qt.q, stored, None, 4, qt.group_size, "e2m1")
    bias = torch.randn(80, generator=torch.Generator().manual_seed(12))
    layer = QuantizedLinear(qt, bias, cpu_kernels())
    x = (torch.randn(20, 128, generator=torch.Generator().manual_seed(13)) * inputs).to(torch.bfloat16)
    expected = tile_sequence(x.float(), qt, bias)
    assert torch.isfinite(expected.float()).all()
    assert not torch.equal(expected[:, 16:64], bias[16:64].expand(20, -1).to(torch.bfloat16))
    assert torch.equal(layer(x), expected)


def test_one_row_mxfp4_scales_the_chains_only_where_that_is_exact():
    """The one-row kernel multiplies a chunk's chains by its power-of-two scale instead of each
    weight only where every partial value stays normal and finite both ways (its ScaleFields);
    rows built so that it would not: a tiny term beside a larger one in a chain (the scaled
    product is a denormal the tiles flush, the unscaled one is not), values near the largest
    float, and all of it at several scales. Each row alone equals its row among many (the tiles)."""
    qt = quantized("mxfp4", 64, 256, seed=21)
    scales = qt.scales.clone()
    scales[:16], scales[16:32], scales[32:48] = 2.0 ** -1, 2.0 ** -20, 2.0 ** 30
    qt = QuantizedTensor(qt.q, scales, None, 4, qt.group_size, "e2m1")
    layer = QuantizedLinear(qt, None, cpu_kernels())
    gen = torch.Generator().manual_seed(22)
    x = torch.zeros(24, 256)
    for row, (tiny, large) in enumerate([(2.0 ** -125, 2.0 ** -119), (2.0 ** -110, 2.0 ** -104),
                                         (2.0 ** -100, 2.0 ** -94), (2.0 ** -30, 2.0 ** -24)]):
        x[row, 0::4], x[row, 2::4] = tiny, large  # even chains: a tiny term, then a larger one
        x[row + 4, :] = torch.randn(256, generator=gen) * tiny
    x[8:12] = torch.randn(4, 256, generator=gen) * 2.0 ** 100
    x[12:16] = torch.randn(4, 256, generator=gen) * 2.0 ** 110
    x[16:] = torch.randn(8, 256, generator=gen)
    x = x.to(torch.bfloat16)
    many = layer(x).view(torch.int16)  # bits: the overflowing rows hold infinities and NaN
    assert torch.isfinite(many[16:].view(torch.bfloat16)).all() and not torch.isfinite(many[8:16].view(torch.bfloat16)).all()
    for row in range(24):
        assert torch.equal(layer(x[row:row + 1]).view(torch.int16), many[row:row + 1]), row


@pytest.mark.parametrize("kind", KINDS)
def test_rows_do_not_depend_on_the_batch(kind):
    """Row counts 1..70 (the one-row kernel, 1-4 A tiles, partial tiles) at several positions, of
    130 rows, and one and two threads: the same bits. The inputs include tiny values (flushed in
    both kernels)."""
    layer = QuantizedLinear(quantized(kind, 130, 896, seed=5), torch.randn(130), cpu_kernels())
    x = torch.randn(130, 896, generator=torch.Generator().manual_seed(6))
    x[::3, ::7] *= 2.0 ** -120  # near and below the smallest normal float
    x = x.to(torch.bfloat16)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        full = layer(x)
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for rows in (1, 2, 3, 15, 16, 17, 31, 33, 48, 63, 64, 65, 70):
                for start in {0, 130 - rows, 41}:
                    assert torch.equal(layer(x[start:start + rows]), full[start:start + rows]), (threads, rows, start)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("kind", KINDS)
def test_float32_activations_get_the_vector_kernel_and_the_layout_unpacks(kind):
    qt = quantized(kind, 70, 256, seed=7)
    tiles = QuantizedLinear(qt, None, cpu_kernels())
    vector = QuantizedLinear(qt, None, cpu_kernels(), amx=False)
    assert tiles.amx and not vector.amx
    assert torch.equal(tiles.dequantized_weight(), qt.dequantize())
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(8))
    assert torch.equal(tiles(x), vector(x))


def test_groups_the_tiles_cannot_take_use_the_vector_kernel():
    """GGUF Q6_K is int8 in groups of 16: not whole 32-input chunks."""
    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(9))
    q8 = quantize_int8(w)
    g16 = QuantizedTensor(q8.q, q8.scales.repeat(1, 4), None, 8, 16)
    assert not QuantizedLinear(g16, None, cpu_kernels()).amx
    with pytest.raises(ValueError, match="group size of K or a multiple of 32"):
        QuantizedLinear(g16, None, cpu_kernels(), amx=True)
    assert QuantizedLinear(quantize_weight(w, "int4", 64), None, cpu_kernels()).amx
