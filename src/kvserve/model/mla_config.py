"""DeepSeek's multi-head latent attention as ``config.json`` describes it (``MlaConfig``): the
low-rank query and KV widths, the rotary part, and the softmax scale with YaRN's ``mscale``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvserve.errors import CheckpointError
from kvserve.model.moe_config import DEEPSEEK_ARCHITECTURES
from kvserve.model.rope_config import rope_params, yarn_mscale


@dataclass(frozen=True)
class MlaConfig:
    """Multi-head latent attention (DeepSeek-AI 2024, "DeepSeek-V2", section 2.1;
    ``kvserve.model.deepseek``): keys and values come from one compressed latent per token, which
    is what the KV cache holds (``cache_width`` values per token and layer).

    Attributes:
        q_lora_rank: the queries' low-rank width (``q_a_proj`` -> norm -> ``q_b_proj``), or None:
            one ``q_proj`` (DeepSeek-V2-Lite).
        kv_lora_rank: the latent's width (``kv_a_proj_with_mqa`` -> norm; ``kv_b_proj`` expands it).
        qk_nope_head_dim, qk_rope_head_dim: a query/key head's dimensions without and with rotary
            embedding (the rotated key part is one per token, shared by all heads).
        v_head_dim: a value head's dimensions.
        softmax_scale: ``(nope + rope) ** -0.5``, times ``mscale(factor, mscale_all_dim) ** 2``
            under YaRN scaling (transformers' ``yarn_apply_mscale``).
        interleaved_rope: the rotated dimensions pair as (0, 1), (2, 3), ... (DeepSeek-V2; V3's
            ``rope_interleave``, default true) rather than Llama's halves.
        rope_float32: rotate in float32 and round once (DeepSeek-V2's complex product) rather than
            in the model dtype with rounded cos/sin (V3).
    """

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    softmax_scale: float
    interleaved_rope: bool
    rope_float32: bool

    @property
    def cache_width(self) -> int:
        """Values one token caches per layer: the latent, then the rotated shared key."""
        return self.kv_lora_rank + self.qk_rope_head_dim


def parse_mla(raw: dict[str, Any], architecture: str, source: str) -> MlaConfig | None:
    """DeepSeek-V2/V3's latent attention, or None for another architecture.

    Raises:
        CheckpointError: a width missing or not positive (named).
    """
    if architecture not in DEEPSEEK_ARCHITECTURES:
        return None
    widths = {}
    for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        value = raw.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise CheckpointError(f"{source}: {architecture} needs a positive integer {key!r}, got {value!r}")
        widths[key] = value
    if widths["qk_rope_head_dim"] % 2:
        raise CheckpointError(f"{source}: qk_rope_head_dim ({widths['qk_rope_head_dim']}) must be even")
    q_lora = raw.get("q_lora_rank")
    scale = (widths["qk_nope_head_dim"] + widths["qk_rope_head_dim"]) ** -0.5
    params = rope_params(raw)
    if params.get("rope_type", params.get("type", "default")) != "default" and params.get("mscale_all_dim"):
        scale *= yarn_mscale(float(params["factor"]), float(params["mscale_all_dim"])) ** 2
    v3 = architecture == "DeepseekV3ForCausalLM"
    return MlaConfig(q_lora_rank=int(q_lora) if q_lora else None, softmax_scale=scale,
                     interleaved_rope=bool(raw.get("rope_interleave", True)) if v3 else True, rope_float32=not v3,
                     **widths)
