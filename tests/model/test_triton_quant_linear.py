"""The Triton weight-only linear (``kvserve/kernels/triton_quant_linear.py``, the CUDA path of
``QuantizedLinear``) under Triton's interpreter (tests/conftest.py sets ``TRITON_INTERPRET=1``):
the packed layout round-trips, every format's products against a float64 sum of the dequantized
weights, rows identical whatever the batch holds, and the layer's Triton path against its
dequantize-per-call path."""

from __future__ import annotations

import pytest
import torch
from model_fixtures import quantized_weight as quantized

from kvserve.model.quant_linear import QuantizedLinear

pytest.importorskip("triton")

from kvserve.kernels.triton_quant_linear import TritonQuantLinear, pack, unpack  # noqa: E402

KINDS = ["int8", "int4-symmetric", "int4-zero-points", "mxfp4"]
# (K, N): K/2 below one step of packed rows; groups across the low/high halves' boundary (K/2 = 80
# with groups of 32); several steps (K = 320: 160 packed rows) and N past one 64-column block.
SHAPES = [(64, 24), (160, 70), (320, 130)]


def inputs(m: int, k: int, dtype: torch.dtype, seed: int = 1) -> torch.Tensor:
    return torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).to(dtype)


def check_close(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None):
    """``out`` against the float64 sum over the weights rounded to x's dtype: float32 within a
    float32 sum's error bound, bfloat16 within one rounding of it."""
    weights = w.to(x.dtype).double()
    exact = x.double() @ weights.T + (0 if bias is None else bias.double())
    magnitude = x.double().abs() @ weights.abs().T
    error = (out.double() - exact).abs()
    if x.dtype == torch.float32:
        assert bool((error <= 2 * x.shape[1] * 2.0**-24 * magnitude + 1e-30).all()), float(error.max())
    else:
        assert bool((error <= 2.0**-8 * exact.abs() + 2 * x.shape[1] * 2.0**-24 * magnitude).all()), float(error.max())


@pytest.mark.parametrize("kind", KINDS)
def test_pack_round_trips(kind):
    weight = quantized(kind, 70, 160)
    packed = pack(weight)
    assert packed.codes.shape == ((160, 70) if kind == "int8" else (80, 70))
    back = unpack(packed, weight.scales.dtype, None if weight.offsets is None else weight.offsets.dtype)
    assert torch.equal(back.q, weight.q) and torch.equal(back.scales, weight.scales)
    assert (back.offsets is None) == (weight.offsets is None)
    if weight.offsets is not None:
        assert torch.equal(back.offsets, weight.offsets)
    assert torch.equal(back.dequantize(), weight.dequantize())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", SHAPES, ids=[f"k{k}-n{n}" for k, n in SHAPES])
def test_products_against_a_float64_sum(kind, dtype, shape):
    k, n = shape
    weight = quantized(kind, n, k)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(2))
    x = inputs(5, k, dtype)
    out = TritonQuantLinear().linear(x, pack(weight), bias)
    assert out.dtype == dtype and out.shape == (5, n)
    check_close(out, x, weight.dequantize(), bias)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("kind", ["int8", "int4-zero-points", "mxfp4"])
def test_a_row_is_the_same_alone_and_in_any_batch(kind, dtype):
    """One row, inside 5 rows (one 16-row tile) and inside 40 (a 64-row tile): the same bits."""
    weight = pack(quantized(kind, 70, 160))
    ops = TritonQuantLinear()
    batch = inputs(40, 160, dtype)
    alone = ops.linear(batch[3:4], weight, None)
    assert torch.equal(ops.linear(batch[:5], weight, None)[3:4], alone)
    assert torch.equal(ops.linear(batch, weight, None)[3:4], alone)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_the_layer_takes_the_triton_path(dtype):
    """``QuantizedLinear`` with the Triton kernels: the kernel's output for any leading shape, the
    checkpoint form of the weight kept only packed, and the same products as its
    dequantize-per-call path (within the sums' rounding), act-order permutation included."""
    weight = quantized("int4-zero-points", 70, 160)
    bias = torch.randn(70, generator=torch.Generator().manual_seed(3))
    perm = torch.randperm(160, generator=torch.Generator().manual_seed(4))
    ops = TritonQuantLinear()
    layer = QuantizedLinear(weight, bias, None, input_perm=perm, triton=ops)
    fallback = QuantizedLinear(weight, bias, None, input_perm=perm)
    assert layer.weight is None and fallback.weight is not None
    assert torch.equal(layer.dequantized_weight(), fallback.dequantized_weight())
    x = inputs(6, 160, dtype).view(2, 3, 160)
    out = layer(x)
    assert out.shape == (2, 3, 70) and out.dtype == dtype
    assert torch.equal(out, ops.linear(x.reshape(6, 160).index_select(1, perm), pack(weight), layer.bias).view(2, 3, 70))
    check_close(out.reshape(6, 70), x.reshape(6, 160), layer.dequantized_weight(), bias)
    # the dequantize-per-call path (CUDA without Triton) gives the same products: it once took the
    # permuted inputs against the weight in its original order (in bfloat16 it rounds the bias first)
    if dtype == torch.float32:
        check_close(fallback(x).reshape(6, 70), x.reshape(6, 160), layer.dequantized_weight(), bias)
    assert torch.allclose(out, fallback(x), **({"atol": 1e-4} if dtype == torch.float32 else {"atol": 0.02, "rtol": 2**-6}))
