"""The fused elementwise kernels behind RMSNorm, SiluAndMul and RotaryEmbedding.apply, the C++ ones
(kernels/csrc/elementwise.cpp) and the Triton ones for GPUs (kernels/triton_elementwise.py, run
by Triton's interpreter here), against the torch operators they replace (transformers' steps):
rotary bit-identical in bfloat16, RMSNorm and SiLU within float32 rounding of torch's (bfloat16: at
most one bfloat16 step apart), residual sums exact, and every row the same alone as in a batch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kvserve.kernels import cpu_kernels
from kvserve.kernels.triton_elementwise import TritonElementwise
from kvserve.model.layers import RMSNorm, RotaryEmbedding, SiluAndMul

DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(params=["cpu", "triton"])
def ops(request):
    """The kernels a layer calls: the C++ library, or the Triton kernels (interpreted)."""
    if request.param == "cpu":
        if cpu_kernels() is None:
            pytest.skip("no C++ compiler for the kernels")
        return cpu_kernels()
    pytest.importorskip("triton")
    return TritonElementwise()


def _on(layer, ops):
    layer.ops = ops
    return layer


def _torch_rms_norm(norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    x32 = x.to(torch.float32)
    variance = x32.pow(2).mean(-1, keepdim=True)
    return norm.weight * (x32 * torch.rsqrt(variance + norm.eps)).to(x.dtype)


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    """float32: within a few ulp; bfloat16: equal or one bfloat16 step apart, and rarely."""
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-6)
        return
    diff = (got.float() - want.float()).abs()
    assert (diff <= want.float().abs() * 2**-7 + 1e-30).all()
    assert (got != want).float().mean() < 0.01


@torch.no_grad()
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_and_residual_add(dtype, ops):
    gen = torch.Generator().manual_seed(1)
    norm = _on(RMSNorm(200, eps=1e-6).to(dtype), ops)
    norm.weight.copy_(torch.randn(200, generator=gen))
    x, residual = (torch.randn(37, 200, generator=gen).mul(4).to(dtype) for _ in range(2))
    _close(norm(x), _torch_rms_norm(norm, x))
    normed, total = norm.add_and_norm(x, residual)
    assert torch.equal(total, residual + x)
    _close(normed, _torch_rms_norm(norm, residual + x))
    for r in (0, 17, 36):  # a row alone gives the bits it has in the batch
        alone, alone_total = norm.add_and_norm(x[r : r + 1], residual[r : r + 1])
        assert torch.equal(alone, normed[r : r + 1]) and torch.equal(alone_total, total[r : r + 1])
    heads = x.view(37, 8, 25)  # [T, heads, head_dim], as q_norm / k_norm see it
    per_head = _on(RMSNorm(25).to(dtype), ops)
    _close(per_head(heads), _torch_rms_norm(per_head, heads))


@torch.no_grad()
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul(dtype, ops):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(21, 2 * 100, generator=gen).mul(6).to(dtype)
    gate, up = x.chunk(2, dim=-1)
    got = _on(SiluAndMul(), ops)(x)
    _close(got, F.silu(gate) * up)
    assert torch.equal(_on(SiluAndMul(), ops)(x[5:6]), got[5:6])


@torch.no_grad()
@pytest.mark.parametrize("head_dim", [64, 128])
def test_rotary_bfloat16_bit_identical_to_torch_ops(head_dim, ops):
    gen = torch.Generator().manual_seed(head_dim)
    rotary = RotaryEmbedding(head_dim, 1e6, None)
    positions = torch.tensor([0, 5, 99, 4000, 7, 31999])
    cos, sin = rotary.cos_sin(positions, torch.bfloat16)
    # q as a view into a fused qkv output (rows strided), values from tiny to huge
    qkv = torch.randn(6, 14 * head_dim + 64, generator=gen) * torch.logspace(-30, 30, 14 * head_dim + 64)
    q = qkv.to(torch.bfloat16)[:, : 14 * head_dim].reshape(6, 14, head_dim)
    half = head_dim // 2
    want = q * cos[:, None, :] + torch.cat((-q[..., half:], q[..., :half]), dim=-1) * sin[:, None, :]
    got = RotaryEmbedding.apply(q, cos, sin, ops)
    assert got.is_contiguous() and torch.equal(got, want)
    assert torch.equal(RotaryEmbedding.apply(q[3:4], cos[3:4], sin[3:4], ops), got[3:4])
