"""``amx_linear_silu_mul`` (amx_linear.cpp: SiLU-and-multiply in the AMX gate-up projection's
store, used by the decoder's C++ loop) has the bits of the two steps it replaces,
``silu_and_mul(amx_linear(x, [gate; up]))``, for any row count, row tail and input width."""

from __future__ import annotations

import pytest
import torch

from kvserve.kernels import cpu_kernels, cpu_kernels_available
from kvserve.model.invariant_linear import pack_amx_weight

pytestmark = pytest.mark.skipif(not cpu_kernels_available() or not cpu_kernels().amx_linear_available(),
                                reason="no AMX-BF16 tiles here")


@pytest.mark.parametrize(("in_features", "d"), [(896, 4864), (64, 16), (96, 48), (40, 32)])
def test_same_bits_as_projection_then_silu_and_mul(in_features, d):
    kernels = cpu_kernels()
    gen = torch.Generator().manual_seed(d)
    packed = pack_amx_weight((torch.randn(2 * d, in_features, generator=gen) * 0.05).to(torch.bfloat16))
    for rows in [1, 5, 16, 17, 31, 32, 33, 64, 100, 300]:
        x = (torch.randn(rows, in_features, generator=gen) * 3).to(torch.bfloat16)
        want = kernels.silu_and_mul(kernels.amx_linear(x, packed, None, 2 * d))
        got = kernels.amx_linear_silu_mul(x, packed, 2 * d)
        assert got.shape == (rows, d) and torch.equal(got.view(torch.int16), want.view(torch.int16))
        # A lone row (tiles configured for one row) gives the bits it has in the batch.
        for i in range(0, rows, 7):
            assert torch.equal(kernels.amx_linear_silu_mul(x[i : i + 1], packed, 2 * d), got[i : i + 1])


def test_refuses_a_width_that_does_not_pair_gate_and_up_panels():
    packed = pack_amx_weight(torch.randn(40, 64).to(torch.bfloat16))
    with pytest.raises(RuntimeError, match="multiple of 16"):
        cpu_kernels().amx_linear_silu_mul(torch.randn(3, 64).to(torch.bfloat16), packed, 40)
