"""config.json parsing and the rotary frequencies against transformers' own functions."""

from __future__ import annotations

import json

import pytest
import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from kvserve.errors import CheckpointError
from kvserve.model.arch_config import ModelArchConfig, RopeScaling
from kvserve.model.layers import compute_inv_freq

from model_fixtures import VARIANTS, hf_config

LLAMA = dict(
    architectures=["LlamaForCausalLM"],
    model_type="llama",
    vocab_size=100,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
)


def test_defaults_and_derived_fields():
    arch = ModelArchConfig.from_dict(dict(LLAMA, eos_token_id=[5, 7], torch_dtype="bfloat16"))
    assert (arch.head_dim, arch.num_key_value_heads, arch.rope_theta, arch.rope_scaling) == (16, 4, 10000.0, None)
    assert arch.eos_token_ids == (5, 7) and arch.torch_dtype == "bfloat16"
    assert arch.layer_sliding_windows == (None, None) and not arch.attention_bias


def test_classic_rope_scaling_fields():
    raw = dict(LLAMA, rope_theta=5e5, rope_scaling=dict(type="linear", factor=2.0))
    arch = ModelArchConfig.from_dict(raw)
    assert arch.rope_theta == 5e5 and arch.rope_scaling == RopeScaling("linear", 2.0)


def test_transformers5_rope_parameters():
    params = dict(rope_type="llama3", rope_theta=5e5, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                  original_max_position_embeddings=8192)
    arch = ModelArchConfig.from_dict(dict(LLAMA, rope_parameters=params))
    assert arch.rope_theta == 5e5
    assert arch.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)


def test_unsupported_rope_type_lists_supported():
    with pytest.raises(CheckpointError, match="'dynamic' is not supported; supported: default, linear, llama3, "
                                              "longrope, yarn"):
        ModelArchConfig.from_dict(dict(LLAMA, rope_scaling=dict(rope_type="dynamic", factor=4.0)))
    with pytest.raises(CheckpointError, match="rope type 'yarn' lacks original_max_position_embeddings"):
        ModelArchConfig.from_dict(dict(LLAMA, rope_scaling=dict(rope_type="yarn", factor=4.0)))


def test_missing_field_named():
    raw = dict(LLAMA)
    del raw["hidden_size"]
    with pytest.raises(CheckpointError, match="'hidden_size'"):
        ModelArchConfig.from_dict(raw)


def test_qwen2_sliding_window_only_with_use_sliding_window():
    qwen = dict(LLAMA, architectures=["Qwen2ForCausalLM"], model_type="qwen2", sliding_window=4096,
                max_window_layers=1)
    off = ModelArchConfig.from_dict(dict(qwen, use_sliding_window=False))
    assert off.sliding_window is None and off.layer_sliding_windows == (None, None) and off.attention_bias
    on = ModelArchConfig.from_dict(dict(qwen, use_sliding_window=True))
    assert on.layer_sliding_windows == (None, 4096)


def test_mistral_window_on_every_layer():
    arch = ModelArchConfig.from_dict(dict(LLAMA, architectures=["MistralForCausalLM"], sliding_window=6))
    assert arch.layer_sliding_windows == (6, 6)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_matches_transformers_config(variant, tmp_path):
    architecture, overrides = VARIANTS[variant]
    config = hf_config(architecture, overrides)
    config.architectures = [architecture]
    config.save_pretrained(tmp_path)
    arch = ModelArchConfig.from_file(tmp_path / "config.json")
    assert arch.architecture == architecture
    assert arch.head_dim == (getattr(config, "head_dim", None) or 16)
    assert arch.tie_word_embeddings == config.tie_word_embeddings
    # A window transformers does not use (Qwen2-MoE: use_sliding_window false, sliding_window 0) is None.
    window = getattr(config, "sliding_window", None) if getattr(config, "use_sliding_window", True) else None
    assert arch.sliding_window == (window or None)
    layer_types = getattr(config, "layer_types", None) or ["sliding_attention"] * config.num_hidden_layers
    assert arch.layer_sliding_windows == tuple(
        arch.sliding_window if t == "sliding_attention" else None for t in layer_types
    )
    # Rotary frequencies exactly as transformers computes them for this config (per layer type
    # where the config has a rotary embedding per layer type: Gemma 3).
    by_type = config.rope_parameters if "full_attention" in config.rope_parameters else {None: config.rope_parameters}
    for layer_type, params in by_type.items():
        rope_type = params.get("rope_type", "default")
        if rope_type == "default":
            expected = 1.0 / (params["rope_theta"] ** (torch.arange(0, arch.head_dim, 2).float() / arch.head_dim))
        else:
            kwargs = {} if layer_type is None else {"layer_type": layer_type}
            expected, _ = ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"), **kwargs)
        local = layer_type == "sliding_attention"
        theta = arch.local_rope_theta if local else arch.rope_theta
        ours = compute_inv_freq(arch.head_dim, theta, None if local else arch.rope_scaling)
        assert torch.equal(ours, expected), layer_type


def test_missing_config_file_named(tmp_path):
    with pytest.raises(CheckpointError, match="config.json not found"):
        ModelArchConfig.from_file(tmp_path / "config.json")


def test_invalid_json(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        ModelArchConfig.from_file(tmp_path / "config.json")


def test_round_trip_through_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(LLAMA, num_key_value_heads=2, head_dim=32)))
    arch = ModelArchConfig.from_file(tmp_path / "config.json")
    assert (arch.num_key_value_heads, arch.head_dim) == (2, 32)


def test_heads_must_divide():
    with pytest.raises(CheckpointError, match=r"num_attention_heads \(4\) must be a multiple of num_key_value_heads \(3\)"):
        ModelArchConfig.from_dict(dict(LLAMA, num_key_value_heads=3))
    with pytest.raises(CheckpointError, match="give head_dim explicitly"):
        ModelArchConfig.from_dict(dict(LLAMA, hidden_size=66))
    assert ModelArchConfig.from_dict(dict(LLAMA, hidden_size=66, head_dim=16)).head_dim == 16
