"""Write a mixture-of-experts checkpoint of a real model's shapes with random bfloat16 weights.

    python benchmarks/make_moe_shaped_model.py --shape qwen3-30b-a3b --layers 8    # -> /tmp/qwen3-30b-a3b-8l
    python benchmarks/make_moe_shaped_model.py --shape mixtral-8x7b --layers 4     # -> /tmp/mixtral-8x7b-4l
    python benchmarks/make_moe_shaped_model.py --shape gpt-oss-20b --layers 24     # -> /tmp/gpt-oss-20b-24l
    python benchmarks/make_moe_shaped_model.py --shape deepseek-v2-lite --layers 8 # -> /tmp/deepseek-v2-lite-8l

The shapes are the released models' config.json values (Qwen3-30B-A3B: hidden 2048, 32 query / 4
KV heads of 128, 128 experts of width 768, top 8, norm_topk_prob; Mixtral-8x7B: hidden 4096, 32 / 8
heads of 128, 8 experts of width 14,336, top 2; GPT-OSS-20B: hidden 2880, 64 / 8 heads of 64,
sliding-window (128) and full layers alternating, 32 experts of width 2880, top 4, YaRN;
DeepSeek-V2-Lite: hidden 2048, 16 heads of latent attention (kv_lora_rank 512, 128 + 64 query/key
dimensions, 128 value dimensions, one q_proj), a dense first layer, then 64 experts of width 1408,
top 6, two shared experts), cut to
``--layers`` layers so that the weights fit in this machine's memory in bfloat16 (one Qwen3-30B-A3B
layer is 1.2 GB, one Mixtral layer 2.8 GB). GPT-OSS's experts are written as the released
checkpoints store them, in MXFP4 (uint8 blocks of 32 E2M1 values and a power-of-two scale each:
0.4 GB a layer, all 24 layers fit); its attention, router and biases in bfloat16. Every matmul a
token runs costs what the real model's does; only the values are random.

Tensors are written one layer at a time straight to safetensors shards in the checkpoint's own
names (no transformers model is built: a 30B-shaped one would not fit), each drawn from
N(0, 0.02) under the given seed (norm weights 1); the tokenizer covers the whole vocabulary
(``make_qwen_shaped_model.full_vocab_tokenizer``). A folder that already holds this shape and
seed (``shape.json``) is reused. Never commit the output.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).parent))
from make_qwen_shaped_model import full_vocab_tokenizer  # noqa: E402

SHAPES: dict[str, dict] = {
    "qwen3-30b-a3b": {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 151936,
        "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 48, "num_attention_heads": 32,
        "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
        "moe_intermediate_size": 768, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 40960,
        "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False,
    },
    "mixtral-8x7b": {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": 32000, "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128, "num_local_experts": 8, "num_experts_per_tok": 2, "rms_norm_eps": 1e-5,
        "rope_theta": 1000000.0, "max_position_embeddings": 32768, "tie_word_embeddings": False,
        "hidden_act": "silu", "sliding_window": None,
    },
    "deepseek-v2-lite": {
        "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "vocab_size": 102400,
        "hidden_size": 2048, "intermediate_size": 10944, "num_hidden_layers": 27, "num_attention_heads": 16,
        "num_key_value_heads": 16, "head_dim": 64, "q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 64, "num_experts_per_tok": 6,
        "moe_intermediate_size": 1408, "n_shared_experts": 2, "first_k_dense_replace": 1, "moe_layer_freq": 1,
        "topk_method": "greedy", "n_group": 1, "topk_group": 1, "norm_topk_prob": False, "routed_scaling_factor": 1.0,
        "scoring_func": "softmax", "rms_norm_eps": 1e-6, "rope_theta": 10000, "max_position_embeddings": 163840,
        "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                         "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
        "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False,
    },
    "gpt-oss-20b": {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "vocab_size": 201088, "hidden_size": 2880,
        "intermediate_size": 2880, "num_hidden_layers": 24, "num_attention_heads": 64, "num_key_value_heads": 8,
        "head_dim": 64, "num_local_experts": 32, "num_experts_per_tok": 4, "experts_per_token": 4,
        "attention_bias": True, "sliding_window": 128, "swiglu_limit": 7.0, "rms_norm_eps": 1e-5,
        "rope_theta": 150000, "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                                               "beta_slow": 1.0, "original_max_position_embeddings": 4096,
                                               "truncate": False},
        "initial_context_length": 4096, "max_position_embeddings": 131072, "tie_word_embeddings": False,
        "hidden_act": "silu", "router_aux_loss_coef": 0.9,
        "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
            "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]},
    },
}

# GPT-OSS's tokens of the harmony format (o200k_harmony's specials; <|endoftext|> is among the
# benchmark tokenizer's own; appended after its vocabulary, so their ids differ from the real ones).
HARMONY_SPECIAL_TOKENS = ("<|startoftext|>", "<|return|>", "<|constrain|>", "<|channel|>",
                          "<|start|>", "<|end|>", "<|message|>", "<|call|>")


def layer_tensors(config: dict, i: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    h, heads, kv, d = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]

    def w(*shape):
        return (torch.randn(*shape, generator=generator) * 0.02).to(torch.bfloat16)

    p = f"model.layers.{i}."
    if config["model_type"] == "gpt_oss":
        return gpt_oss_layer_tensors(config, p, w, generator)
    if config["model_type"] == "deepseek_v2":
        return deepseek_layer_tensors(config, i, p, w)
    out = {p + "input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
           p + "post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
           p + "self_attn.q_proj.weight": w(heads * d, h), p + "self_attn.k_proj.weight": w(kv * d, h),
           p + "self_attn.v_proj.weight": w(kv * d, h), p + "self_attn.o_proj.weight": w(h, heads * d)}
    if config["model_type"] == "qwen3_moe":
        out[p + "self_attn.q_norm.weight"] = torch.ones(d, dtype=torch.bfloat16)
        out[p + "self_attn.k_norm.weight"] = torch.ones(d, dtype=torch.bfloat16)
        experts, width, mlp, names = config["num_experts"], config["moe_intermediate_size"], "mlp", \
            ("gate_proj", "up_proj", "down_proj")
    else:
        experts, width, mlp, names = config["num_local_experts"], config["intermediate_size"], "block_sparse_moe", \
            ("w1", "w3", "w2")
    out[p + f"{mlp}.gate.weight"] = w(experts, h)
    for e in range(experts):
        q = p + f"{mlp}.experts.{e}."
        out[q + f"{names[0]}.weight"], out[q + f"{names[1]}.weight"] = w(width, h), w(width, h)
        out[q + f"{names[2]}.weight"] = w(h, width)
    return out


def gpt_oss_layer_tensors(config: dict, p: str, w, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """One GPT-OSS layer in the released checkpoints' names: attention with biases and sinks, the
    router with a bias, the experts' weights in MXFP4 (random E2M1 nibbles; scales 2^-9 .. 2^-6,
    so weights of up to 6 * 2^-6 as N(0, 0.02) has) with bfloat16 biases."""
    h, heads, kv, d = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    experts, width = config["num_local_experts"], config["intermediate_size"]

    def mxfp4(rows: int, columns: int) -> tuple[torch.Tensor, torch.Tensor]:
        blocks = torch.randint(0, 256, (experts, rows, columns // 32, 16), generator=generator, dtype=torch.uint8)
        scales = torch.randint(127 - 9, 127 - 5, (experts, rows, columns // 32), generator=generator, dtype=torch.uint8)
        return blocks, scales

    out = {p + "input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
           p + "post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
           p + "self_attn.sinks": w(heads)}
    for name, rows, columns in (("q_proj", heads * d, h), ("k_proj", kv * d, h), ("v_proj", kv * d, h),
                                ("o_proj", h, heads * d)):
        out[p + f"self_attn.{name}.weight"], out[p + f"self_attn.{name}.bias"] = w(rows, columns), w(rows)
    out[p + "mlp.router.weight"], out[p + "mlp.router.bias"] = w(experts, h), w(experts)
    q = p + "mlp.experts."
    out[q + "gate_up_proj_blocks"], out[q + "gate_up_proj_scales"] = mxfp4(2 * width, h)
    out[q + "gate_up_proj_bias"] = w(experts, 2 * width)
    out[q + "down_proj_blocks"], out[q + "down_proj_scales"] = mxfp4(h, width)
    out[q + "down_proj_bias"] = w(experts, h)
    return out


def deepseek_layer_tensors(config: dict, i: int, p: str, w) -> dict[str, torch.Tensor]:
    """One DeepSeek-V2 layer in the released checkpoints' names: latent attention (one q_proj),
    then a dense MLP (layers before first_k_dense_replace) or the routed and shared experts."""
    h, heads = config["hidden_size"], config["num_attention_heads"]
    nope, rope, v, latent = (config[k] for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank"))

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=torch.bfloat16)

    out = {p + "input_layernorm.weight": ones(h), p + "post_attention_layernorm.weight": ones(h),
           p + "self_attn.q_proj.weight": w(heads * (nope + rope), h),
           p + "self_attn.kv_a_proj_with_mqa.weight": w(latent + rope, h),
           p + "self_attn.kv_a_layernorm.weight": ones(latent),
           p + "self_attn.kv_b_proj.weight": w(heads * (nope + v), latent),
           p + "self_attn.o_proj.weight": w(h, heads * v)}

    def mlp(prefix: str, width: int) -> None:
        out[prefix + "gate_proj.weight"], out[prefix + "up_proj.weight"] = w(width, h), w(width, h)
        out[prefix + "down_proj.weight"] = w(h, width)

    if i < config["first_k_dense_replace"]:
        mlp(p + "mlp.", config["intermediate_size"])
        return out
    out[p + "mlp.gate.weight"] = w(config["n_routed_experts"], h)
    for e in range(config["n_routed_experts"]):
        mlp(p + f"mlp.experts.{e}.", config["moe_intermediate_size"])
    mlp(p + "mlp.shared_experts.", config["moe_intermediate_size"] * config["n_shared_experts"])
    return out


def harmony_tokenizer(vocab_size: int):
    """``full_vocab_tokenizer`` of ``vocab_size`` tokens whose last ones are GPT-OSS's harmony
    specials, with the harmony chat template (``benchmarks/harmony_template.jinja``)."""
    tokenizer = full_vocab_tokenizer(vocab_size - len(HARMONY_SPECIAL_TOKENS))
    tokenizer.add_special_tokens({"additional_special_tokens": list(HARMONY_SPECIAL_TOKENS)})
    tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token = "<|startoftext|>", "<|return|>", "<|endoftext|>"
    tokenizer.chat_template = (Path(__file__).parent / "harmony_template.jinja").read_text()
    assert len(tokenizer) == vocab_size, len(tokenizer)
    return tokenizer


def make_moe_shaped_model(shape: str, layers: int, out: Path, seed: int = 0) -> Path:
    config = {**SHAPES[shape], "num_hidden_layers": layers, "torch_dtype": "bfloat16", "dtype": "bfloat16",
              "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 1}
    record = {"shape": shape, "layers": layers, "seed": seed, "config": config}
    marker = out / "shape.json"
    if marker.exists() and json.loads(marker.read_text()) == record:
        return out
    out.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    h, vocab = config["hidden_size"], config["vocab_size"]
    weight_map: dict[str, str] = {}
    shards = [{"model.embed_tokens.weight": (torch.randn(vocab, h, generator=generator) * 0.02).to(torch.bfloat16),
               "model.norm.weight": torch.ones(h, dtype=torch.bfloat16),
               "lm_head.weight": (torch.randn(vocab, h, generator=generator) * 0.02).to(torch.bfloat16)}]
    total = layers + 1
    for index in range(total):
        tensors = shards[0] if index == 0 else layer_tensors(config, index - 1, generator)
        name = f"model-{index + 1:05d}-of-{total:05d}.safetensors"
        save_file(tensors, str(out / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
        print(f"  {name}: {sum(t.numel() * t.element_size() for t in tensors.values()) / 1e9:.2f} GB", flush=True)
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if config["model_type"] == "gpt_oss":
        tokenizer = harmony_tokenizer(vocab)
        ids = tokenizer.convert_tokens_to_ids
        config.update(bos_token_id=ids("<|startoftext|>"), eos_token_id=ids("<|return|>"),
                      pad_token_id=ids("<|endoftext|>"))
        eos = [ids("<|return|>"), ids("<|endoftext|>"), ids("<|call|>")]
        (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    else:
        tokenizer, eos = full_vocab_tokenizer(vocab), [1]
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": config["bos_token_id"], "eos_token_id": eos}) + "\n")
    tokenizer.save_pretrained(out)
    marker.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), required=True)
    p.add_argument("--layers", type=int, required=True, help="layers to keep (of the model's own)")
    p.add_argument("--out", type=Path, default=None, help="output folder (default /tmp/<shape>-<layers>l)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    out = args.out or Path(f"/tmp/{args.shape}-{args.layers}l")
    start = time.perf_counter()
    make_moe_shaped_model(args.shape, args.layers, out, args.seed)
    size = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    print(f"{out}: {size / 1e9:.1f} GB of safetensors ({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
