"""Tiny random checkpoints for the model-runtime tests (token ids only, no tokenizer).

Imported by ``tests/model/conftest.py`` (the ``tiny_checkpoint`` fixture) and by the tests that
need the variant table or the builders directly (``from model_fixtures import ...``).

Each architecture variant below is built once per session with ``transformers`` (seeded), saved
with ``save_pretrained`` and returned with the reference ``transformers`` model. Norm weights and
biases are randomised too (transformers initialises them to ones/zeros, which would hide loading
mistakes), and the initializer range is raised so that logits are well separated.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

_BASE = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    initializer_range=0.1,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)

VARIANTS: dict[str, tuple[str, dict]] = {
    "llama": ("LlamaForCausalLM", dict(tie_word_embeddings=False)),
    "llama_mha_tied": ("LlamaForCausalLM", dict(num_key_value_heads=4, tie_word_embeddings=True)),
    "llama3_rope": (
        "LlamaForCausalLM",
        dict(
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=32,
            ),
            rope_theta=500000.0,
        ),
    ),
    "llama_linear_rope": ("LlamaForCausalLM", dict(rope_scaling=dict(rope_type="linear", factor=4.0))),
    "mistral_window": ("MistralForCausalLM", dict(sliding_window=6, tie_word_embeddings=True)),
    "qwen2": ("Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    # Window only on layers >= max_window_layers (here layer 1), as Qwen2 defines it.
    "qwen2_window": (
        "Qwen2ForCausalLM",
        dict(use_sliding_window=True, sliding_window=5, max_window_layers=1, tie_word_embeddings=False),
    ),
    "qwen3": ("Qwen3ForCausalLM", dict(head_dim=32, tie_word_embeddings=False)),
    # Mixtures of experts (kvserve.model.moe): top 2 of 4 with a sliding window; top 1 of 3.
    "mixtral": ("MixtralForCausalLM", dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=48,
                                           sliding_window=6, tie_word_embeddings=False)),
    "mixtral_top1": ("MixtralForCausalLM", dict(num_local_experts=3, num_experts_per_tok=1, intermediate_size=40,
                                                tie_word_embeddings=True)),
    # A shared expert behind a sigmoid gate; layer 1 dense (mlp_only_layers); top-k not renormalised.
    "qwen2_moe": ("Qwen2MoeForCausalLM", dict(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32,
                                              shared_expert_intermediate_size=48, norm_topk_prob=False,
                                              num_hidden_layers=3, mlp_only_layers=[1], tie_word_embeddings=False)),
    # Top 3 of 8 renormalised; and every second layer sparse (decoder_sparse_step=2), not renormalised.
    "qwen3_moe": ("Qwen3MoeForCausalLM", dict(num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32,
                                              norm_topk_prob=True, head_dim=32, tie_word_embeddings=False)),
    # Dense families on the Llama network (kvserve.model.dense_families).
    "granite": ("GraniteForCausalLM", dict(embedding_multiplier=12.0, attention_multiplier=0.015625,
                                           residual_multiplier=0.22, logits_scaling=8.0, tie_word_embeddings=True)),
    "smollm3": ("SmolLM3ForCausalLM", dict(num_hidden_layers=4, no_rope_layer_interval=2, tie_word_embeddings=True)),
    "olmo2": ("Olmo2ForCausalLM", dict(tie_word_embeddings=False)),
    # Phi-3 fused projections; LongRoPE's short factors and attention factor (the tests' sequences
    # stay within the original 64 positions, where transformers and kvserve agree: past them
    # kvserve takes the long factors per position, test_layers.py) and a partial rotary.
    "phi3_longrope": ("Phi3ForCausalLM", dict(max_position_embeddings=512, original_max_position_embeddings=64,
                                              rope_parameters=dict(rope_type="longrope", rope_theta=10000.0,
                                                                   short_factor=[1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0, 3.6],
                                                                   long_factor=[1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 16.0],
                                                                   original_max_position_embeddings=64),
                                              tie_word_embeddings=False)),
    "phi3_partial": ("Phi3ForCausalLM", dict(rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                                                  partial_rotary_factor=0.5),
                                             tie_word_embeddings=True)),
    "qwen3_moe_step2": ("Qwen3MoeForCausalLM", dict(num_experts=5, num_experts_per_tok=2, moe_intermediate_size=24,
                                                    norm_topk_prob=False, decoder_sparse_step=2, num_hidden_layers=3,
                                                    tie_word_embeddings=False)),
    # Gemma 3: sliding layers with their own theta around a full layer with linear scaling, a
    # softmax scale of its own (query_pre_attn_scalar), GeGLU.
    "gemma3": ("Gemma3ForCausalLM", dict(head_dim=32, num_hidden_layers=3, query_pre_attn_scalar=24, sliding_window=5,
                                         layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                         rope_parameters={"full_attention": dict(rope_type="linear", factor=2.0,
                                                                                 rope_theta=1_000_000.0),
                                                          "sliding_attention": dict(rope_type="default",
                                                                                    rope_theta=10_000.0)},
                                         tie_word_embeddings=True)),
    # Gemma 3 with soft-capped logits; Gemma 2 (capped scores and logits, alternating windows from
    # layer 0, no q/k norms). Caps near the values' size, so that they bend them.
    "gemma3_capped": ("Gemma3ForCausalLM", dict(head_dim=32, query_pre_attn_scalar=32, sliding_window=4,
                                                final_logit_softcapping=3.0,
                                                layer_types=["full_attention", "sliding_attention"],
                                                tie_word_embeddings=False)),
    # YaRN (Qwen3's long-context setting): a ramp between the interpolated and extrapolated frequencies.
    "qwen3_yarn": ("Qwen3ForCausalLM", dict(head_dim=32, tie_word_embeddings=True, max_position_embeddings=512,
                                            rope_parameters=dict(rope_type="yarn", factor=4.0, rope_theta=10000.0,
                                                                 original_max_position_embeddings=128))),
    # GPT-OSS: top 2 of 4 (top-k logits, then a softmax), sinks, windows of 5 on layers 0 and 2, YaRN,
    # a clamp low enough to bite (the gate and up values of random weights reach a few units).
    "gpt_oss": ("GptOssForCausalLM", dict(head_dim=32, num_hidden_layers=3, num_local_experts=4, num_experts_per_tok=2,
                                          intermediate_size=64, sliding_window=5, swiglu_limit=1.5,
                                          rope_parameters=dict(rope_type="yarn", factor=8.0, rope_theta=150000.0,
                                                               beta_fast=32.0, beta_slow=1.0, truncate=False,
                                                               original_max_position_embeddings=64),
                                          tie_word_embeddings=False)),
    "gemma2": ("Gemma2ForCausalLM", dict(head_dim=32, num_hidden_layers=3, query_pre_attn_scalar=16, sliding_window=5,
                                         attn_logit_softcapping=2.0, final_logit_softcapping=3.0,
                                         tie_word_embeddings=True)),
    # DeepSeek-V3 (kvserve.model.deepseek): latent attention with low-rank queries and interleaved
    # rope under YaRN (mscale_all_dim scaling the softmax too), a dense first layer, then top 2 of
    # 8 experts in the 2 best of 4 groups (sigmoid scores, correction bias), renormalised and
    # scaled, one shared expert.
    "deepseek_v3": ("DeepseekV3ForCausalLM", dict(
        num_hidden_layers=3, num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=32, qk_nope_head_dim=16,
        qk_rope_head_dim=16, v_head_dim=24, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        n_group=4, topk_group=2, first_k_dense_replace=1, n_shared_experts=1, norm_topk_prob=True,
        routed_scaling_factor=2.5, rope_parameters=dict(rope_type="yarn", factor=4.0, rope_theta=10000.0, mscale=0.8,
                                                        mscale_all_dim=0.7, original_max_position_embeddings=64),
        tie_word_embeddings=False)),
    # Its switches the other way: one q_proj, rope in halves, one group, no shared expert, weights
    # not renormalised.
    "deepseek_v3_plain": ("DeepseekV3ForCausalLM", dict(
        num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=8, qk_rope_head_dim=8,
        v_head_dim=16, n_routed_experts=6, num_experts_per_tok=3, moe_intermediate_size=24, n_group=1, topk_group=1,
        first_k_dense_replace=0, n_shared_experts=0, norm_topk_prob=False, routed_scaling_factor=1.0,
        rope_interleave=False, tie_word_embeddings=True)),
    # DeepSeek-V2: group-limited greedy softmax routing (2 of 3 groups), two shared experts, the
    # rotation in float32.
    "deepseek_v2": ("DeepseekV2ForCausalLM", dict(
        num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16,
        v_head_dim=24, n_routed_experts=6, num_experts_per_tok=2, moe_intermediate_size=32,
        topk_method="group_limited_greedy", n_group=3, topk_group=2, first_k_dense_replace=0, n_shared_experts=2,
        routed_scaling_factor=1.5, tie_word_embeddings=False)),
}


def hf_config(architecture: str, overrides: dict):
    import transformers

    config_cls = {
        "DeepseekV2ForCausalLM": transformers.DeepseekV2Config,
        "DeepseekV3ForCausalLM": transformers.DeepseekV3Config,
        "Gemma2ForCausalLM": transformers.Gemma2Config,
        "Gemma3ForCausalLM": transformers.Gemma3TextConfig,
        "GptOssForCausalLM": transformers.GptOssConfig,
        "GraniteForCausalLM": transformers.GraniteConfig,
        "LlamaForCausalLM": transformers.LlamaConfig,
        "Olmo2ForCausalLM": transformers.Olmo2Config,
        "Phi3ForCausalLM": transformers.Phi3Config,
        "SmolLM3ForCausalLM": transformers.SmolLM3Config,
        "MistralForCausalLM": transformers.MistralConfig,
        "MixtralForCausalLM": transformers.MixtralConfig,
        "Qwen2ForCausalLM": transformers.Qwen2Config,
        "Qwen2MoeForCausalLM": transformers.Qwen2MoeConfig,
        "Qwen3ForCausalLM": transformers.Qwen3Config,
        "Qwen3MoeForCausalLM": transformers.Qwen3MoeConfig,
    }[architecture]
    return config_cls(**{**_BASE, **overrides})


def build_hf_model(architecture: str, overrides: dict, seed: int = 0):
    """A seeded random ``transformers`` model (float32, eval mode)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config(architecture, overrides), dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(1.0, 0.2)
            elif name.endswith("bias"):
                param.normal_(0.0, 0.2)
            elif name.endswith("sinks"):  # GPT-OSS: sinks of the scores' size take a share of every row
                param.normal_(0.0, 1.0)
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # DeepSeek-V3: a bias that changes the choice
                buffer.normal_(0.0, 0.2)
    return model.eval()


