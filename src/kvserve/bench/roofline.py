"""The roofline bound of a workload: the least time a machine needs for it, from the model's shapes,
the serving format and the measured peaks (``kvserve.bench.machine_probe``).

What a forward pass must move and compute comes from the model itself, built on the ``meta``
device (no weights read, no memory), so every architecture kvserve serves is counted by its own
layers (:func:`model_cost`):

    weight bytes   every linear (the LM head included) in the serving format, its bias, every
                   norm; the embedding table is a row lookup and is not counted.
                   float:  N * K * s  (s = 2 bfloat16 / float16, 4 float32)
                   int8:   N * K + 4 * N                  (per-channel float32 scales)
                   int4-gG: N * K / 2 + 4 * N * K / G     (float32 scales; + as much again
                                                           with zero points)
                   GPTQ/AWQ checkpoints (``kvserve.model.prequantized``): their bits and group
                   (-1: K), zero points unless the quantizer was symmetric (AWQ never is);
                   every linear but the LM head counted as quantized unless the checkpoint
                   says otherwise (modules a quantizer left in float are not known from
                   config.json); MXFP4 checkpoints (GPT-OSS): the routed experts only, as
                   int4-g32 (the kernel holds each block's power-of-two scale as a float32)
                   a quantized layer's bias stays float32 (4 * N); the LM head is quantized
                   only with ``+lm_head``.  (The CPU kernel's panels pad N to a multiple of
                   its panel width; the padding is not counted.)
    KV bytes       per token and layer: 2 * kv_heads * row, row = head_dim * s, or head_dim + 4
                   for a one-byte cache (``--kv-cache-dtype int8 | fp8*``: values + float32
                   scale); a layer with a sliding window reads at most ``window`` tokens.
    FLOPs          2 per weight of the linears other than the LM head per token; 2 per LM-head
                   weight per row that gets logits (the last prompt token, each decode token);
                   attention 4 * heads * head_dim per (query, key) pair per layer (q.K and P.V).
    experts        (mixtures of experts) a routed expert's weights count only when a step touches
                   it: a step of T tokens choosing top_k of E experts each reads, per MoE layer,
                   E * (1 - (1 - top_k / E)^T) experts in expectation (routing taken as uniform),
                   and a token's FLOPs count its top_k experts only; the router and any shared
                   expert count as dense weights.

The bound of a workload (:func:`workload_bound`), given each request's prompt and output length
and how many requests may run at once (the engine's ``max_num_seqs``, the client's concurrency):

    prefill_s = max(prefill FLOPs / matmul peak, weight bytes / bandwidth)
                (every prompt token at the matmul peak; at least one pass over the weights)
    decode    = the decode steps of an ideal continuous batch: the first ``cap`` requests run
                together, each finished one is replaced by the next waiting one at once; a
                request's first output token comes from its prefill, so it takes
                ``output_len - 1`` decode steps, the k-th reading ``prompt_len + k`` tokens of KV
    step_s    = max((weight bytes + the batch's KV bytes) / bandwidth, the batch's FLOPs / peak)
    bound_s   = prefill_s + sum of step_s

A measured run is then ``bound_s / elapsed_s`` of the roofline (1.0 = at the bound), the same
fraction for every throughput figure of the run (they share the tokens and the time).

What the model leaves out, on purpose: prefix-cache hits (their prompt tokens are counted as
computed), speculative decoding (several tokens per weight pass), arrivals (the bound assumes
every request is there when a slot frees: for a finite ``--request-rate`` the fraction says how
far the run is from what the machine could do, not what the load allowed). A run with any of
these can exceed 1.0.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kvserve.bench.machine_probe import MachinePeaks
from kvserve.config import CHECKPOINT_METHODS, INT4_GROUP_SIZES, QuantizationConfig
from kvserve.model.arch_config import ModelArchConfig

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
ONE_BYTE_KV = ("int8", "fp8", "fp8_e4m3", "fp8_e5m2")
SCALE_BYTES = 4  # float32 scale per quantization group / per one-byte KV row


def quantization_from_label(label: str | None, model_dir: str | None = None) -> QuantizationConfig:
    """``QuantizationConfig.label``'s inverse: None -> float weights; ``int8``, ``int8+lm_head``,
    ``int4-gG``, ``int4-gG+lm_head``; a GPTQ/AWQ checkpoint's label (``gptq-int4-g128``, ...)
    from the ``quantization_config`` of ``model_dir``'s config.json.

    Raises:
        ValueError: another label, or a checkpoint label without a matching checkpoint.
    """
    if label is None or label in ("", "none", "None"):
        return QuantizationConfig()
    method, _, head = label.partition("+")
    if method.startswith(CHECKPOINT_METHODS):
        return _checkpoint_quantization(label, model_dir)
    base, _, group = method.partition("-g")
    ok = head in ("", "lm_head") and (base == "int8" and not group or base == "int4" and group.isdigit()
                                      and int(group) in INT4_GROUP_SIZES)
    if not ok:
        raise ValueError(f"unknown quantization {label!r}; int8, int4-g32, int4-g64, int4-g128, each with an "
                         "optional +lm_head, or a GPTQ/AWQ checkpoint's")
    return QuantizationConfig(base, int(group) if group else QuantizationConfig.group_size, head == "lm_head")


def _checkpoint_quantization(label: str, model_dir: str | None) -> QuantizationConfig:
    from kvserve.checkpoint_quantization import read_checkpoint_quantization  # noqa: PLC0415

    checkpoint = None if model_dir is None else read_checkpoint_quantization(model_dir)
    config = None if checkpoint is None else QuantizationConfig(checkpoint.method, checkpoint.group_size,
                                                                 checkpoint.lm_head, checkpoint)
    if config is None or config.label != label:
        raise ValueError(f"quantization {label!r}: {model_dir}/config.json does not describe that checkpoint")
    return config


@dataclass(frozen=True)
class ServingFormat:
    """How the engine holds the model: activation/float-weight ``dtype`` (bfloat16, float16,
    float32), weight ``quantization`` and ``kv_cache_dtype`` (auto = ``dtype``)."""

    dtype: str
    quantization: QuantizationConfig = field(default_factory=QuantizationConfig)
    kv_cache_dtype: str = "auto"

    def __post_init__(self):
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPE_BYTES)}, got {self.dtype!r}")
        if self.kv_cache_dtype not in ("auto", *ONE_BYTE_KV):
            raise ValueError(f"kv_cache_dtype must be auto or one of {', '.join(ONE_BYTE_KV)}, "
                             f"got {self.kv_cache_dtype!r}")

    @property
    def label(self) -> str:
        """e.g. ``bfloat16``, ``bfloat16 int4-g32+lm_head kv int8``."""
        parts = [self.dtype, self.quantization.label or ""]
        parts += [] if self.kv_cache_dtype == "auto" else [f"kv {self.kv_cache_dtype}"]
        return " ".join(p for p in parts if p)


def quantized_linear_bytes(out_features: int, in_features: int, quantization: QuantizationConfig) -> int:
    """Bytes of an [out, in] weight as the CPU kernel reads it (module docstring; no bias)."""
    from kvserve.model.quant_linear import INT4_SYMMETRIC  # noqa: PLC0415 - torch + kernels, only when needed

    n, k = out_features, in_features
    checkpoint = quantization.checkpoint
    if checkpoint is not None:  # GPTQ/AWQ (kvserve.model.prequantized): a symmetric quantizer's zeros are all 8
        bits, symmetric = checkpoint.bits, checkpoint.sym or checkpoint.bits == 8
        group = k if checkpoint.group_size == -1 else checkpoint.group_size
    elif quantization.method == "int8":
        bits, group, symmetric = 8, k, True
    else:
        bits, group, symmetric = 4, quantization.group_size, INT4_SYMMETRIC
    return n * k * bits // 8 + SCALE_BYTES * n * (k // group) * (1 if symmetric else 2)


@dataclass(frozen=True)
class ModelCost:
    """What one forward pass moves and computes (module docstring).

    Attributes:
        weight_bytes: bytes of weights one step reads.
        body_params: weights of the linears other than the LM head (2 FLOPs per token each).
        lm_head_params: weights of the LM head (2 FLOPs per row that gets logits each).
        kv_token_bytes: bytes of one token's K and V in one layer (latent attention: its latent row).
        attention_flops: FLOPs of one (query, key) pair in one layer (q.K and P.V).
        layer_windows: each layer's sliding window (None = full attention).
        moe_layers, num_experts, top_k: the mixture of experts (0 for a dense model).
        expert_bytes, expert_params: one routed expert of one layer (not in the two above).
        all_params: every parameter of the model (embedding, norms and biases included; a tied
            LM head once).
    """

    weight_bytes: int
    body_params: int
    lm_head_params: int
    kv_token_bytes: int
    attention_flops: int
    layer_windows: tuple[int | None, ...]
    moe_layers: int = 0
    num_experts: int = 0
    top_k: int = 0
    expert_bytes: int = 0
    expert_params: int = 0
    all_params: int = 0

    def experts_touched(self, tokens: int) -> float:
        """Routed experts one MoE layer reads for ``tokens`` tokens (expected, uniform routing)."""
        if self.moe_layers == 0 or tokens <= 0:
            return 0.0
        return self.num_experts * (1.0 - (1.0 - self.top_k / self.num_experts) ** tokens)

    def step_weight_bytes(self, tokens: int) -> float:
        """Weight bytes a step of ``tokens`` tokens reads: the dense ones and the touched experts."""
        return self.weight_bytes + self.moe_layers * self.expert_bytes * self.experts_touched(tokens)

    @property
    def token_params(self) -> int:
        """Weights of the linears other than the LM head that one token runs through (2 FLOPs each)."""
        return self.body_params + self.moe_layers * self.top_k * self.expert_params

    @property
    def total_params(self) -> int:
        """Every linear's weights (the LM head and all experts included)."""
        return self.body_params + self.lm_head_params + self.moe_layers * self.num_experts * self.expert_params

    def attended(self, context: np.ndarray) -> np.ndarray:
        """Keys read over all layers by a query with ``context`` tokens in the cache (int64)."""
        context = np.asarray(context, dtype=np.int64)
        total = np.zeros_like(context)
        for window, layers in Counter(self.layer_windows).items():
            total += layers * (context if window is None else np.minimum(context, window))
        return total

    def prefill_keys(self, prompt_len: int) -> int:
        """(query, key) pairs of a causal prefill of ``prompt_len`` tokens, over all layers:
        position p (1-based) attends min(p, window) keys."""
        total = 0
        for window in self.layer_windows:
            w = prompt_len if window is None else min(window, prompt_len)
            total += w * (w + 1) // 2 + (prompt_len - w) * w
        return total

    def prefill_flops(self, prompt_len: int) -> int:
        """Linears over every prompt token, attention, the LM head over the last token."""
        if prompt_len <= 0:
            return 0
        return (2 * self.token_params * prompt_len + self.attention_flops * self.prefill_keys(prompt_len)
                + 2 * self.lm_head_params)


