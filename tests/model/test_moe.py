"""The mixture-of-experts block (``kvserve.model.moe``): routing (ties, renormalisation), what
config.json switches mean and which ones are refused by name, quantized experts beside a float
router, and the batch-invariant sigmoid of Qwen2-MoE's shared-expert gate. Logits and greedy
tokens against transformers are in test_model_numerics.py and test_generate.py (the MoE variants of
model_fixtures.VARIANTS); the engine's batching, chunking, caching and preemption on MoE models in
tests/engine/test_moe_engine.py."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch
from model_fixtures import VARIANTS, flat_prompt_logits, random_moe_block, relative_error, sequential_block_tables

from kvserve.config import QuantizationConfig
from kvserve.errors import CheckpointError, ConfigError
from kvserve.kernels import cpu_kernels, cpu_kernels_available
from kvserve.model.arch_config import ModelArchConfig
from kvserve.model.invariant_linear import InvariantLinear
from kvserve.model.loader import load_model
from kvserve.model.moe import RouterLinear, SparseMoeBlock, route
from kvserve.model.quant_linear import QuantizedLinear
from kvserve.model.runner import ModelRunner

QWEN3_MOE = dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", vocab_size=256, hidden_size=64,
                 intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                 num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)


def test_ties_go_to_the_lowest_expert_and_weights_renormalise():
    logits = torch.tensor([[1.0, 3.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0, 2.0]])
    weights, ids = route(logits, 2, normalize=False)
    assert ids.tolist() == [[1, 2], [0, 1]]
    probs = torch.softmax(logits, -1)
    assert torch.equal(weights, torch.stack([probs[0, [1, 2]], probs[1, [0, 1]]]))
    normalised, _ = route(logits, 2, normalize=True)
    assert torch.equal(normalised, weights / weights.sum(-1, keepdim=True))
    if cpu_kernels_available():  # the C++ router: the same choice, its own exp
        k_weights, k_ids = cpu_kernels().moe_route(logits, 2, False)
        assert k_ids.tolist() == [[1, 2], [0, 1]]
        torch.testing.assert_close(k_weights, weights, rtol=1e-6, atol=0)
        k_normalised, _ = cpu_kernels().moe_route(logits.to(torch.bfloat16), 2, True)
        torch.testing.assert_close(k_normalised, normalised, rtol=1e-6, atol=0)


def test_sparse_layers_follow_decoder_sparse_step_and_mlp_only_layers():
    assert ModelArchConfig.from_dict(QWEN3_MOE).moe.sparse_layers == (0, 1, 2, 3)
    assert ModelArchConfig.from_dict({**QWEN3_MOE, "decoder_sparse_step": 2}).moe.sparse_layers == (1, 3)
    moe = ModelArchConfig.from_dict({**QWEN3_MOE, "mlp_only_layers": [0, 3]}).moe
    assert moe.sparse_layers == (1, 2) and not moe.norm_topk_prob and not moe.routing_weights_float32
    # transformers 5 writes Qwen3-MoE's expert count as num_local_experts
    renamed = {k: v for k, v in QWEN3_MOE.items() if k != "num_experts"} | {"num_local_experts": 8}
    assert ModelArchConfig.from_dict(renamed).moe.num_experts == 8
    mixtral = ModelArchConfig.from_dict({**QWEN3_MOE, "architectures": ["MixtralForCausalLM"], "num_experts": None,
                                         "num_local_experts": 4, "intermediate_size": 96}).moe
    assert (mixtral.num_experts, mixtral.intermediate_size, mixtral.norm_topk_prob, mixtral.routing_weights_float32) \
        == (4, 96, True, True)


@pytest.mark.parametrize(("field", "value", "words"), [
    ("num_experts_per_tok", 9, "num_experts_per_tok (9) must be in [1, 8]"),
    ("scoring_func", "sigmoid", "scoring_func 'sigmoid' is not supported"),
    ("n_group", 8, "MoE routing field n_group=8 is not supported"),
    ("routed_scaling_factor", 2.5, "MoE routing field routed_scaling_factor=2.5"),
    ("hidden_act", "gelu", "hidden_act 'gelu' is not supported"),
])
def test_unsupported_switches_are_refused_by_name(field, value, words):
    with pytest.raises(CheckpointError, match=words.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        ModelArchConfig.from_dict({**QWEN3_MOE, field: value})


GPT_OSS = {**QWEN3_MOE, "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "num_experts": None,
           "num_local_experts": 8, "intermediate_size": 32, "swiglu_limit": 1.5, "head_dim": 16}


def test_gpt_oss_routes_top_k_logits_then_softmax():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.5, 2.0], [2.0, 2.0, 2.0, 2.0, 2.0]])
    weights, ids = route(logits, 3, normalize=False, routing="topk_softmax")
    assert ids.tolist() == [[1, 2, 4], [0, 1, 2]]
    assert torch.equal(weights, torch.softmax(torch.tensor([[3.0, 3.0, 2.0], [2.0, 2.0, 2.0]]), -1))
    if cpu_kernels_available():
        k_weights, k_ids = cpu_kernels().moe_route(logits.to(torch.bfloat16), 3, False, "topk_softmax")
        assert k_ids.tolist() == [[1, 2, 4], [0, 1, 2]]
        torch.testing.assert_close(k_weights, weights, rtol=1e-6, atol=0)


@pytest.mark.skipif(not cpu_kernels_available(), reason="no C++ compiler for the kernels")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_the_block_sums_each_tokens_experts_in_expert_order(family, dtype):
    """The C++ block's output for one token of a batch is the reference sum, computed here for
    that token alone, expert by expert in increasing expert id (the linears batch-invariant):
    Qwen3-MoE's softmax-then-top-k and SwiGLU; GPT-OSS's top-k-then-softmax, router and expert
    biases and clamped SwiGLU (each operation rounded as the torch path rounds it)."""
    config = {**QWEN3_MOE, "norm_topk_prob": True} if family == "qwen3_moe" else GPT_OSS
    arch = ModelArchConfig.from_dict(config)
    block = random_moe_block(arch, dtype)
    x = torch.randn(5, 64).to(dtype)
    kernels = cpu_kernels()
    with torch.no_grad():
        out = block(x)  # the C++ layer (moe.cpp)
        assert block.kernel_layer(dtype) is not None
        if dtype == torch.float32:  # torch's own softmax exp
            torch.testing.assert_close(out, block.torch_forward(x), rtol=1e-5, atol=1e-6)
        for t in range(5):
            logits = block.gate(x[t : t + 1]).contiguous()
            weights, ids = kernels.moe_route(logits, 2, arch.moe.norm_topk_prob, arch.moe.routing)
            assert ids[0].tolist() == route(logits, 2, arch.moe.norm_topk_prob, arch.moe.routing)[1][0].tolist()
            want = torch.zeros(64, dtype=dtype)
            for w, e in sorted(zip(weights[0].tolist(), ids[0].tolist()), key=lambda pair: pair[1]):
                want = want + block.experts[e](x[t : t + 1])[0] * torch.tensor(w).to(dtype)
            assert torch.equal(out[t], want)


@pytest.mark.skipif(not cpu_kernels_available(), reason="no C++ compiler for the kernels")
@pytest.mark.parametrize(("method", "variant"), [("int8", "qwen2_moe"), ("int4", "qwen3_moe")])
def test_quantized_experts_keep_a_float_router(tiny_checkpoint, method, variant):
    path, _ = tiny_checkpoint(variant)
    quantized = load_model(path, quantization=QuantizationConfig(method=method, group_size=32))
    block = quantized.model.model.layers[0].mlp
    assert isinstance(block.gate, RouterLinear)
    assert isinstance(block.experts[0].gate_up_proj, QuantizedLinear) and isinstance(block.experts[4].down_proj,
                                                                                      QuantizedLinear)
    if block.shared_expert is not None:
        assert isinstance(block.shared_expert_gate, RouterLinear) and isinstance(block.shared_expert.down_proj,
                                                                                 QuantizedLinear)
    assert "int8" in quantized.weight_format or "int4" in quantized.weight_format
    # The reference: the same model with every quantized linear an nn.Linear of its dequantized
    # weight (and the loader's float layers as they are).
    reference = copy.deepcopy(quantized.model)
    for parent in list(reference.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, QuantizedLinear):
                linear = torch.nn.Linear(child.in_features, child.out_features, bias=child.bias is not None)
                with torch.no_grad():
                    linear.weight.copy_(child.dequantized_weight())
                    if child.bias is not None:
                        linear.bias.copy_(child.bias)
                setattr(parent, name, linear)
    prompts = [[(7 * i + 3) % 256 for i in range(19)], [42, 5, 9]]
    tables = sequential_block_tables([len(p) for p in prompts], 4, start=1)
    ours = flat_prompt_logits(ModelRunner(quantized, 32, 4), prompts, tables)
    ref = flat_prompt_logits(ModelRunner(dataclasses.replace(quantized, model=reference), 32, 4), prompts, tables)
    for a, b in zip(ours, ref):
        assert relative_error(a, b) < 1e-4


@pytest.mark.skipif(not cpu_kernels_available(), reason="no C++ compiler for the kernels")
def test_the_routers_run_on_the_invariant_kernels(tiny_checkpoint):
    path, _ = tiny_checkpoint("mixtral")
    block = load_model(path).model.model.layers[1].mlp
    from kvserve.model.invariant_linear import use_invariant_linears

    use_invariant_linears(block)
    assert isinstance(block.gate, InvariantLinear) and isinstance(block.experts[3].down_proj, InvariantLinear)


@pytest.mark.skipif(not cpu_kernels_available(), reason="no C++ compiler for the kernels")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sigmoid_kernel_bits_do_not_depend_on_the_count(dtype):
    x = (torch.randn(301, generator=torch.Generator().manual_seed(4)) * 6).to(dtype)
    kernels = cpu_kernels()
    whole = kernels.sigmoid(x)
    assert torch.equal(torch.cat([kernels.sigmoid(x[i : i + 1]) for i in range(301)]), whole)
    assert torch.equal(kernels.sigmoid(x[:37]), whole[:37])
    torch.testing.assert_close(whole.float(), torch.sigmoid(x.float()).to(dtype).float(), rtol=1e-5 if dtype == torch.float32 else 1e-2, atol=1e-6)


def test_moe_models_refuse_lora_by_name(tiny_checkpoint):
    from kvserve.config import LoRAConfig
    from kvserve.lora.registry import LoRARegistry

    path, _ = tiny_checkpoint("qwen3_moe")
    arch = ModelArchConfig.from_file(path / "config.json")
    with pytest.raises(ConfigError, match="LoRA adapters on mixture-of-experts models .Qwen3MoeForCausalLM."):
        LoRARegistry(LoRAConfig(), arch)


@pytest.mark.parametrize("variant", ["llama", "qwen2", "mixtral", "mixtral_top1", "qwen2_moe", "qwen3_moe", "gemma3"])
def test_the_memory_plan_counts_transformers_parameters(tiny_checkpoint, variant):
    from kvserve.model.memory_plan import check_fits, memory_plan

    path, hf_model = tiny_checkpoint(variant)
    arch = ModelArchConfig.from_file(path / "config.json")
    plan = memory_plan(arch, "bfloat16", QuantizationConfig())
    assert plan.total_params == sum(p.numel() for p in hf_model.parameters())
    if arch.moe is None:
        assert plan.active_params == plan.total_params
    else:
        one_expert = sum(p.numel() for p in hf_model.model.layers[0].mlp.experts.parameters()) // arch.moe.num_experts
        idle = len(arch.moe.sparse_layers) * (arch.moe.num_experts - arch.moe.top_k) * one_expert
        assert plan.active_params == plan.total_params - idle and "active per token" in plan.describe()
    check_fits(plan, plan.weight_bytes, "m")
    with pytest.raises(ConfigError, match=r"^m: .*M parameters.* MiB of weights do not fit in the .* MiB of memory "
                                          r"available here; use --quantization int8 or int4"):
        check_fits(plan, plan.weight_bytes - 1, "m")


def test_variants_cover_the_switches():
    """The MoE fixtures exercise each switch of the issue: norm_topk_prob both ways, shared experts
    on and off, a dense layer among sparse ones, decoder_sparse_step, a sliding window."""
    arch_of = {name: ModelArchConfig.from_dict({**QWEN3_MOE, "architectures": [a], **fields})
               for name, (a, fields) in VARIANTS.items() if "moe" in name or "mixtral" in name}
    moes = {name: arch.moe for name, arch in arch_of.items()}
    assert {m.norm_topk_prob for m in moes.values()} == {True, False}
    assert {m.shared_expert_intermediate_size > 0 for m in moes.values()} == {True, False}
    assert moes["qwen2_moe"].sparse_layers == (0, 2) and moes["qwen3_moe_step2"].sparse_layers == (1,)
    assert arch_of["mixtral"].sliding_window == 6
    assert json.dumps(VARIANTS["mixtral_top1"][1]["num_experts_per_tok"]) == "1"
