"""LongRoPE and partial rotary dimensions (``kvserve.model.layers.RotaryEmbedding``) against
transformers' own frequency functions: short factors below the original context, the long ones
from there (per position), cos and sin times the attention factor; only the rotary dimensions
are rotated."""

from __future__ import annotations

import torch
from model_fixtures import VARIANTS, hf_config
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from kvserve.model.arch_config import ModelArchConfig
from kvserve.model.layers import RotaryEmbedding


def test_longrope_takes_the_long_factors_from_the_original_length_on(tmp_path):
    architecture, overrides = VARIANTS["phi3_longrope"]
    config = hf_config(architecture, overrides)
    config.architectures = [architecture]
    config.save_pretrained(tmp_path)
    arch = ModelArchConfig.from_file(tmp_path / "config.json")
    rotary = RotaryEmbedding(arch.head_dim, arch.rope_theta, arch.rope_scaling, arch.rotary_dim)
    short, factor = ROPE_INIT_FUNCTIONS["longrope"](config, torch.device("cpu"))
    long, long_factor = ROPE_INIT_FUNCTIONS["longrope"](config, torch.device("cpu"), seq_len=200)
    assert factor == long_factor == arch.rope_scaling.attention_factor and factor > 1
    positions = torch.tensor([0, 5, 63, 64, 65, 199])
    cos, sin = rotary.cos_sin(positions, torch.float32)
    for i, p in enumerate(positions.tolist()):
        freqs = p * (short if p < 64 else long)
        emb = torch.cat((freqs, freqs))
        assert torch.equal(cos[i], emb.cos() * factor) and torch.equal(sin[i], emb.sin() * factor)


def test_a_partial_rotary_rotates_only_its_share():
    rotary = RotaryEmbedding(16, 10000.0, None, rotary_dim=8)
    cos, sin = rotary.cos_sin(torch.arange(3), torch.float32)
    assert cos.shape == (3, 8)
    x = torch.randn(3, 2, 16)
    out = RotaryEmbedding.apply(x, cos, sin)
    assert torch.equal(out[..., 8:], x[..., 8:])
    assert torch.equal(out[..., :8], RotaryEmbedding.apply(x[..., :8].contiguous(), cos, sin))