def model_cost(arch: ModelArchConfig, fmt: ServingFormat) -> ModelCost:
    """The counts of the module docstring for ``arch`` served in ``fmt``, from the model class
    kvserve builds for it (on the ``meta`` device).

    Raises:
        CheckpointError: an architecture kvserve does not serve.
    """
    import torch  # noqa: PLC0415 - the model classes need torch; the arithmetic above does not
    from torch import nn  # noqa: PLC0415

    from kvserve.attention import get_attention_backend  # noqa: PLC0415
    from kvserve.model.layers import RMSNorm, UpcastRMSNorm  # noqa: PLC0415
    from kvserve.model.registry import get_model_class  # noqa: PLC0415

    from kvserve.model.deepseek import LatentUpProjection  # noqa: PLC0415
    from kvserve.model.layers import RouterLinear  # noqa: PLC0415
    from kvserve.model.moe import SparseMoeBlock  # noqa: PLC0415

    with torch.device("meta"):
        model = get_model_class(arch.architecture)(arch, get_attention_backend("torch"))
    size, quant = DTYPE_BYTES[fmt.dtype], fmt.quantization
    head = getattr(model, "lm_head", None)  # an encoder (pooling only) has none

    blocks = [m for m in model.modules() if isinstance(m, SparseMoeBlock)]
    routed = {id(lin) for b in blocks for e in b.experts for lin in e.modules() if isinstance(lin, nn.Linear)}

    def linear_cost(module: nn.Linear) -> tuple[int, int]:  # (bytes, params)
        n, k = module.out_features, module.in_features
        quantized = (quant.method is not None and not isinstance(module, RouterLinear)
                     and (module is not head or quant.lm_head)
                     and (quant.method != "mxfp4" or id(module) in routed))  # MXFP4 checkpoints: the experts
        nbytes = quantized_linear_bytes(n, k, quant) if quantized else n * k * size
        return nbytes + (n * (SCALE_BYTES if quantized else size) if module.bias is not None else 0), n * k

    expert = [linear_cost(lin) for lin in blocks[0].experts[0].modules() if isinstance(lin, nn.Linear)] if blocks else []
    weight_bytes = body = 0
    for module in model.modules():
        if isinstance(module, nn.Linear) and id(module) not in routed:
            nbytes, params = linear_cost(module)
            weight_bytes += nbytes
            body += 0 if module is head else params
        elif isinstance(module, (RMSNorm, UpcastRMSNorm)):  # Gemma's too
            weight_bytes += module.weight.numel() * size
        elif isinstance(module, nn.LayerNorm):  # encoders'
            weight_bytes += sum(p.numel() for p in module.parameters()) * size
        elif isinstance(module, LatentUpProjection):  # MLA's kv_b_proj: in the dtype, never quantized
            weight_bytes += module.weight.numel() * size
            body += module.weight.numel()
    row = arch.head_dim + SCALE_BYTES if fmt.kv_cache_dtype in ONE_BYTE_KV else arch.head_dim * size
    cached_heads = 0 if getattr(model, "attn_type", "decoder") == "encoder_only" else arch.num_key_value_heads
    kv_token_bytes, attention_flops = 2 * cached_heads * row, 4 * arch.num_attention_heads * arch.head_dim
    if arch.mla is not None:  # one latent row per token; each head's q.row and p.latent (absorbed)
        kv_token_bytes = arch.mla.cache_width * size
        attention_flops = 2 * arch.num_attention_heads * (arch.mla.cache_width + arch.mla.kv_lora_rank)
    return ModelCost(
        weight_bytes=weight_bytes, body_params=body,
        lm_head_params=0 if head is None else head.out_features * head.in_features,
        kv_token_bytes=kv_token_bytes, attention_flops=attention_flops,
        layer_windows=tuple(arch.layer_sliding_windows),
        moe_layers=len(blocks), num_experts=arch.moe.num_experts if blocks else 0,
        top_k=arch.moe.top_k if blocks else 0, expert_bytes=sum(b for b, _ in expert),
        expert_params=sum(p for _, p in expert), all_params=sum(p.numel() for p in model.parameters()),
    )


