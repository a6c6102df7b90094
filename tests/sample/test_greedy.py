"""greedy_argmax (the C++ argmax_rows kernel on CPU) against torch.argmax of the float32 upcast."""

import pytest
import torch

from kvserve.kernels import cpu_kernels, cpu_kernels_available
from kvserve.sample.greedy import greedy_argmax

pytestmark = pytest.mark.skipif(not cpu_kernels_available(), reason="no C++ compiler for the kernels")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("vocab", [1, 5, 16, 17, 1000, 151_936])
def test_matches_torch_argmax(dtype, vocab):
    logits = torch.randn(37, vocab, generator=torch.Generator().manual_seed(vocab)).to(dtype)
    assert torch.equal(greedy_argmax(logits, cpu_kernels()), logits.float().argmax(dim=1))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_ties_pick_the_first_index(dtype):
    # Values in {-3..2}: every row has many tied maxima, in different lanes of the 16-wide loop.
    logits = torch.randint(-3, 3, (50, 333), generator=torch.Generator().manual_seed(1)).to(dtype)
    expected = logits.float().argmax(dim=1)
    assert torch.equal(greedy_argmax(logits, cpu_kernels()), expected)
    assert all(logits[i, : expected[i]].max() < logits[i, expected[i]] for i in range(50) if expected[i] > 0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_nan_and_infinities_follow_torch(dtype):
    logits = torch.full((4, 100), float("-inf"), dtype=dtype)
    logits[1, 70], logits[1, 50] = float("nan"), float("nan")  # first NaN wins
    logits[2, 99] = 1.0  # in the tail after the last full 16-lane block
    logits[3, 3], logits[3, 90] = float("inf"), float("nan")
    assert greedy_argmax(logits, cpu_kernels()).tolist() == [0, 50, 99, 90]
    assert torch.equal(greedy_argmax(logits, cpu_kernels()), logits.float().argmax(dim=1))


def test_non_contiguous_and_other_dtypes_fall_back_or_copy():
    base = torch.randn(8, 64, generator=torch.Generator().manual_seed(2))
    view = base.t().contiguous().t()  # non-contiguous rows
    assert torch.equal(greedy_argmax(view, cpu_kernels()), view.argmax(dim=1))
    half = base.half()
    assert torch.equal(greedy_argmax(half, cpu_kernels()), half.argmax(dim=1))