def save_checkpoint(path: Path, architecture: str, overrides: dict, dtype=torch.float32, **save_kwargs):
    """Build, cast to ``dtype`` and ``save_pretrained`` into ``path``; returns the reference:
    the checkpoint loaded back with ``from_pretrained(dtype=dtype)``, as a user would run it
    (a model merely cast with ``.to(bfloat16)`` would also round its rotary ``inv_freq`` buffer)."""
    from transformers import AutoModelForCausalLM

    build_hf_model(architecture, overrides).to(dtype).save_pretrained(str(path), **save_kwargs)
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """``(variant, dtype=torch.float32) -> (folder, transformers model)``, cached per session."""
    cache: dict[tuple[str, torch.dtype], tuple[Path, object]] = {}

    def get(variant: str, dtype: torch.dtype = torch.float32):
        key = (variant, dtype)
        if key not in cache:
            architecture, overrides = VARIANTS[variant]
            path = tmp_path_factory.mktemp(f"{variant}_{str(dtype).split('.')[-1]}")
            cache[key] = (path, save_checkpoint(path, architecture, overrides, dtype))
        return cache[key]

    return get


def flat_prompt_logits(runner, prompts: list[list[int]], block_tables: list[list[int]]) -> list[torch.Tensor]:
    """Run all ``prompts`` in one flat batch through ``runner``; float32 logits [len, vocab] each."""
    return [logits.float() for logits in runner.forward(prompts, block_tables)]


