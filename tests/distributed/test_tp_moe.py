"""Mixtures of experts under tensor parallelism (``kvserve.distributed``): every expert's width
split over the ranks as a dense MLP's, or with expert parallelism (``--enable-expert-parallel``)
each rank holding whole experts of its own; the router whole on every rank, a shared expert split
by its width, one all-reduce per MoE layer; GPT-OSS's fused (and MXFP4) experts and sinks,
DeepSeek's latent attention split by heads. TP 1 on the same checkpoint is the reference (itself
checked against transformers in tests/model): float32 logits within 1e-5, 64 greedy tokens equal;
bfloat16 within bfloat16 error and batch-invariant; the ranks' shares; refusals by name."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from kvserve.distributed.shard import TensorParallelShard, check_tensor_parallel
from kvserve.engine.llm import LLM
from kvserve.errors import ConfigError
from kvserve.model.arch_config import ModelArchConfig
from kvserve.model.moe import SparseMoeBlock
from kvserve.model.quant_linear import QuantizedLinear
from kvserve.testing.checkpoints import store_experts_as_mxfp4
from tp_workload import COMMON, PROMPTS, greedy

pytestmark = pytest.mark.slow

# Qwen2-MoE: 6 experts, a shared expert (48 wide) behind its gate, layer 1 dense; Qwen3-MoE: top 3
# of 8; Mixtral: top 2 of 4 with a sliding window; GPT-OSS: top 2 of 4 with biases, sinks and a
# window smaller than the prompts, its experts in one tensor per layer in MXFP4 (float32 ones:
# test_the_ranks_parts_of_fused_experts); DeepSeek-V3: latent attention with low-rank queries, a
# dense first layer, 2 of 8 experts in 2 of 4 groups, a shared expert (testing/checkpoints.py's
# MOE_DIMS; biases, sinks and the correction bias drawn at random).
FAMILIES = {"qwen2_moe": ("Qwen2MoeForCausalLM", dict(num_hidden_layers=3, mlp_only_layers=[1])),
            "qwen3_moe": ("Qwen3MoeForCausalLM", dict(head_dim=32)),
            "mixtral": ("MixtralForCausalLM", dict(sliding_window=6)),
            "gpt_oss_mxfp4": ("GptOssForCausalLM", dict(sliding_window=6)),
            "deepseek_v3": ("DeepseekV3ForCausalLM", {})}


@pytest.fixture(scope="module")
def moe_checkpoint(checkpoint_factory, tmp_path_factory):
    def build(family: str, dtype: str = "float32"):
        architecture, fields = FAMILIES[family]
        path = checkpoint_factory(architecture, dtype=dtype, initializer_range=0.1, **fields)
        if family.startswith(("gpt_oss", "deepseek")):
            path = with_random_biases_and_sinks(shutil.copytree(path, tmp_path_factory.mktemp(family),
                                                                dirs_exist_ok=True))
        return store_experts_as_mxfp4(path) if family.endswith("_mxfp4") else path
    return build


def with_random_biases_and_sinks(folder):
    """The folder with its biases and GPT-OSS's sinks drawn at random (transformers initialises them
    to zero, which would hide a bias added on every rank or a sink read from another rank's head)."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    generator = torch.Generator().manual_seed(0)
    for name, tensor in sorted(tensors.items()):
        if name.endswith(("bias", "sinks")):
            tensors[name] = torch.randn(tensor.shape, generator=generator).mul(0.5).to(tensor.dtype)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def make(model_dir, tp: int, **kwargs) -> LLM:
    return LLM(str(model_dir), **{**COMMON, "num_gpu_blocks_override": 64, "tensor_parallel_size": tp, **kwargs})


