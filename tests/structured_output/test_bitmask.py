"""The batched bitmask apply: kvserve's C++ kernel (CPU float32) and the portable torch path against a
bit-by-bit Python reference, with row selection and bitmasks narrower than the logits."""

from __future__ import annotations

import pytest
import torch

from kvserve.kernels import cpu_kernels
from kvserve.structured_output.bitmask import (
    allocate_token_bitmask,
    apply_token_bitmask_,
    apply_token_bitmask_torch_,
)


def reference(logits: torch.Tensor, bitmask: torch.Tensor, indices) -> torch.Tensor:
    out = logits.clone()
    rows = range(logits.shape[0]) if indices is None else indices
    for r in rows:
        words = bitmask[r].tolist()
        for t in range(logits.shape[1]):
            if t >= 32 * len(words) or not (words[t // 32] >> (t % 32)) & 1:
                out[r, t] = float("-inf")
    return out


def random_case(seed: int, rows: int, vocab: int, words: int):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen)
    bitmask = torch.randint(-2**31, 2**31 - 1, (rows, words), dtype=torch.int32, generator=gen)
    bitmask[0, 0] = -1  # all allowed words and none allowed words both appear
    bitmask[-1, -1] = 0
    return logits, bitmask


@pytest.mark.parametrize("vocab,words", [(70, 3), (64, 2), (100, 3), (33, 2)])
@pytest.mark.parametrize("indices", [None, [0, 2], [3], []])
def test_apply_equals_the_bitwise_reference(vocab, words, indices):
    logits, bitmask = random_case(vocab + words, 4, vocab, words)
    expected = reference(logits, bitmask, indices)
    paths = {"ours": lambda *args: apply_token_bitmask_(*args, cpu_kernels()),
             "without kvserve's kernels": lambda *args: apply_token_bitmask_(*args, None),
             "torch": apply_token_bitmask_torch_}
    for name, apply in paths.items():
        got = logits.clone()
        apply(got, bitmask, indices)
        assert torch.equal(got, expected), name


def test_bitmask_narrower_than_logits_bans_the_rest():
    logits, bitmask = random_case(1, 2, 80, 2)  # covers 64 of 80 tokens
    got = logits.clone()
    apply_token_bitmask_(got, bitmask, None, cpu_kernels())
    assert torch.equal(got, reference(logits, bitmask, None))
    assert torch.isinf(got[:, 64:]).all()


def test_bf16_logits_take_the_torch_path():
    logits, bitmask = random_case(2, 3, 96, 3)
    got = logits.to(torch.bfloat16)
    apply_token_bitmask_(got, bitmask, [1], cpu_kernels())
    assert torch.equal(got.float(), reference(logits.to(torch.bfloat16).float(), bitmask, [1]))


def test_allocate_is_all_allowed_and_shapes_are_checked():
    bitmask = allocate_token_bitmask(2, 151_936)
    assert bitmask.shape == (2, 4748) and bitmask.dtype == torch.int32
    assert (bitmask == -1).all()
    with pytest.raises(ValueError):
        apply_token_bitmask_(torch.zeros(3, 10), allocate_token_bitmask(2, 10), None, cpu_kernels())
    with pytest.raises(ValueError):
        apply_token_bitmask_(torch.zeros(2, 10), allocate_token_bitmask(2, 10).long(), None, cpu_kernels())