@dataclass(frozen=True)
class StepBound:
    """Lower bound of one decode step, seconds, and its parts."""

    batch: int
    weights_s: float
    kv_s: float
    compute_s: float

    @property
    def bound_s(self) -> float:
        return max(self.weights_s + self.kv_s, self.compute_s)

    @property
    def limit(self) -> str:
        """``bandwidth`` or ``compute``: the term that sets the bound."""
        return "bandwidth" if self.weights_s + self.kv_s >= self.compute_s else "compute"


def decode_step_bound(cost: ModelCost, peaks: MachinePeaks, dtype: str, contexts: Sequence[int]) -> StepBound:
    """One decode step of ``len(contexts)`` requests, request i with ``contexts[i]`` tokens in
    the cache (its new token included)."""
    keys = int(cost.attended(np.asarray(contexts, dtype=np.int64)).sum())
    batch = len(contexts)
    flops = 2 * (cost.token_params + cost.lm_head_params) * batch + cost.attention_flops * keys
    bandwidth = peaks.bandwidth
    return StepBound(batch, cost.step_weight_bytes(batch) / bandwidth, cost.kv_token_bytes * keys / bandwidth,
                     flops / peaks.peak_flops(dtype))


@dataclass(frozen=True)
class WorkloadBound:
    """The least time of a workload (module docstring), seconds, and what went into it.

    Attributes:
        prefill_s, decode_s: the two parts; ``bound_s`` their sum.
        decode_steps: steps of the ideal continuous batch; ``bandwidth_steps`` of them were
            bandwidth-bound, the others compute-bound.
        max_batch: the largest decode batch (at most ``cap``).
        prefill_flops: FLOPs of every prefill.
        num_requests, input_tokens, output_tokens: the workload.
    """

    prefill_s: float
    decode_s: float
    decode_steps: int
    bandwidth_steps: int
    max_batch: int
    prefill_flops: int
    num_requests: int
    input_tokens: int
    output_tokens: int

    @property
    def bound_s(self) -> float:
        return self.prefill_s + self.decode_s

    @property
    def output_throughput(self) -> float:
        """Output tokens/s at the bound."""
        return self.output_tokens / self.bound_s if self.bound_s > 0 else float("inf")


