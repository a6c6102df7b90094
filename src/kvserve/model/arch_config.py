"""The model architecture as read from a Hugging Face ``config.json``.

Accepts both the classic field names (``rope_theta`` + ``rope_scaling``, ``torch_dtype``) and the
ones transformers 5 writes (``rope_parameters``, ``dtype``), so checkpoints from either era load.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvserve.errors import CheckpointError

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "longrope", "yarn")
SUPPORTED_ACTIVATIONS = ("silu", "gelu_pytorch_tanh")  # the gated MLP's: SwiGLU, GeGLU (tanh approximation)
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


@dataclass(frozen=True)
class MoeConfig:
    """A mixture-of-experts feed-forward (``kvserve.model.moe``), as config.json describes it.

    Attributes:
        num_experts: routed experts per sparse layer (``num_experts``, or ``num_local_experts``:
            Mixtral's, and what transformers 5 writes for Qwen3-MoE).
        top_k: experts per token (``num_experts_per_tok``).
        intermediate_size: one expert's width (``moe_intermediate_size``; Mixtral's
            ``intermediate_size``).
        norm_topk_prob: the top-k probabilities renormalised to sum to 1 (Mixtral always).
        shared_expert_intermediate_size: Qwen2-MoE's shared expert (gated by a sigmoid), 0 = none.
        sparse_layers: the layers whose feed-forward is the MoE block; the others are dense
            (``decoder_sparse_step`` and ``mlp_only_layers``, as transformers builds them).
        routing_weights_float32: the routing weights multiply the experts' outputs in float32
            (Mixtral) rather than rounded to the model dtype first (Qwen2/Qwen3-MoE).
        routing: ``softmax_topk`` (softmax over the experts, then the top k), ``topk_softmax``
            (the top k logits, then a softmax over them: GPT-OSS), ``sigmoid_grouped`` (DeepSeek-V3:
            sigmoid scores plus a correction bias choose the ``topk_group`` best of ``n_group``
            groups, each group scored by its two best experts, then the top k within them; the
            weights are the scores without the bias) or ``softmax_grouped`` (DeepSeek-V2: softmax
            scores, groups scored by their best expert; ``greedy`` is one group).
        n_group, topk_group: the grouped routers' expert groups and the groups a token may use.
        routed_scaling_factor: the grouped routers' weights are multiplied by it (after
            ``norm_topk_prob``'s renormalisation).
        score_correction_bias: DeepSeek-V3's ``e_score_correction_bias`` (float32 [E]) is added
            to the scores that choose the experts.
        shared_expert_gated: Qwen2-MoE's shared expert is behind a sigmoid gate; DeepSeek's shared
            experts (``n_shared_experts`` of them, as one wider MLP) are added as they are.
        router_bias, expert_bias: biases on the router and on each expert's two projections (GPT-OSS).
        activation: the experts' gate: ``silu`` (SwiGLU) or ``swiglu_clamped`` (GPT-OSS: gate
            clamped above at ``swiglu_limit``, up to +-limit, ``(up + 1) * gate * sigmoid(alpha * gate)``).
        held_experts: the experts [start, end) a tensor-parallel rank holds under expert
            parallelism (``kvserve.distributed.shard``); None: all of them.
    """

    num_experts: int
    top_k: int
    intermediate_size: int
    norm_topk_prob: bool
    shared_expert_intermediate_size: int
    sparse_layers: tuple[int, ...]
    routing_weights_float32: bool
    routing: str = "softmax_topk"
    router_bias: bool = False
    expert_bias: bool = False
    activation: str = "silu"
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    held_experts: tuple[int, int] | None = None
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    score_correction_bias: bool = False
    shared_expert_gated: bool = True

    @property
    def grouped(self) -> bool:
        """DeepSeek's routers: float32 logits of float32 inputs, grouped top-k (``routing``)."""
        return self.routing in ("sigmoid_grouped", "softmax_grouped")

    @property
    def expert_range(self) -> range:
        """The experts this block holds (all, or a rank's share)."""
        return range(*(self.held_experts or (0, self.num_experts)))


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
    def from_file(cls, config_path: str | Path) -> "ModelArchConfig":
        """Parse a ``config.json``.

        Raises:
            CheckpointError: the file is missing, is not JSON, or lacks a required field.
        """
        path = Path(config_path)
        if not path.is_file():
            raise CheckpointError(f"config.json not found: {path} (a model folder needs config.json)")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"{path} is not valid JSON: {exc}") from exc
        return cls.from_dict(raw, source=str(path))

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
        rope_theta, rope_scaling, local_rope_theta = _parse_layer_type_rope(raw, source)
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
        if activation not in SUPPORTED_ACTIVATIONS:
            raise CheckpointError(f"{source}: hidden_act {activation!r} is not supported for {architectures[0]}; "
                                  f"supported: {', '.join(SUPPORTED_ACTIVATIONS)}")
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
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            # Qwen2 always has q/k/v biases; Llama/Mistral/Qwen3 follow ``attention_bias``.
            attention_bias=bool(raw.get("attention_bias", raw.get("model_type") == "qwen2")),
            mlp_bias=bool(raw.get("mlp_bias", False)),
            sliding_window=sliding_window,
            layer_sliding_windows=_layer_windows(raw, sliding_window, num_layers),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=tuple(eos if isinstance(eos, list) else ([] if eos is None else [eos])),
            torch_dtype=raw.get("dtype") or raw.get("torch_dtype"),
            moe=_parse_moe(raw, architectures[0], num_layers, source),
            partial_rotary_factor=partial,
            hidden_act=activation,
            local_rope_theta=local_rope_theta,
            mla=_parse_mla(raw, architectures[0], source),
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


