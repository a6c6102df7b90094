"""What a model needs in memory, said before its weights are read: total and per-token parameters
(a mixture of experts runs only its top-k experts per token) and the bytes of its weights in the
serving dtype and quantization, from the model's own shapes (``kvserve.bench.roofline.model_cost``,
built on the ``meta`` device). A checkpoint that cannot fit is refused in one line with the
numbers."""

from __future__ import annotations

from dataclasses import dataclass

from kvserve.errors import ConfigError
from kvserve.model.arch_config import ModelArchConfig

GIB = 2**30


@dataclass(frozen=True)
class MemoryPlan:
    """Attributes:
        total_params: every parameter (embedding, linears, experts, norms, biases; a tied LM
            head once), as transformers counts them.
        active_params: the parameters one token runs through (its top-k experts only).
        weight_bytes: the weights in the serving format.
        kv_bytes_per_token: one token's KV cache over all layers (K and V of every KV head, or
            latent attention's compressed row), in the serving dtype.
    """

    total_params: int
    active_params: int
    weight_bytes: int
    kv_bytes_per_token: int = 0

    def describe(self) -> str:
        """e.g. ``30.5B parameters (3.4B active per token), 56.9 GiB of weights, 96.0 KiB of KV
        cache per token``."""
        kv = f", {self.kv_bytes_per_token / 2**10:.1f} KiB of KV cache per token" if self.kv_bytes_per_token else ""
        return self.describe_weights() + kv

    def describe_weights(self) -> str:
        """e.g. ``30.5B parameters (3.4B active per token), 56.9 GiB of weights``."""
        active = "" if self.active_params == self.total_params else f" ({_count(self.active_params)} active per token)"
        return f"{_count(self.total_params)} parameters{active}, {_size(self.weight_bytes)} of weights"


def _count(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def _size(n: float) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / 2**20:.1f} MiB"


def memory_plan(arch: ModelArchConfig, dtype: str, quantization) -> MemoryPlan:
    """The plan of ``arch`` served in ``dtype`` (``float32``/``bfloat16``/``float16``) with
    ``quantization`` (a ``kvserve.config.QuantizationConfig``)."""
    from kvserve.bench.roofline import DTYPE_BYTES, ServingFormat, model_cost  # noqa: PLC0415 - torch-backed

    cost = model_cost(arch, ServingFormat(dtype, quantization))
    embedding = arch.vocab_size * arch.hidden_size
    idle = cost.moe_layers * (cost.num_experts - cost.top_k) * cost.expert_params
    return MemoryPlan(total_params=cost.all_params, active_params=cost.all_params - idle,
                      weight_bytes=int(cost.step_weight_bytes(0)) + cost.moe_layers * cost.num_experts * cost.expert_bytes
                      + embedding * DTYPE_BYTES[dtype],
                      kv_bytes_per_token=cost.kv_token_bytes * arch.num_hidden_layers)


def check_fits(plan: MemoryPlan, available_bytes: int, model: str) -> None:
    """Raises ConfigError (one line, the numbers) when the weights alone exceed ``available_bytes``."""
    if plan.weight_bytes > available_bytes:
        raise ConfigError(f"{model}: {plan.describe_weights()} do not fit in the {_size(available_bytes)} of memory "
                          "available here; use --quantization int8 or int4 (about 1/2 or 1/4 of bfloat16's bytes), "
                          "a smaller model, or a machine with more memory")
