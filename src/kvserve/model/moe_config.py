"""A mixture of experts as ``config.json`` describes it (``MoeConfig``): experts, top-k, the
router's normalisation, which layers are sparse, shared experts, and DeepSeek's grouped routing;
a switch kvserve does not implement is refused naming the field."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvserve.errors import CheckpointError


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


# Routers kvserve runs: softmax over the experts, then the top k (``scoring_func`` where a config
# names it). A config field that changes routing and is not read here is refused by name.
_MOE_FIELDS_REFUSED = ("n_group", "topk_group", "routed_scaling_factor", "n_shared_experts", "topk_method")


def parse_moe(raw: dict[str, Any], architecture: str, num_layers: int, source: str) -> MoeConfig | None:
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