def run(llm: LLM, prompts=PROMPTS) -> tuple[torch.Tensor, list[tuple[list[int], list[float]]]]:
    """(the runner's logits of two prompts' last positions, [(token ids, logprobs)] of greedy
    generation for ``prompts``)."""
    logits = llm.llm_engine.core.runner.forward([PROMPTS[0], PROMPTS[1]], [[1, 2], [3]])
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy(64))
    return torch.cat([t.float() for t in logits]), [(o.outputs[0].token_ids, [lp.logprob for lp in o.outputs[0].logprobs]) for o in outputs]


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max())


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_tp2_with_and_without_expert_parallelism_matches_tp1(moe_checkpoint, family):
    model_dir = moe_checkpoint(family)
    reference = make(model_dir, 1)
    want_logits, want_tokens = run(reference)
    for expert_parallel in (False, True):
        sharded = make(model_dir, 2, enable_expert_parallel=expert_parallel)
        try:
            blocks = [m for m in sharded.llm_engine.core.runner.model.modules() if isinstance(m, SparseMoeBlock)]
            got_logits, got_tokens = run(sharded)
        finally:
            sharded.shutdown()
        arch = ModelArchConfig.from_file(model_dir / "config.json")
        held = arch.moe.num_experts // 2 if expert_parallel else arch.moe.num_experts
        assert blocks and all(len(b.experts) == held and b.first_expert == 0 for b in blocks)  # rank 0's
        if family.endswith("_mxfp4"):
            assert all(type(e.down_proj) is QuantizedLinear for b in blocks for e in b.experts)
        assert relative_error(got_logits, want_logits) < 1e-5, expert_parallel
        for (got_ids, got_lps), (want_ids, want_lps) in zip(got_tokens, want_tokens, strict=True):
            assert got_ids == want_ids and len(got_ids) == 64
            assert got_lps == pytest.approx(want_lps, rel=1e-5, abs=1e-5)


def test_tp2_expert_parallel_bfloat16_stays_close_and_batch_invariant(moe_checkpoint):
    """bfloat16 partial sums all-reduced in float32 and rounded once: within bfloat16 error of
    TP 1's float32 logits (a lost or doubled expert would be off by far more), and a prompt alone
    gives the bits it gives in a batch."""
    model_dir = moe_checkpoint("qwen3_moe")
    want, _ = run(make(model_dir, 1), PROMPTS[:1])
    sharded = make(model_dir, 2, dtype="bfloat16", enable_expert_parallel=True)
    try:
        got, batched = run(sharded)
        _, alone = run(sharded, PROMPTS[:1])
    finally:
        sharded.shutdown()
    assert relative_error(got, want) < 5e-2
    assert alone[0] == batched[0]


def test_the_shards_of_experts():
    config = {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "vocab_size": 100,
              "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
              "shared_expert_intermediate_size": 48, "mlp_only_layers": [1]}
    arch = ModelArchConfig.from_dict(config)
    split = TensorParallelShard(1, 2, arch)
    assert split.rows_of("gate_proj", "model.layers.0.mlp.experts.5") == (16, 32)
    assert split.rows_of("down_proj", "model.layers.0.mlp.shared_expert") == (24, 48)
    assert split.rows_of("up_proj", "model.layers.1.mlp") == (48, 96)  # the dense layer
    local = split.local_arch().moe
    assert (local.intermediate_size, local.shared_expert_intermediate_size, local.expert_range) == (16, 24, range(6))
    whole = TensorParallelShard(1, 2, arch, expert_parallel=True)
    assert whole.rows_of("gate_proj", "model.layers.0.mlp.experts.4") == (0, 32)
    assert whole.rows_of("down_proj", "model.layers.0.mlp.shared_expert") == (24, 48)
    local = whole.local_arch().moe
    assert (local.intermediate_size, local.shared_expert_intermediate_size, local.expert_range) == (32, 24, range(3, 6))
    with pytest.raises(ConfigError, match=r"--tensor-parallel-size 4 --enable-expert-parallel: the experts \(6\) are "
                                          r"not a multiple of 4"):
        check_tensor_parallel(arch, 4, expert_parallel=True)
    narrow = ModelArchConfig.from_dict({**config, "moe_intermediate_size": 30})
    with pytest.raises(ConfigError, match=r"--tensor-parallel-size 4: the experts' width \(30\) is not a multiple"):
        check_tensor_parallel(narrow, 4)
    check_tensor_parallel(narrow, 2, expert_parallel=True)  # whole experts: their width need not split


