"""The model architecture as read from a Hugging Face ``config.json``.

Accepts both the classic field names (``rope_theta`` + ``rope_scaling``, ``torch_dtype``) and the
ones transformers 5 writes (``rope_parameters``, ``dtype``), so checkpoints from either era load.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvserve.errors import CheckpointError
from kvserve.model.mla_config import MlaConfig, parse_mla
from kvserve.model.moe_config import MoeConfig, parse_moe
from kvserve.model.rope_config import RopeScaling, parse_layer_type_rope

SUPPORTED_ACTIVATIONS = ("silu", "gelu_pytorch_tanh")  # the gated MLP's: SwiGLU, GeGLU (tanh approximation)
# Encoders (kvserve.model.bert, kvserve.model.modernbert) and their activations (exact GELU too).
ENCODER_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")
ENCODER_MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "modernbert")
# RoBERTa's position ids start after the padding id (kvserve.model.bert): pad_token_id + 1 rows
# of its position table hold no position of a prompt.
_OFFSET_POSITIONS_MODEL_TYPES = ("roberta", "xlm-roberta")


@dataclass(frozen=True)
class ModelArchConfig:
    """Everything the model code needs from ``config.json``; token counts are in tokens.

    ``layer_sliding_windows[i]`` is the window of layer i (``None`` = full attention): Mistral
    applies ``sliding_window`` to every layer; Qwen2/Qwen3 only when ``use_sliding_window`` is set,
    and then to layers ``>= max_window_layers`` (or as ``layer_types`` says), as transformers does.
    """

    architectures: tuple[str, ...]
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    mlp_bias: bool
    sliding_window: int | None
    layer_sliding_windows: tuple[int | None, ...]
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    torch_dtype: str | None
    moe: MoeConfig | None = None
    partial_rotary_factor: float = 1.0  # the share of head_dim that is rotated (Phi-4-mini 0.75)
    hidden_act: str = "silu"  # the MLP's gate activation (SUPPORTED_ACTIVATIONS)
    local_rope_theta: float | None = None  # the sliding-window layers' own rope theta (Gemma 3), else None
    mla: MlaConfig | None = None  # multi-head latent attention (DeepSeek-V2/V3), else None
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)  # config.json, for family fields

    @property
    def architecture(self) -> str:
        return self.architectures[0]

    @property
    def rotary_dim(self) -> int:
        """The leading dimensions of a head that are rotated (all of head_dim unless a partial
        rotary factor says otherwise)."""
        return int(self.head_dim * self.partial_rotary_factor)

    @classmethod
    def from_file(cls, config_path: str | Path, overrides: Mapping[str, Any] | None = None) -> "ModelArchConfig":
        """Parse a ``config.json``, with ``--hf-overrides`` applied (``kvserve.model.hf_overrides``).

        Raises:
            CheckpointError: the file is missing, is not JSON, or lacks a required field.
        """
        from kvserve.model.hf_overrides import read_config_json

        path = Path(config_path)
        return cls.from_dict(read_config_json(path.parent, overrides), source=str(path))

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config.json") -> "ModelArchConfig":
        """Parse the fields of a ``config.json`` already loaded as a dict.

        Raises:
            CheckpointError: a required field is missing or the rope type is unsupported.
        """

        raw = with_family_defaults(text_model_fields(raw))

        def need(key: str) -> Any:
            if raw.get(key) is None:
                raise CheckpointError(f"{source} lacks the required field {key!r}")
            return raw[key]

        architectures = tuple(raw.get("architectures") or ())
        if not architectures:
            raise CheckpointError(f"{source} lacks 'architectures' (e.g. ['LlamaForCausalLM'])")
        num_heads = int(need("num_attention_heads"))
        hidden_size = int(need("hidden_size"))
        num_layers = int(need("num_hidden_layers"))
        num_kv_heads = int(raw.get("num_key_value_heads") or num_heads)
        if num_heads % num_kv_heads:
            raise CheckpointError(
                f"{source}: num_attention_heads ({num_heads}) must be a multiple of num_key_value_heads ({num_kv_heads})"
            )
        if not raw.get("head_dim") and hidden_size % num_heads:
            raise CheckpointError(
                f"{source}: hidden_size ({hidden_size}) is not divisible by num_attention_heads ({num_heads}); "
                "give head_dim explicitly"
            )
        rope_theta, rope_scaling, local_rope_theta = parse_layer_type_rope(raw, source)
        head_dim = int(raw.get("head_dim") or hidden_size // num_heads)
        partial = float((raw.get("rope_parameters") or {}).get("partial_rotary_factor",
                                                                raw.get("partial_rotary_factor", 1.0)))
        if not 0 < partial <= 1 or int(head_dim * partial) % 2:
            raise CheckpointError(f"{source}: partial_rotary_factor {partial} must be in (0, 1] and rotate an even "
                                  f"number of the {head_dim} head dimensions")
        if rope_scaling is not None and rope_scaling.rope_type == "longrope":
            half = int(head_dim * partial) // 2
            if len(rope_scaling.short_factor) != half or len(rope_scaling.long_factor) != half:
                raise CheckpointError(f"{source}: longrope short_factor and long_factor need {half} values each")
        activation = raw.get("hidden_activation") or raw.get("hidden_act") or "silu"
        encoder = raw.get("model_type") in ENCODER_MODEL_TYPES
        supported = ENCODER_ACTIVATIONS if encoder else SUPPORTED_ACTIVATIONS
        if activation not in supported:
            raise CheckpointError(f"{source}: hidden_act {activation!r} is not supported for {architectures[0]}; "
                                  f"supported: {', '.join(supported)}")
        sliding_window = _parse_sliding_window(raw)
        eos = raw.get("eos_token_id")
        return cls(
            architectures=architectures,
            model_type=str(raw.get("model_type", "")),
            vocab_size=int(need("vocab_size")),
            hidden_size=hidden_size,
            intermediate_size=int(need("intermediate_size")),
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=_max_positions(raw),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            # Qwen2 always has q/k/v biases; Llama/Mistral/Qwen3 follow ``attention_bias``.
            attention_bias=bool(raw.get("attention_bias", raw.get("model_type") == "qwen2")),
            mlp_bias=bool(raw.get("mlp_bias", False)),
            sliding_window=sliding_window,
            layer_sliding_windows=_layer_windows(raw, sliding_window, num_layers),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=tuple(eos if isinstance(eos, list) else ([] if eos is None else [eos])),
            torch_dtype=raw.get("dtype") or raw.get("torch_dtype"),
            moe=parse_moe(raw, architectures[0], num_layers, source),
            partial_rotary_factor=partial,
            hidden_act=activation,
            local_rope_theta=local_rope_theta,
            mla=parse_mla(raw, architectures[0], source),
            raw=dict(raw),
        )


def text_model_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """The language model's fields of a config.json: a multimodal checkpoint's ``text_config``
    (Gemma 3 4B-27B, ``Gemma3ForConditionalGeneration``) over its top-level fields (token ids,
    dtype, ``architectures``), or ``raw`` itself."""
    text = raw.get("text_config")
    if not isinstance(text, dict) or "num_hidden_layers" in raw:
        return raw
    top = {k: v for k, v in raw.items() if k not in ("text_config", "vision_config", "model_type")}
    return {**top, **text, "architectures": raw.get("architectures")}


# Fields some families leave out of config.json because transformers' config class supplies them
# (Gemma 3's multimodal checkpoints carry a text_config of six fields): its defaults, as
# transformers 5 defines them, for the fields a file does not have (a field written as null stays
# null: no soft-capping). Gemma 2 alternates sliding and full layers from layer 0, Gemma 3 has
# five sliding layers before each full one (``sliding_window_pattern``).
_GEMMA_DEFAULTS = dict(vocab_size=256_000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                       num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                       hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6, tie_word_embeddings=True,
                       query_pre_attn_scalar=256, sliding_window=4096)
_FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma2": {**_GEMMA_DEFAULTS, "max_position_embeddings": 8192, "final_logit_softcapping": 30.0,
               "attn_logit_softcapping": 50.0},
    "gemma3_text": {**_GEMMA_DEFAULTS, "vocab_size": 262_208, "max_position_embeddings": 131_072,
                    "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0},
}


def with_family_defaults(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with the defaults of its ``model_type`` (above) under its own fields, and the
    per-layer attention types of Gemma 2/3 when config.json does not list them."""
    model_type = raw.get("model_type")
    raw = {**_FAMILY_DEFAULTS.get(model_type, {}), **raw}
    if raw.get("kv_lora_rank") and raw.get("qk_rope_head_dim"):  # MLA: the rotary embedding's width
        raw = {**raw, "head_dim": int(raw["qk_rope_head_dim"])}
    pattern = {"gemma2": 2, "gemma3_text": int(raw.get("sliding_window_pattern") or 6)}.get(model_type)
    if pattern and not raw.get("layer_types") and raw.get("num_hidden_layers"):
        raw = {**raw, "layer_types": ["sliding_attention" if (i + 1) % pattern else "full_attention"
                                      for i in range(int(raw["num_hidden_layers"]))]}
    return raw


def _max_positions(raw: dict[str, Any]) -> int:
    """The positions a prompt may use: ``max_position_embeddings``, less RoBERTa's offset
    (``pad_token_id + 1``, 514 -> 512)."""
    positions = int(raw.get("max_position_embeddings", 2048))
    if raw.get("model_type") in _OFFSET_POSITIONS_MODEL_TYPES:
        positions -= int(raw.get("pad_token_id", 1)) + 1
    return positions


def _parse_sliding_window(raw: dict[str, Any]) -> int | None:
    window = raw.get("sliding_window")
    # Qwen2/Qwen3 configs carry a sliding_window value that is only used with use_sliding_window.
    if "use_sliding_window" in raw and not raw["use_sliding_window"]:
        return None
    return int(window) if window else None


def _layer_windows(raw: dict[str, Any], window: int | None, num_layers: int) -> tuple[int | None, ...]:
    if window is None:
        return (None,) * num_layers
    layer_types = raw.get("layer_types")
    if layer_types and len(layer_types) == num_layers:
        return tuple(window if t == "sliding_attention" else None for t in layer_types)
    if "max_window_layers" in raw:
        first = int(raw["max_window_layers"])
        return tuple(window if i >= first else None for i in range(num_layers))
    return (window,) * num_layers
