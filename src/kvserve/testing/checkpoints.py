"""Small Hugging Face model folders with random weights, written offline for tests.

A folder from :func:`build_checkpoint` looks like one downloaded from the Hub::

    <path>/
      config.json                  architectures, tiny dims, bos/eos ids, dtype (+ torch_dtype)
      generation_config.json       bos, eos (list: eos + end-of-turn), pad
      model.safetensors            or model-0000k-of-0000n.safetensors + model.safetensors.index.json
      tokenizer.json               + tokenizer_config.json, chat_template.jinja
      tokenizer.model              only for tokenizer_kind="sentencepiece"

Weights come from ``AutoModelForCausalLM.from_config`` under ``torch.manual_seed(seed)`` in
float32 (the global RNG state is restored afterwards), then cast to ``dtype``: a bfloat16
checkpoint holds the float32 checkpoint of the same seed rounded to bfloat16. The same arguments
give byte-identical safetensors files.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from kvserve.errors import CheckpointError
from kvserve.testing.tokenizer_kinds import (
    TOKENIZER_KINDS,
    build_tokenizer,
    sentencepiece_model_path,
    tokenizer_spec,
)

ARCHITECTURES: dict[str, str] = {
    "DeepseekV2ForCausalLM": "DeepseekV2Config",
    "DeepseekV3ForCausalLM": "DeepseekV3Config",
    "Gemma2ForCausalLM": "Gemma2Config",
    "Gemma3ForCausalLM": "Gemma3TextConfig",
    "GptOssForCausalLM": "GptOssConfig",
    "GraniteForCausalLM": "GraniteConfig",
    "LlamaForCausalLM": "LlamaConfig",
    "MistralForCausalLM": "MistralConfig",
    "MixtralForCausalLM": "MixtralConfig",
    "Olmo2ForCausalLM": "Olmo2Config",
    "Phi3ForCausalLM": "Phi3Config",
    "Qwen2ForCausalLM": "Qwen2Config",
    "Qwen2MoeForCausalLM": "Qwen2MoeConfig",
    "Qwen3ForCausalLM": "Qwen3Config",
    "Qwen3MoeForCausalLM": "Qwen3MoeConfig",
    "SmolLM3ForCausalLM": "SmolLM3Config",
}
# Tiny mixtures of experts (the defaults of transformers' configs are the full models').
_TINY_MLA = {"num_key_value_heads": 4, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 16,
             "v_head_dim": 16, "moe_intermediate_size": 32, "n_shared_experts": 1}
MOE_DIMS: dict[str, dict[str, Any]] = {
    "DeepseekV2ForCausalLM": {**_TINY_MLA, "q_lora_rank": None, "n_routed_experts": 6, "num_experts_per_tok": 2,
                              "topk_method": "group_limited_greedy", "n_group": 3, "topk_group": 2,
                              "first_k_dense_replace": 0},
    "DeepseekV3ForCausalLM": {**_TINY_MLA, "q_lora_rank": 24, "n_routed_experts": 8, "num_experts_per_tok": 2,
                              "n_group": 4, "topk_group": 2, "first_k_dense_replace": 1, "norm_topk_prob": True,
                              "routed_scaling_factor": 2.5},
    "GptOssForCausalLM": {"num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 64,
                          "swiglu_limit": 1.5},
    "MixtralForCausalLM": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "Qwen2MoeForCausalLM": {"num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                            "shared_expert_intermediate_size": 48, "norm_topk_prob": False},
    "Qwen3MoeForCausalLM": {"num_experts": 8, "num_experts_per_tok": 3, "moe_intermediate_size": 32,
                            "norm_topk_prob": True},
}
DTYPES = ("float32", "bfloat16", "float16")

# Tiny dims shared by all architectures: hidden 64, 2 layers, 4 query heads, 2 KV heads.
TINY_DIMS: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}
# Tekken has 131,072 tokens: a narrower, tied embedding keeps its file at ~17 MB (fp32).
TEKKEN_DIMS: dict[str, Any] = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "tie_word_embeddings": True,
}


def build_checkpoint(
    path: str | Path,
    architecture: str = "LlamaForCausalLM",
    tokenizer_kind: str = "bpe",
    dtype: str = "float32",
    seed: int = 0,
    max_shard_size: str | int | None = None,
    **config_overrides: Any,
) -> Path:
    """Write a tiny random-weight Hugging Face checkpoint to ``path`` (created if missing).

    Args:
        path: output folder; existing files of the same names are overwritten.
        architecture: a key of :data:`ARCHITECTURES` (the mixtures of experts with the tiny
            experts of :data:`MOE_DIMS`).
        tokenizer_kind: ``bpe``, ``sentencepiece`` or ``tekken`` (see
            :mod:`kvserve.testing.tokenizer_kinds`).
        dtype: stored weight dtype: ``float32``, ``bfloat16`` or ``float16``; recorded in
            config.json as ``dtype`` and ``torch_dtype``.
        seed: seed of the weight initialisation.
        max_shard_size: when given (e.g. ``"200KB"``), weights are split into shards of at most
            this size plus ``model.safetensors.index.json``.
        **config_overrides: any config field (``rope_scaling``, ``sliding_window``,
            ``head_dim``, ``tie_word_embeddings``, ``vocab_size``, ``num_hidden_layers``, ...);
            they win over the tiny defaults. ``vocab_size`` may not be below the tokenizer's.

    Returns:
        The folder, as a ``Path``.

    Raises:
        CheckpointError: (a ``ValueError``) unknown architecture, tokenizer kind or dtype, or a
            vocab_size that does not cover the tokenizer.
    """
    path = Path(path)
    _check_choice("architecture", architecture, tuple(ARCHITECTURES))
    _check_choice("tokenizer_kind", tokenizer_kind, TOKENIZER_KINDS)
    _check_choice("dtype", dtype, DTYPES)
    path.mkdir(parents=True, exist_ok=True)
    config = _make_config(architecture, tokenizer_kind, config_overrides)
    _save_weights(config, path, dtype, seed, max_shard_size)
    _save_generation_config(path, tokenizer_kind)
    _save_tokenizer(path, tokenizer_kind)
    return path


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise CheckpointError(f"{name}={value!r} is not supported; allowed: {', '.join(allowed)}")


def _make_config(architecture: str, tokenizer_kind: str, overrides: dict[str, Any]):
    import transformers

    spec = tokenizer_spec(tokenizer_kind)
    fields: dict[str, Any] = dict(TINY_DIMS)
    fields.update(MOE_DIMS.get(architecture, {}))
    if tokenizer_kind == "tekken":
        fields.update(TEKKEN_DIMS)
    fields.update(
        vocab_size=spec.vocab_size,
        bos_token_id=spec.bos_token_id,
        eos_token_id=spec.eos_token_id,
        pad_token_id=spec.pad_token_id,
    )
    fields.update(overrides)
    if fields["vocab_size"] < spec.vocab_size:
        raise CheckpointError(
            f"vocab_size={fields['vocab_size']} does not cover the {tokenizer_kind} tokenizer "
            f"({spec.vocab_size} tokens); use at least {spec.vocab_size}"
        )
    config_class = getattr(transformers, ARCHITECTURES[architecture])
    config = config_class(**fields)
    config.architectures = [architecture]
    return config


def _save_weights(config, path: Path, dtype: str, seed: int, max_shard_size) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    torch_dtype = getattr(torch, dtype)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model = model.to(torch_dtype)
    model.config.dtype = torch_dtype
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(path, safe_serialization=True, **kwargs)
    _add_hub_style_fields(path / "config.json", dtype)


def _add_hub_style_fields(config_path: Path, dtype: str) -> None:
    """Also write the field names most Hub checkpoints use, beside transformers 5's own.

    transformers 5 writes ``dtype`` and ``rope_parameters``; checkpoints on the Hub (and older
    readers) use ``torch_dtype``, ``rope_theta`` and ``rope_scaling``. Both sets agree, so a
    loader may read either.
    """
    data = json.loads(config_path.read_text())
    data["torch_dtype"] = dtype
    data["dtype"] = dtype
    rope = data.get("rope_parameters") or {}
    if "rope_theta" in rope:
        data["rope_theta"] = rope["rope_theta"]
    if rope.get("rope_type", "default") != "default":
        data["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    config_path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _save_generation_config(path: Path, tokenizer_kind: str) -> None:
    spec = tokenizer_spec(tokenizer_kind)
    data = {
        "bos_token_id": spec.bos_token_id,
        "eos_token_id": list(spec.generation_eos_token_ids),
        "pad_token_id": spec.pad_token_id,
    }
    (path / "generation_config.json").write_text(json.dumps(data, indent=2) + "\n")


def _save_tokenizer(path: Path, tokenizer_kind: str) -> None:
    build_tokenizer(tokenizer_kind).save_pretrained(path)
    if tokenizer_kind == "sentencepiece":
        shutil.copyfile(sentencepiece_model_path(), path / "tokenizer.model")


# What GPT-OSS's released config.json says of its MXFP4 quantization.
MXFP4_QUANTIZATION_CONFIG = {"quant_method": "mxfp4", "modules_to_not_convert": [
    "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}


def store_experts_as_mxfp4(path: str | Path) -> Path:
    """Rewrite a GPT-OSS folder's expert weights (``mlp.experts.gate_up_proj`` / ``down_proj``,
    [E, in, out] as transformers saves them) in the released checkpoints' MXFP4 layout
    (``<proj>_blocks`` uint8 [E, out, in / 32, 16], ``<proj>_scales`` uint8 [E, out, in / 32];
    ``kvserve.model.quant_tensor.quantize_mxfp4``) and add their ``quantization_config``. Single-file
    checkpoints only. Returns the folder."""
    import torch
    from safetensors.torch import load_file, save_file

    from kvserve.model.quant_tensor import quantize_mxfp4, to_mxfp4

    path = Path(path)
    tensors = load_file(path / "model.safetensors")
    out = {}
    for name, tensor in tensors.items():
        if not name.endswith((".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")):
            out[name] = tensor
            continue
        pairs = [to_mxfp4(quantize_mxfp4(expert.t().float())) for expert in tensor]
        out[name + "_blocks"] = torch.stack([blocks for blocks, _ in pairs])
        out[name + "_scales"] = torch.stack([scales for _, scales in pairs])
    save_file(out, path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = MXFP4_QUANTIZATION_CONFIG
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return path
