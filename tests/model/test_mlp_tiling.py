"""The MLP runs long prefill batches in row tiles on the CPU (``MLP_TILE_ROWS``); every row must
come out as it does untiled and as it does alone (batch invariance), in float32 and bfloat16."""

import pytest
import torch

from kvserve.kernels import cpu_kernels_available
from kvserve.model.arch_config import ModelArchConfig
from kvserve.model.invariant_linear import use_invariant_linears
from kvserve.model.llama import MLP_TILE_ROWS, LlamaMLP

pytestmark = pytest.mark.skipif(not cpu_kernels_available(), reason="no C++ compiler for the kernels")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tiled_rows_equal_untiled_and_alone(dtype):
    arch = ModelArchConfig.from_dict({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
        "intermediate_size": 160, "num_attention_heads": 4, "num_hidden_layers": 1, "vocab_size": 32,
    })
    torch.manual_seed(0)
    mlp = LlamaMLP(arch).to(dtype)
    assert use_invariant_linears(mlp) == 2
    rows = 2 * MLP_TILE_ROWS + 37
    x = torch.randn(rows, 64, generator=torch.Generator().manual_seed(1)).to(dtype)
    with torch.inference_mode():
        tiled = mlp(x)
        assert tiled.shape == (rows, 64)
        assert torch.equal(tiled, mlp._swiglu(x))
        for row in (0, MLP_TILE_ROWS - 1, MLP_TILE_ROWS, rows - 1):
            assert torch.equal(tiled[row : row + 1], mlp(x[row : row + 1]))
