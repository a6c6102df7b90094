"""Qwen2 / Qwen2.5 (Qwen team 2024, "Qwen2 Technical Report"): the Llama network with biases on
the q, k and v projections (none on o_proj). Sliding windows, when ``use_sliding_window`` is set,
come per layer from ``ModelArchConfig.layer_sliding_windows``."""

from __future__ import annotations

from kvserve.model.arch_config import ModelArchConfig
from kvserve.model.llama import AttentionOptions, LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Llama with ``qkv_proj`` bias; forward/compute_logits as ``LlamaForCausalLM``."""

    @classmethod
    def attention_options(cls, arch: ModelArchConfig) -> AttentionOptions:
        return AttentionOptions(qkv_bias=True, o_bias=False, qk_norm=False)
