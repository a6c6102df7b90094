"""Rotary position embedding as ``config.json`` describes it: the rope type and its scaling
(``default``, ``linear``, ``llama3``, ``longrope``, ``yarn``), read from the classic
``rope_theta`` + ``rope_scaling`` fields or transformers 5's ``rope_parameters`` (also per layer
type, for Gemma 3's local and global layers)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kvserve.errors import CheckpointError


SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "longrope", "yarn")


_DEFAULT_ROPE_THETA = 10000.0


@dataclass(frozen=True)
class RopeScaling:
    """Rotary-embedding frequency scaling (see ``kvserve.model.layers.compute_inv_freq``).

    Attributes:
        rope_type: ``linear`` (positions divided by ``factor``; Chen et al. 2023, "Extending
            Context Window of Large Language Models via Positional Interpolation"), ``llama3``
            (Meta's Llama 3.1 piecewise low/high-frequency scaling) or ``longrope`` (Ding et al.
            2024, "LongRoPE"; Phi-3/Phi-4: per-frequency ``short_factor`` below
            ``original_max_position_embeddings``, ``long_factor`` from there, cos and sin times
            ``attention_factor``) or ``yarn`` (Peng et al. 2023, "YaRN"; GPT-OSS, DeepSeek-V3, Qwen
            long context: the frequencies blended between interpolated and extrapolated along a ramp
            from ``beta_fast`` to ``beta_slow`` rotations, cos and sin times ``attention_factor``).
        factor: scaling factor (linear, llama3, yarn; longrope: max / original positions).
        low_freq_factor, high_freq_factor: llama3 only.
        original_max_position_embeddings: llama3, longrope, yarn.
        short_factor, long_factor: longrope only; attention_factor: longrope, yarn.
        beta_fast, beta_slow, truncate: yarn only (``truncate``: the ramp's ends rounded outwards).
    """

    rope_type: str
    factor: float
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    original_max_position_embeddings: int | None = None
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    attention_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True


def parse_layer_type_rope(raw: dict[str, Any], source: str) -> tuple[float, RopeScaling | None, float | None]:
    """(theta, scaling, local theta): the full-attention layers' rotary embedding and, where the
    sliding-window layers have their own theta (Gemma 3: ``rope_local_base_freq``, or
    transformers 5's ``rope_parameters`` keyed by layer type), that theta; else None."""
    params = raw.get("rope_parameters")
    if isinstance(params, dict) and isinstance(params.get("full_attention"), dict):
        local = params.get("sliding_attention") or {}
        theta, scaling = _parse_rope({**raw, "rope_parameters": params["full_attention"]}, source)
        local_theta, local_scaling = _parse_rope({"rope_parameters": local}, source)
        if local_scaling is not None:
            raise CheckpointError(f"{source}: rope type {local_scaling.rope_type!r} on the sliding-window layers "
                                  "is not supported; supported there: default")
        return theta, scaling, local_theta if local else None
    theta, scaling = _parse_rope(raw, source)
    local = raw.get("rope_local_base_freq")
    return theta, scaling, None if local is None else float(local)


def rope_params(raw: dict[str, Any]) -> dict[str, Any]:
    """``rope_scaling`` (classic) and ``rope_parameters`` (transformers 5) merged, the latter first."""
    params: dict[str, Any] = {}
    for key in ("rope_scaling", "rope_parameters"):
        if isinstance(raw.get(key), dict):
            params.update(raw[key])
    return params


def yarn_mscale(factor: float, m: float = 1.0) -> float:
    """YaRN's magnitude scale ``0.1 * m * ln(factor) + 1`` (1 when factor <= 1): transformers'
    ``get_mscale``."""
    return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0


def _parse_rope(raw: dict[str, Any], source: str) -> tuple[float, RopeScaling | None]:
    """Merge ``rope_theta``/``rope_scaling`` (classic) and ``rope_parameters`` (transformers 5)."""
    params = rope_params(raw)
    theta = float(params.get("rope_theta", raw.get("rope_theta", _DEFAULT_ROPE_THETA)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise CheckpointError(
            f"{source}: rope type {rope_type!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    if rope_type == "default":
        return theta, None
    if rope_type == "longrope":
        return theta, _parse_longrope(raw, params, source)
    if rope_type == "yarn":
        return theta, _parse_yarn(raw, params, source)
    if "factor" not in params:
        raise CheckpointError(f"{source}: rope type {rope_type!r} needs a 'factor'")
    if rope_type == "linear":
        return theta, RopeScaling("linear", float(params["factor"]))
    missing = [
        k
        for k in ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        if k not in params
    ]
    if missing:
        raise CheckpointError(f"{source}: rope type 'llama3' lacks {', '.join(missing)}")
    return theta, RopeScaling(
        "llama3",
        float(params["factor"]),
        float(params["low_freq_factor"]),
        float(params["high_freq_factor"]),
        int(params["original_max_position_embeddings"]),
    )


def _parse_longrope(raw: dict[str, Any], params: dict[str, Any], source: str) -> RopeScaling:
    """LongRoPE as transformers reads it: the factor defaults to max / original positions, the
    attention factor to sqrt(1 + ln(factor) / ln(original)) (1 when factor <= 1)."""
    original = params.get("original_max_position_embeddings", raw.get("original_max_position_embeddings"))
    missing = [k for k, v in (("short_factor", params.get("short_factor")), ("long_factor", params.get("long_factor")),
                              ("original_max_position_embeddings", original)) if v is None]
    if missing:
        raise CheckpointError(f"{source}: rope type 'longrope' lacks {', '.join(missing)}")
    factor = float(params.get("factor") or raw.get("max_position_embeddings", original) / original)
    attention = params.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return RopeScaling("longrope", factor, original_max_position_embeddings=int(original),
                       short_factor=tuple(float(v) for v in params["short_factor"]),
                       long_factor=tuple(float(v) for v in params["long_factor"]), attention_factor=float(attention))


def _parse_yarn(raw: dict[str, Any], params: dict[str, Any], source: str) -> RopeScaling:
    """YaRN as transformers reads it: the factor defaults to max / original positions; the
    attention factor, where not given, is ``0.1 * ln(factor) + 1`` (1 when factor <= 1), or the
    ratio of that with ``mscale`` and with ``mscale_all_dim`` where both are set (DeepSeek)."""
    original = params.get("original_max_position_embeddings")
    if original is None:
        raise CheckpointError(f"{source}: rope type 'yarn' lacks original_max_position_embeddings")
    factor = params.get("factor")
    factor = float(raw.get("max_position_embeddings", original) / original if factor is None else factor)
    attention = params.get("attention_factor")
    if attention is None:
        m, m_all = params.get("mscale"), params.get("mscale_all_dim")
        attention = yarn_mscale(factor, m) / yarn_mscale(factor, m_all) if m and m_all else yarn_mscale(factor)
    return RopeScaling("yarn", factor, original_max_position_embeddings=int(original),
                       attention_factor=float(attention), beta_fast=float(params.get("beta_fast") or 32),
                       beta_slow=float(params.get("beta_slow") or 1), truncate=bool(params.get("truncate", True)))