def test_the_ranks_parts_of_fused_experts(moe_checkpoint):
    """GPT-OSS's float32 experts as split_checkpoint_tensor cuts them ([gate | up] rows): each
    rank's gate and up rows of its width share, its bias parts, the down bias on rank 0 only; under
    expert parallelism the rank's experts whole and nothing of the others'."""
    from kvserve.distributed.expert_pieces import rank_pieces

    arch = ModelArchConfig.from_file(moe_checkpoint("gpt_oss_mxfp4") / "config.json")  # I = 64, 4 experts
    expert = "model.layers.1.mlp.experts.3"
    gate_up, bias = torch.arange(128 * 4.0).view(128, 4), torch.arange(128.0)
    width1 = TensorParallelShard(1, 2, arch)
    (gate_name, gate), (up_name, up) = rank_pieces(f"{expert}.gate_up_proj.weight", gate_up, width1)
    assert (gate_name, up_name) == (f"{expert}.gate_proj.weight", f"{expert}.up_proj.weight")
    assert torch.equal(gate, gate_up[:64]) and torch.equal(up, gate_up[64:])  # the loader takes rows 32:64 of each
    assert width1.rows_of("gate_proj", expert) == (32, 64)
    [(_, part)] = rank_pieces(f"{expert}.gate_up_bias", bias, width1)
    assert torch.equal(part, torch.cat([bias[32:64], bias[96:128]]))
    assert not rank_pieces(f"{expert}.down_bias", bias[:64], width1)[0][1].any()
    assert torch.equal(rank_pieces(f"{expert}.down_bias", bias[:64], TensorParallelShard(0, 2, arch))[0][1], bias[:64])
    held = TensorParallelShard(1, 2, arch, expert_parallel=True)  # experts 2 and 3
    assert torch.equal(rank_pieces(f"{expert}.gate_up_bias", bias, held)[0][1], bias)
    assert torch.equal(rank_pieces(f"{expert}.down_bias", bias[:64], held)[0][1], bias[:64])
    assert rank_pieces("model.layers.1.mlp.experts.1.gate_up_bias", bias, held) == []
    # DeepSeek-V2's one q_proj: each head's nope + rope rows
    v2 = ModelArchConfig.from_dict({**json.loads((moe_checkpoint("deepseek_v3") / "config.json").read_text()),
                                    "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
                                    "q_lora_rank": None})
    assert TensorParallelShard(1, 2, v2).rows_of("q_proj") == (64, 128)  # heads 2-3 of 32 rows


def test_mxfp4_experts_split_by_width_only_in_whole_groups(moe_checkpoint, tmp_path):
    """An MXFP4 down projection's inputs come in groups of 32 scaled together: a width whose
    rank share is not whole groups is refused by name, with the way out (whole experts)."""
    from kvserve.distributed.shard import check_parallel_options
    from kvserve.engine.arg_utils import engine_config_from_kwargs

    folder = tmp_path / "narrow"
    shutil.copytree(moe_checkpoint("gpt_oss_mxfp4"), folder)
    config = engine_config_from_kwargs(str(folder), tensor_parallel_size=4)
    with pytest.raises(ConfigError, match=r"an mxfp4 checkpoint with --tensor-parallel-size 4: each rank would take "
                                          r"16 of an expert's 64 inputs, not whole groups of 32; add "
                                          r"--enable-expert-parallel"):
        check_parallel_options(config)
    check_parallel_options(engine_config_from_kwargs(str(folder), tensor_parallel_size=4, enable_expert_parallel=True))
