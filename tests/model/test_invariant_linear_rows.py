"""A row of a bfloat16 linear must not depend on how many rows share the call: oneDNN's one-row
kernel sums ``in_features > 1024`` in another order than its kernels for two or more rows, so a
request decoding alone (every linear at one row) drifted from the same request decoding in a
batch. ``PrepackedLinear`` never runs one row alone through that kernel; up to 1,024 inputs it
may, and these tests are what says the orders still agree there (on this machine's oneDNN)."""

import pytest
import torch
from torch import nn

from kvserve.model.arch_config import ModelArchConfig
from kvserve.model.layers import PrepackedLinear, prepack_available, prepack_cpu_linears
from kvserve.model.llama import LlamaMLP

pytestmark = pytest.mark.skipif(not prepack_available(), reason="torch built without oneDNN")


@pytest.mark.parametrize(("in_features", "out_features"), [(64, 256), (896, 512), (1024, 256), (1025, 128),
                                                          (2048, 256), (4864, 128)])
def test_a_row_alone_equals_the_row_in_a_batch(in_features, out_features):
    gen = torch.Generator().manual_seed(in_features)
    linear = nn.Linear(in_features, out_features, bias=False).to(torch.bfloat16)
    packed = PrepackedLinear(linear)
    x = torch.randn(48, in_features, generator=gen).to(torch.bfloat16)
    with torch.inference_mode():
        batched = packed(x)
        alone = torch.cat([packed(x[i : i + 1]) for i in range(48)])
        assert torch.equal(alone, batched)
        assert torch.equal(packed(x[5]), batched[5])  # 1-D input: one row too
        assert packed(x[:0]).shape == (0, out_features)


def test_mlp_decode_row_equals_prefill_row():
    """The Qwen2.5-0.5B down_proj width (intermediate 4,864): one row through the MLP alone, as
    a batch-1 decode step runs it, equals the same row inside a larger batch."""
    arch = ModelArchConfig.from_dict({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
        "intermediate_size": 4864, "num_attention_heads": 4, "num_hidden_layers": 1, "vocab_size": 32,
    })
    torch.manual_seed(0)
    mlp = LlamaMLP(arch).to(torch.bfloat16)
    assert prepack_cpu_linears(mlp) == 2
    x = torch.randn(40, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    with torch.inference_mode():
        batched = mlp(x)
        assert torch.equal(torch.cat([mlp(x[i : i + 1]) for i in range(40)]), batched)