def _parse_layer_type_rope(raw: dict[str, Any], source: str) -> tuple[float, RopeScaling | None, float | None]:
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


def _rope_params(raw: dict[str, Any]) -> dict[str, Any]:
    """``rope_scaling`` (classic) and ``rope_parameters`` (transformers 5) merged, the latter first."""
    params: dict[str, Any] = {}
    for key in ("rope_scaling", "rope_parameters"):
        if isinstance(raw.get(key), dict):
            params.update(raw[key])
    return params


def _yarn_mscale(factor: float, m: float = 1.0) -> float:
    """YaRN's magnitude scale ``0.1 * m * ln(factor) + 1`` (1 when factor <= 1): transformers'
    ``get_mscale``."""
    return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0


def _parse_rope(raw: dict[str, Any], source: str) -> tuple[float, RopeScaling | None]:
    """Merge ``rope_theta``/``rope_scaling`` (classic) and ``rope_parameters`` (transformers 5)."""
    params = _rope_params(raw)
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


# Routers kvserve runs: softmax over the experts, then the top k (``scoring_func`` where a config
# names it). A config field that changes routing and is not read here is refused by name.
_MOE_FIELDS_REFUSED = ("n_group", "topk_group", "routed_scaling_factor", "n_shared_experts", "topk_method")


def _parse_moe(raw: dict[str, Any], architecture: str, num_layers: int, source: str) -> MoeConfig | None:
    """The MoE block of Mixtral / Qwen2-MoE / Qwen3-MoE configs, or None for a dense model.

    Raises:
        CheckpointError: top_k outside [1, num_experts], an expert width missing, or a routing
            switch kvserve does not implement (named).
    """
    if architecture in DEEPSEEK_ARCHITECTURES:
        return _parse_deepseek_moe(raw, architecture, num_layers, source)
    mixtral = architecture == "MixtralForCausalLM"
    gpt_oss = architecture == "GptOssForCausalLM"
    experts = raw.get("num_experts") or raw.get("num_local_experts")  # transformers 5 writes the latter
    if not experts:
        return None
    for key in _MOE_FIELDS_REFUSED:
        if raw.get(key) not in (None, 0, 1, 1.0, False):
            raise CheckpointError(f"{source}: MoE routing field {key}={raw[key]!r} is not supported for {architecture}")
    activation = raw.get("hidden_activation") or raw.get("hidden_act") or "silu"
    if activation != "silu":
        raise CheckpointError(f"{source}: hidden_act {activation!r} is not supported for the experts of {architecture}; "
                              "supported: silu")
    if raw.get("scoring_func", "softmax") != "softmax":
        raise CheckpointError(f"{source}: scoring_func {raw['scoring_func']!r} is not supported; supported: softmax")
    top_k = int(raw.get("num_experts_per_tok") or 0)
    if not 1 <= top_k <= int(experts):
        raise CheckpointError(f"{source}: num_experts_per_tok ({top_k}) must be in [1, {experts}]")
    width_key = "intermediate_size" if mixtral or gpt_oss else "moe_intermediate_size"
    width = raw.get(width_key)
    if not width:
        raise CheckpointError(f"{source} lacks the expert width {width_key!r}")
    step = int(raw.get("decoder_sparse_step") or 1)
    dense = set(raw.get("mlp_only_layers") or ())
    sparse = tuple(i for i in range(num_layers) if i not in dense and (i + 1) % step == 0)
    common = dict(num_experts=int(experts), top_k=top_k, intermediate_size=int(width), sparse_layers=sparse,
                  shared_expert_intermediate_size=int(raw.get("shared_expert_intermediate_size") or 0))
    if gpt_oss:
        limit, alpha = raw.get("swiglu_limit", 7.0), raw.get("swiglu_alpha", 1.702)
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in (limit, alpha)):
            raise CheckpointError(f"{source}: swiglu_limit and swiglu_alpha must be positive numbers, got "
                                  f"{limit!r} and {alpha!r}")
        return MoeConfig(**common, norm_topk_prob=False, routing_weights_float32=False, routing="topk_softmax",
                         router_bias=True, expert_bias=True, activation="swiglu_clamped", swiglu_alpha=float(alpha),
                         swiglu_limit=float(limit))
    return MoeConfig(**common, norm_topk_prob=mixtral or bool(raw.get("norm_topk_prob", False)),
                     routing_weights_float32=mixtral)


