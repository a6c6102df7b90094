"""oneDNN-prepacked bfloat16 linears: bit-identical to ``F.linear`` at every row count, and a
whole model run through ``ModelRunner`` (which prepacks) gives the same logits as without."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from model_fixtures import flat_prompt_logits
from torch import nn

from kvserve.model.layers import MergedLinear, PrepackedLinear, prepack_available, prepack_cpu_linears
from kvserve.model.loader import load_model
from kvserve.model.runner import ModelRunner

pytestmark = pytest.mark.skipif(not prepack_available(), reason="torch built without oneDNN")


@pytest.mark.parametrize("bias", [True, False])
def test_bit_identical_to_f_linear_for_any_rows(bias):
    gen = torch.Generator().manual_seed(0)
    linear = nn.Linear(96, 80, bias=bias).to(torch.bfloat16)
    x = torch.randn(70, 96, generator=gen).to(torch.bfloat16)
    packed = PrepackedLinear(linear)
    for rows in (1, 2, 7, 16, 33, 70):
        assert torch.equal(packed(x[:rows]), F.linear(x[:rows], linear.weight, linear.bias))
    assert torch.equal(packed(x.view(7, 10, 96)), F.linear(x, linear.weight, linear.bias).view(7, 10, 80))


def test_replaces_bf16_cpu_linears_only():
    model = nn.Sequential(nn.Linear(8, 8), MergedLinear(8, [4, 4], ["a", "b"], bias=False))
    assert prepack_cpu_linears(model) == 0  # float32: left alone
    model = model.to(torch.bfloat16)
    assert prepack_cpu_linears(model) == 2
    assert all(isinstance(m, PrepackedLinear) for m in model)


def test_runner_logits_unchanged_by_prepacking(tiny_checkpoint):
    path, _ = tiny_checkpoint("qwen2", torch.bfloat16)
    prompts, tables = [[3, 1, 4, 1, 5, 9], [2, 7]], [[0], [1]]
    runner = ModelRunner(load_model(path), num_blocks=4, block_size=16)
    assert runner.num_prepacked_linears > 0
    plain = ModelRunner(load_model(path), num_blocks=4, block_size=16, prepack_linears=False)
    assert plain.num_prepacked_linears == 0
    for ours, theirs in zip(flat_prompt_logits(runner, prompts, tables), flat_prompt_logits(plain, prompts, tables)):
        assert torch.equal(ours, theirs)
