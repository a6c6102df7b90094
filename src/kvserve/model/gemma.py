"""Gemma 2 (Google DeepMind 2024, "Gemma 2: Improving Open Language Models at a Practical Size")
and Gemma 3 (2025, "Gemma 3 Technical Report") on the Llama network's hooks
(``kvserve.model.llama``), text only. Both:

- RMSNorm with ``(1 + weight)``, multiplied in float32 before the cast (``GemmaRMSNorm``);
- the embedding times ``sqrt(hidden_size)`` rounded to the model dtype;
- GeGLU with the tanh GELU (``hidden_activation``; ``kvserve.model.layers.GeluTanhAndMul``);
- four norms per layer: before and after the attention, before and after the MLP;
- the softmax scale ``query_pre_attn_scalar ** -0.5``; sliding-window and full layers
  (``layer_types``);
- soft-capped logits where config.json sets ``final_logit_softcapping`` (Gemma 2: 30; Gemma 3:
  none), and attention scores where it sets ``attn_logit_softcapping`` (Gemma 2: 50).

Gemma 2 alternates sliding and full layers. Gemma 3 adds per-head q/k norms and has five sliding
layers per full one, the sliding layers with their own rope theta (``rope_local_base_freq``,
10,000) and no rope scaling, the full layers with ``rope_theta`` (1,000,000) and
``rope_scaling`` (linear 8 on 4B-27B).

``Gemma3ForConditionalGeneration`` (4B, 12B, 27B) is served as its language model: config.json's
``text_config``, the tensors under ``language_model`` (the vision tower is not loaded; image
inputs are refused by the API).
"""

from __future__ import annotations

import torch
from torch import nn

from kvserve.errors import CheckpointError
from kvserve.model.arch_config import ModelArchConfig
from kvserve.model.layers import GemmaRMSNorm, RotaryEmbedding
from kvserve.model.llama import AttentionOptions, LlamaAttention, LlamaForCausalLM, LlamaModel, ModelOptions


class GemmaDecoderLayer(nn.Module):
    """``h = h + post_attn_norm(attn(input_norm(h))); h = h + post_ff_norm(mlp(pre_ff_norm(h)))``,
    the adds in the model dtype. forward as ``LlamaDecoderLayer``'s, the residual always folded
    in (it returns ``(h, None)``); ``local_rope`` says whether it takes the sliding layers'
    rotary embedding."""

    def __init__(self, arch: ModelArchConfig, layer_idx: int, backend, options: AttentionOptions, mlp: nn.Module,
                 residual_multiplier: float = 1.0):
        super().__init__()
        self.self_attn = LlamaAttention(arch, layer_idx, backend, options)
        self.mlp = mlp
        self.local_rope = arch.layer_sliding_windows[layer_idx] is not None
        eps = arch.rms_norm_eps
        self.input_layernorm = options.norm_class(arch.hidden_size, eps)
        self.post_attention_layernorm = options.norm_class(arch.hidden_size, eps)
        self.pre_feedforward_layernorm = options.norm_class(arch.hidden_size, eps)
        self.post_feedforward_layernorm = options.norm_class(arch.hidden_size, eps)

    def forward(self, hidden, residual, cos, sin, kv_cache, attn_metadata):
        attn = self.self_attn(self.input_layernorm(hidden), cos, sin, kv_cache, attn_metadata)
        hidden = hidden + self.post_attention_layernorm(attn)
        return hidden + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(hidden))), None


class GemmaModel(LlamaModel):
    """``LlamaModel`` with Gemma's embedding scale and the sliding layers' own rotary
    embedding (``local_rotary_emb``; None when they share the full layers')."""

    def __init__(self, arch: ModelArchConfig, backend, options: AttentionOptions, build_mlp, layer_class,
                 model_options: ModelOptions = ModelOptions()):
        super().__init__(arch, backend, options, build_mlp, layer_class, model_options)
        self.local_rotary_emb = (None if arch.local_rope_theta is None else
                                 RotaryEmbedding(arch.head_dim, arch.local_rope_theta, None, arch.rotary_dim))
        self.embed_scale = arch.hidden_size**0.5

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The token embeddings times sqrt(hidden_size), the factor rounded to float32 and then to
        the model dtype as transformers rounds it (55.4256 is 55.5 in bfloat16)."""
        hidden = self.embed_tokens(input_ids)
        return hidden * torch.tensor(self.embed_scale).to(hidden.dtype)

    def forward(self, input_ids, positions, kv_caches, attn_metadata):
        hidden = self.embed(input_ids)
        full = self.rotary_emb.cos_sin(positions, hidden.dtype)
        local = full if self.local_rotary_emb is None else self.local_rotary_emb.cos_sin(positions, hidden.dtype)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            cos, sin = local if layer.local_rope else full
            hidden, _ = layer(hidden, None, cos, sin, kv_cache, attn_metadata)
        return self.norm(hidden)


def _positive_or_none(arch: ModelArchConfig, key: str, default) -> float:
    """config.json's ``key`` as a float (0.0 where it is null), refused unless positive."""
    value = arch.raw.get(key, default)
    if value is None:
        return 0.0
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise CheckpointError(f"config.json: {key} must be a positive number or null, got {value!r}")
    return float(value)


class Gemma2ForCausalLM(LlamaForCausalLM):
    """Gemma 2 (2B, 9B, 27B; module docstring)."""

    layer_class = GemmaDecoderLayer
    model_class = GemmaModel
    qk_norm = False

    @classmethod
    def attention_options(cls, arch: ModelArchConfig) -> AttentionOptions:
        if arch.raw.get("use_bidirectional_attention"):
            raise CheckpointError(f"config.json: use_bidirectional_attention (an embedding model's) is not supported "
                                  f"for {arch.architecture}; kvserve runs causal language models")
        scalar = _positive_or_none(arch, "query_pre_attn_scalar", arch.head_dim) or arch.head_dim
        return AttentionOptions(qkv_bias=arch.attention_bias, o_bias=arch.attention_bias, qk_norm=cls.qk_norm,
                                scale=scalar**-0.5, norm_class=GemmaRMSNorm,
                                softcap=_positive_or_none(arch, "attn_logit_softcapping", None))

    @classmethod
    def model_options(cls, arch: ModelArchConfig) -> ModelOptions:
        return ModelOptions(logit_softcap=_positive_or_none(arch, "final_logit_softcapping", None))


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    """Gemma 3 text models (1B, 270M; module docstring). Its configs write
    ``attn_logit_softcapping: null``; transformers' Gemma 3 attention ignores the field, so a value
    there has no reference to follow and is refused."""

    qk_norm = True

    @classmethod
    def attention_options(cls, arch: ModelArchConfig) -> AttentionOptions:
        if arch.raw.get("attn_logit_softcapping") is not None:
            raise CheckpointError(f"config.json: attn_logit_softcapping={arch.raw['attn_logit_softcapping']!r} is not "
                                  f"supported for {arch.architecture} (transformers' Gemma 3 does not apply it); "
                                  "supported: null")
        return super().attention_options(arch)


class Gemma3ForConditionalGeneration(Gemma3ForCausalLM):
    """Gemma 3 4B-27B served as its language model (module docstring). The checkpoint's names:
    ``language_model.model.*`` (as Google published them) or ``model.language_model.*``
    (transformers 5)."""

    checkpoint_renames = (("language_model.model.", "model."), ("model.language_model.", "model."),
                          ("language_model.lm_head.", "lm_head."))
    checkpoint_ignored = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                          "model.multi_modal_projector.")
