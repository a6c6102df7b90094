"""Qwen3 (Qwen team 2025, "Qwen3 Technical Report"): the Llama network with a per-head RMSNorm on
queries and keys (``q_norm``/``k_norm`` over ``head_dim``) applied before the rotary embedding,
and no q/k/v bias unless ``attention_bias``. ``head_dim`` is usually not hidden/heads."""

from __future__ import annotations

from kvserve.model.arch_config import ModelArchConfig
from kvserve.model.llama import AttentionOptions, LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Llama with q/k RMSNorm per head; forward/compute_logits as ``LlamaForCausalLM``."""

    @classmethod
    def attention_options(cls, arch: ModelArchConfig) -> AttentionOptions:
        return AttentionOptions(qkv_bias=arch.attention_bias, o_bias=arch.attention_bias, qk_norm=True)