def _decode_steps(requests: Sequence[tuple[int, int]], cap: int):
    """The ideal continuous batch: yields each step's contexts (int64 array)."""
    waiting = [(p, o - 1) for p, o in requests if o > 1][::-1]  # (prompt_len, decode steps left), popped in order
    prompt = np.zeros(0, dtype=np.int64)
    done = np.zeros(0, dtype=np.int64)  # decode steps done
    left = np.zeros(0, dtype=np.int64)
    while waiting or len(left):
        free = cap - len(left)
        if free > 0 and waiting:
            admitted = [waiting.pop() for _ in range(min(free, len(waiting)))]
            prompt = np.concatenate([prompt, [p for p, _ in admitted]])
            done = np.concatenate([done, np.zeros(len(admitted), dtype=np.int64)])
            left = np.concatenate([left, [n for _, n in admitted]])
        done += 1
        left -= 1
        yield prompt + done
        running = left > 0
        prompt, done, left = prompt[running], done[running], left[running]


def workload_bound(cost: ModelCost, peaks: MachinePeaks, dtype: str, requests: Sequence[tuple[int, int]],
                   cap: int) -> WorkloadBound:
    """The bound of ``requests`` (``(prompt_len, output_len)`` each, served in this order) with at
    most ``cap`` running at once, in ``dtype``'s matmul peak.

    Raises:
        ValueError: ``cap`` < 1.
    """
    if cap < 1:
        raise ValueError(f"at least one request must be able to run, got cap {cap}")
    peak, bandwidth = peaks.peak_flops(dtype), peaks.bandwidth
    prefill_flops = sum(cost.prefill_flops(p) for p, _ in requests)
    prefill_tokens = sum(p for p, _ in requests)
    prefill_s = max(prefill_flops / peak, cost.step_weight_bytes(prefill_tokens) / bandwidth) if requests else 0.0
    decode_s, steps, bandwidth_steps, max_batch = 0.0, 0, 0, 0
    for contexts in _decode_steps(requests, cap):
        step = decode_step_bound(cost, peaks, dtype, contexts)
        decode_s += step.bound_s
        steps += 1
        bandwidth_steps += step.limit == "bandwidth"
        max_batch = max(max_batch, step.batch)
    return WorkloadBound(prefill_s, decode_s, steps, bandwidth_steps, max_batch, prefill_flops, len(requests),
                         sum(p for p, _ in requests), sum(o for _, o in requests))
