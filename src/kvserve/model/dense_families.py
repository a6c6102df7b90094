"""Dense families on the Llama network with small hooks (``kvserve.model.llama``):

- Granite 3.x (IBM 2024): ``embedding_multiplier`` on the embedding, ``attention_multiplier`` as
  the softmax scale, ``residual_multiplier`` on each sublayer's output before its residual add,
  the logits divided by ``logits_scaling``.
- SmolLM3 (Hugging Face 2025): no rotary embedding on the layers ``no_rope_layers`` marks 0
  (every ``no_rope_layer_interval``-th layer when the list is absent).
- OLMo 2 (AI2 2024): the norms after the attention and the MLP (``PostNormDecoderLayer``), and an
  RMSNorm over all of the queries and all of the keys before the heads are split.
- Phi-3 / Phi-4 (Microsoft 2024): the projections stored fused (``qkv_proj``, ``gate_up_proj``:
  the loader fills the merged linears whole), LongRoPE and partial rotary dimensions
  (``kvserve.model.layers.RotaryEmbedding``).

Each reads its config fields here, once, and refuses a missing or meaningless one by name.
"""

from __future__ import annotations

from kvserve.errors import CheckpointError
from kvserve.model.arch_config import ModelArchConfig
from kvserve.model.llama import AttentionOptions, LlamaForCausalLM, ModelOptions, PostNormDecoderLayer


def _positive(arch: ModelArchConfig, key: str, default: float) -> float:
    value = arch.raw.get(key, default)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise CheckpointError(f"config.json: {key} must be a positive number, got {value!r}")
    return float(value)


class GraniteForCausalLM(LlamaForCausalLM):
    """Granite 3.0-3.3 dense (module docstring)."""

    @classmethod
    def attention_options(cls, arch: ModelArchConfig) -> AttentionOptions:
        return AttentionOptions(qkv_bias=arch.attention_bias, o_bias=arch.attention_bias, qk_norm=False,
                                scale=_positive(arch, "attention_multiplier", arch.head_dim**-0.5))

    @classmethod
    def model_options(cls, arch: ModelArchConfig) -> ModelOptions:
        return ModelOptions(embedding_multiplier=_positive(arch, "embedding_multiplier", 1.0),
                            residual_multiplier=_positive(arch, "residual_multiplier", 1.0),
                            logits_divisor=_positive(arch, "logits_scaling", 1.0))


class SmolLM3ForCausalLM(LlamaForCausalLM):
    """SmolLM3 (module docstring)."""

    @classmethod
    def attention_options(cls, arch: ModelArchConfig) -> AttentionOptions:
        layers = arch.raw.get("no_rope_layers")
        if layers is None:
            interval = int(arch.raw.get("no_rope_layer_interval", 4))
            layers = [int((i + 1) % interval != 0) for i in range(arch.num_hidden_layers)]
        if len(layers) != arch.num_hidden_layers or any(v not in (0, 1) for v in layers):
            raise CheckpointError(f"config.json: no_rope_layers must hold a 0 or 1 per layer "
                                  f"({arch.num_hidden_layers}), got {layers!r}")
        return AttentionOptions(qkv_bias=arch.attention_bias, o_bias=arch.attention_bias, qk_norm=False,
                                no_rope_layers=frozenset(i for i, rope in enumerate(layers) if not rope))


class Olmo2ForCausalLM(LlamaForCausalLM):
    """OLMo 2 (module docstring)."""

    layer_class = PostNormDecoderLayer

    @classmethod
    def attention_options(cls, arch: ModelArchConfig) -> AttentionOptions:
        return AttentionOptions(qkv_bias=arch.attention_bias, o_bias=arch.attention_bias, qk_norm="full")


class Phi3ForCausalLM(LlamaForCausalLM):
    """Phi-3, Phi-3.5 and Phi-4 (module docstring): the Llama network as it is; what differs is in
    the checkpoint's names and the rotary embedding, both handled generically."""

