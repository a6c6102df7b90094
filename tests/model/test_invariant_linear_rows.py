"""Batch invariance of ``InvariantLinear``: a row's output bits do not depend on how many rows
share the call, where the row sits among them, or the thread count (float32 and bfloat16, shapes
that are and are not multiples of the kernel's tiles). MKL's float32 sgemm and oneDNN's bfloat16
kernels failed this (rows differed between M = 1, small M and large M)."""

import pytest
import torch
from torch import nn

from kvserve.kernels import cpu_kernels, cpu_kernels_available
from kvserve.model.arch_config import ModelArchConfig
from kvserve.model.invariant_linear import InvariantLinear, use_invariant_linears
from kvserve.model.llama import LlamaMLP

pytestmark = pytest.mark.skipif(not cpu_kernels_available(), reason="no C++ compiler for the kernels")

BIG = 1030  # several row blocks and a partial one


# Every path a CPU runs: the vector FMA path (float32 and bfloat16), AMX tiles (bfloat16) where
# the CPU has them.
PATHS = [(torch.float32, False), (torch.bfloat16, False)]
if cpu_kernels_available() and cpu_kernels().amx_linear_available():
    PATHS.append((torch.bfloat16, True))


def _layer(in_features: int, out_features: int, dtype: torch.dtype, amx: bool | None = None) -> InvariantLinear:
    torch.manual_seed(in_features + out_features)
    return InvariantLinear(nn.Linear(in_features, out_features).to(dtype), cpu_kernels(), amx=amx)


@pytest.mark.parametrize(("dtype", "amx"), PATHS)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("in_features", "out_features"), [(64, 48), (131, 37), (896, 160), (1025, 17), (4864, 40)])
def test_every_row_count_and_position_gives_the_same_bits(dtype, amx, threads, in_features, out_features):
    torch.set_num_threads(threads)  # restored by the conftest fixture
    layer = _layer(in_features, out_features, dtype, amx)
    x = torch.randn(BIG, in_features, generator=torch.Generator().manual_seed(5)).to(dtype)
    with torch.inference_mode():
        full = layer(x)
        for rows in range(1, 71):
            for start in {0, 70 - rows, (BIG - rows) // 2, BIG - rows}:
                assert torch.equal(layer(x[start : start + rows]), full[start : start + rows]), (rows, start)
        for rows in (128, 257, 512, 700):
            assert torch.equal(layer(x[BIG - rows :]), full[BIG - rows :])
        assert torch.equal(torch.cat([layer(x[i : i + 1]) for i in range(0, BIG, 7)]), full[::7])


@pytest.mark.parametrize("amx", sorted({amx for _, amx in PATHS}))
def test_thread_counts_agree(amx):
    layer = _layer(896, 1000, torch.bfloat16, amx)
    x = torch.randn(300, 896, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    results = []
    for threads in (1, 2, 3):
        torch.set_num_threads(threads)
        results.append(layer(x))
    assert torch.equal(results[0], results[1]) and torch.equal(results[0], results[2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mlp_decode_row_equals_prefill_row(dtype):
    """The Qwen2.5-0.5B down_proj width (intermediate 4,864): one row through the MLP alone, as
    a batch-1 decode step runs it, equals the same row inside a larger batch."""
    arch = ModelArchConfig.from_dict({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
        "intermediate_size": 4864, "num_attention_heads": 4, "num_hidden_layers": 1, "vocab_size": 32,
    })
    torch.manual_seed(0)
    mlp = LlamaMLP(arch).to(dtype)
    assert use_invariant_linears(mlp) == 2
    x = torch.randn(40, 64, generator=torch.Generator().manual_seed(1)).to(dtype)
    with torch.inference_mode():
        batched = mlp(x)
        assert torch.equal(torch.cat([mlp(x[i : i + 1]) for i in range(40)]), batched)
