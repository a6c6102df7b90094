"""The experts of an MoE block in Triton's grouped GEMMs (``kvserve/kernels/triton_moe.py``, the
CUDA path of ``SparseMoeBlock``) under Triton's interpreter (tests/conftest.py sets
``TRITON_INTERPRET=1``): the pairs' layout, the block against its torch code for each family's
routing, biases, activation and weight products (float experts within the sums' rounding;
quantized experts bit for bit against the same products one expert at a time), a token alone
against the same token in a batch, and an expert-parallel share."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvserve.model.arch_config import ModelArchConfig
from kvserve.model.moe import SparseMoeBlock
from kvserve.model.quant_linear import QuantizedLinear
from kvserve.model.quant_tensor import quantize_int4, quantize_mxfp4

pytest.importorskip("triton")

from kvserve.kernels.triton_moe import TritonMoe, align_pairs  # noqa: E402
from kvserve.kernels.triton_quant_linear import TritonQuantLinear  # noqa: E402

BASE = dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", vocab_size=256, hidden_size=64,
            intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32, norm_topk_prob=True)
FAMILIES = {
    "qwen3_moe": BASE,
    # routing weights multiplied in float32, top 2 of 4
    "mixtral": {**BASE, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_experts": None,
                "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 32},
    # router and expert biases, top-k then softmax, clamped SwiGLU
    "gpt_oss": {**BASE, "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "num_experts": None,
                "num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 32, "swiglu_limit": 1.5,
                "head_dim": 16},
    # a shared expert behind a sigmoid gate, top-k not renormalised
    "qwen2_moe": {**BASE, "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "num_experts": 6,
                  "num_experts_per_tok": 2, "shared_expert_intermediate_size": 48, "norm_topk_prob": False},
}


def block_of(family: str, dtype: torch.dtype, held: tuple[int, int] | None = None) -> SparseMoeBlock:
    arch = ModelArchConfig.from_dict(FAMILIES[family])
    moe = dataclasses.replace(arch.moe, held_experts=held) if held else arch.moe
    torch.manual_seed(0)
    block = SparseMoeBlock(arch, moe).eval()
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return block.to(dtype)


def tokens(n: int, dtype: torch.dtype, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 64, generator=torch.Generator().manual_seed(seed)).to(dtype)


def test_pairs_are_laid_out_by_expert_in_whole_blocks():
    ids = torch.tensor([[2, 0], [0, 3], [2, 1], [0, 2], [5, 1]])  # expert 5 is not held (experts 0-3)
    layout = align_pairs(ids, 0, 4, 4)
    pair_at, block_expert = layout.pair_at.tolist(), layout.block_expert.tolist()
    # expert 0: pairs 1, 2, 6; expert 1: 5, 9; expert 2: 0, 4, 7; expert 3: 3 -- each padded to 4 rows
    assert pair_at[:16] == [1, 2, 6, -1, 5, 9, -1, -1, 0, 4, 7, -1, 3, -1, -1, -1]
    assert all(p == -1 for p in pair_at[16:]) and len(pair_at) % 4 == 0
    assert block_expert[:4] == [0, 1, 2, 3] and all(e == -1 for e in block_expert[4:])
    assert layout.row_of_pair.tolist() == [8, 0, 1, 12, 9, 4, 2, 10, -1, 5]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_float_experts_against_the_torch_code(family, dtype):
    block = block_of(family, dtype)
    x = tokens(7, dtype)
    with torch.no_grad():
        want = block.torch_forward(x)
        block.triton_moe = TritonMoe()
        got = block(x)
    assert None not in block._triton_tables.values() and got.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    else:  # the products' float32 sums in another order, each output rounded to bfloat16
        torch.testing.assert_close(got.float(), want.float(), rtol=2**-6, atol=2e-2)


def quantize_experts(block: SparseMoeBlock, kind: str) -> None:
    ops = TritonQuantLinear()

    def quantized(linear):
        w = linear.weight.detach().float()
        return QuantizedLinear(quantize_mxfp4(w) if kind == "mxfp4" else quantize_int4(w, 32), None, None, triton=ops)

    for expert in block.experts:
        expert.gate_up_proj, expert.down_proj = quantized(expert.gate_up_proj), quantized(expert.down_proj)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize(("family", "kind"), [("gpt_oss", "mxfp4"), ("qwen3_moe", "int4"), ("mixtral", "int4")])
def test_quantized_experts_equal_the_experts_one_at_a_time(family, kind, dtype):
    """Quantized experts: the grouped GEMMs give the bits of the torch loop over the same experts'
    Triton linears (the same products and sums, the same rounding of each step)."""
    block = block_of(family, dtype)
    quantize_experts(block, kind)
    x = tokens(9, dtype)
    with torch.no_grad():
        want = block.torch_forward(x)
        block.triton_moe = TritonMoe()
        got = block(x)
    assert None not in block._triton_tables.values()
    assert torch.equal(got, want)


@pytest.mark.parametrize("family", ["gpt_oss", "qwen2_moe"])
def test_a_token_alone_and_in_a_batch(family):
    block = block_of(family, torch.bfloat16)
    block.triton_moe = TritonMoe()
    x = tokens(12, torch.bfloat16)
    with torch.no_grad():
        batch = block(x)
        assert torch.equal(block(x[4:5]), batch[4:5])
        assert torch.equal(block(x[2:7]), batch[2:7])


def test_an_expert_parallel_share_adds_only_its_experts():
    """A rank holding experts 4-7 of 8: the tokens routed elsewhere get nothing from it (the
    all-reduce adds the other rank's share)."""
    block = block_of("qwen3_moe", torch.float32, held=(4, 8))
    x = tokens(24, torch.float32)
    with torch.no_grad():
        want = block.torch_forward(x)
        block.triton_moe = TritonMoe()
        got = block(x)
        elsewhere = (block._route(x)[1] < 4).all(dim=1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert 0 < int(elsewhere.sum()) < 24 and bool((got[elsewhere] == 0).all()) and bool((got[~elsewhere] != 0).all())