DEEPSEEK_ARCHITECTURES = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")


def _parse_deepseek_moe(raw: dict[str, Any], architecture: str, num_layers: int, source: str) -> MoeConfig | None:
    """DeepSeek-V2/V3's MoE: ``n_routed_experts`` experts from layer ``first_k_dense_replace`` on,
    ``n_shared_experts`` shared ones, grouped routing (V3: sigmoid scores with the correction
    bias, ``noaux_tc``; V2: softmax, ``greedy`` or ``group_limited_greedy``).

    Raises:
        CheckpointError: a routing switch kvserve does not implement, or inconsistent sizes (named).
    """
    experts = int(raw.get("n_routed_experts") or 0)
    if not experts:
        return None
    v3 = architecture == "DeepseekV3ForCausalLM"
    scoring, method = raw.get("scoring_func") or ("sigmoid" if v3 else "softmax"), raw.get("topk_method")
    allowed = {"sigmoid": ("noaux_tc",)} if v3 else {"softmax": ("greedy", "group_limited_greedy")}
    if scoring not in allowed:
        raise CheckpointError(f"{source}: scoring_func {scoring!r} is not supported for {architecture}; "
                              f"supported: {', '.join(allowed)}")
    if method is not None and method not in allowed[scoring]:
        raise CheckpointError(f"{source}: topk_method {method!r} is not supported for {architecture}; "
                              f"supported: {', '.join(allowed[scoring])}")
    if int(raw.get("moe_layer_freq") or 1) != 1:
        raise CheckpointError(f"{source}: moe_layer_freq={raw['moe_layer_freq']!r} is not supported; supported: 1")
    activation = raw.get("hidden_act") or "silu"
    if activation != "silu":
        raise CheckpointError(f"{source}: hidden_act {activation!r} is not supported for {architecture}; supported: silu")
    grouped = v3 or method == "group_limited_greedy"
    n_group = int(raw.get("n_group") or 1) if grouped else 1
    topk_group = int(raw.get("topk_group") or 1) if grouped else 1
    top_k = int(raw.get("num_experts_per_tok") or 0)
    per_group = experts // n_group if n_group else 0
    if experts % max(n_group, 1) or not 1 <= topk_group <= n_group or not 1 <= top_k <= topk_group * per_group \
            or (v3 and per_group < 2):
        raise CheckpointError(f"{source}: n_routed_experts={experts}, n_group={n_group}, topk_group={topk_group}, "
                              f"num_experts_per_tok={top_k}: the groups must split the experts evenly (at least 2 "
                              "per group for sigmoid scores), 1 <= topk_group <= n_group, and top_k must fit in "
                              "the chosen groups")
    width = raw.get("moe_intermediate_size")
    if not width:
        raise CheckpointError(f"{source} lacks the expert width 'moe_intermediate_size'")
    first_dense = int(raw.get("first_k_dense_replace") or 0)
    return MoeConfig(num_experts=experts, top_k=top_k, intermediate_size=int(width),
                     norm_topk_prob=bool(raw.get("norm_topk_prob", False)),
                     shared_expert_intermediate_size=int(width) * int(raw.get("n_shared_experts") or 0),
                     sparse_layers=tuple(range(first_dense, num_layers)), routing_weights_float32=True,
                     routing="sigmoid_grouped" if v3 else "softmax_grouped", n_group=n_group, topk_group=topk_group,
                     routed_scaling_factor=float(raw.get("routed_scaling_factor") or 1.0), score_correction_bias=v3,
                     shared_expert_gated=False)


def _parse_mla(raw: dict[str, Any], architecture: str, source: str) -> MlaConfig | None:
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
    params = _rope_params(raw)
    if params.get("rope_type", params.get("type", "default")) != "default" and params.get("mscale_all_dim"):
        scale *= _yarn_mscale(float(params["factor"]), float(params["mscale_all_dim"])) ** 2
    v3 = architecture == "DeepseekV3ForCausalLM"
    return MlaConfig(q_lora_rank=int(q_lora) if q_lora else None, softmax_scale=scale,
                     interleaved_rope=bool(raw.get("rope_interleave", True)) if v3 else True, rope_float32=not v3,
                     **widths)


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
        attention = _yarn_mscale(factor, m) / _yarn_mscale(factor, m_all) if m and m_all else _yarn_mscale(factor)
    return RopeScaling("yarn", factor, original_max_position_embeddings=int(original),
                       attention_factor=float(attention), beta_fast=float(params.get("beta_fast") or 32),
                       beta_slow=float(params.get("beta_slow") or 1), truncate=bool(params.get("truncate", True)))


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