def hf_logits(hf_model, prompt: list[int]) -> torch.Tensor:
    """transformers' float32 logits [len, vocab] of one unpadded prompt."""
    with torch.no_grad():
        return hf_model(torch.tensor([prompt])).logits[0].float()


def relative_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours - ref).abs().max() / ref.abs().max()).item()


def sequential_block_tables(lengths: list[int], block_size: int, start: int = 0, reverse: bool = False):
    """Enough blocks per sequence, handed out in order (or in reverse order, to make tables
    non-contiguous and descending)."""
    tables, next_block = [], start
    for n in lengths:
        num = -(-n // block_size)
        ids = list(range(next_block, next_block + num))
        tables.append(ids[::-1] if reverse else ids)
        next_block += num
    return tables


def quantized_weight(kind: str, n: int, k: int, seed: int = 0):
    """A random N(0, 1) [n, k] weight (``seed``) as ``kind``: int8, int4-symmetric or
    int4-zero-points (groups of 32), or mxfp4: the quantized-kernel tests' weights."""
    from kvserve.model.quant_tensor import quantize_int4, quantize_int8, quantize_mxfp4

    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed))
    if kind == "int8":
        return quantize_int8(w)
    if kind == "mxfp4":
        return quantize_mxfp4(w)
    return quantize_int4(w, 32, symmetric=kind == "int4-symmetric")


def code_values(qt) -> torch.Tensor:
    """float64 [N, K]: the numbers the kernels multiply by (q; q - 8 for symmetric int4; MXFP4's
    doubled E2M1 values, written out here from the format: 0, 0.5, 1, 1.5, 2, 3, 4, 6 times 2)."""
    if qt.codebook == "e2m1":
        doubled = torch.tensor([0, 1, 2, 3, 4, 6, 8, 12], dtype=torch.float64)
        magnitude = doubled[(qt.q.long() & 7)]
        return torch.where(qt.q >= 8, -magnitude, magnitude)
    return qt.q.double() - (8 if qt.bits == 4 and qt.offsets is None else 0)


def random_moe_block(arch, dtype):
    """A SparseMoeBlock of ``arch`` with N(0, 0.2) weights (seed 0) in ``dtype`` on the invariant
    linears: the MoE kernel tests' block."""
    from kvserve.model.invariant_linear import use_invariant_linears
    from kvserve.model.moe import SparseMoeBlock

    torch.manual_seed(0)
    block = SparseMoeBlock(arch, arch.moe).eval()
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.2)
    block.to(dtype)
    use_invariant_linears(block)
    return block
