"""Building blocks shared by the decoder models: RMSNorm, rotary embedding, SiLU-and-multiply and
the fused (merged) linear projections.

Numerics follow transformers' Llama implementation operation for operation (norm computed in
float32 and cast back before the weight multiply; cos/sin computed in float32 and cast to the
activation dtype), so that bfloat16 runs round the same way as the reference. On the CPU,
RMSNorm (with the residual add before it), SiLU-and-multiply and the bfloat16 rotary embedding run
as one C++ pass each (``kvserve/kernels/csrc/elementwise.cpp``: the rotary embedding and the
residual sums give torch's bits; RMSNorm's sum of squares and SiLU's exp may differ in the last
float32 place) instead of several torch operators, whose per-call cost dominated these small
tensors in a decode step. On a CUDA device the same three run in Triton
(``kvserve/kernels/triton_elementwise.py``, same rules).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from kvserve.kernels import CpuKernels
from kvserve.kernels.triton_elementwise import TritonElementwise
from kvserve.model.arch_config import RopeScaling
from kvserve.model.kernel_layer import KernelLayer


class RMSNorm(KernelLayer):
    """Root-mean-square layer norm (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization").

    ``y = weight * (x / sqrt(mean(x^2, -1) + eps))``, statistics in float32.
    Input/output: [..., hidden_size], any float dtype (output has the input's dtype).
    """

    triton_kernels = True

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ops = self._fused_ops(x)
        if ops is not None:
            return ops.rms_norm(x.reshape(-1, x.shape[-1]), self.weight, None, self.eps)[0].view(x.shape)
        input_dtype = x.dtype
        x32 = x.to(torch.float32)
        variance = x32.pow(2).mean(-1, keepdim=True)
        x32 = x32 * torch.rsqrt(variance + self.eps)
        return self.weight * x32.to(input_dtype)

    def add_and_norm(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual), both [T, hidden_size] in x's dtype; one pass on the CPU."""
        ops = self._fused_ops(x)
        if ops is not None and x.dim() == 2 and residual.shape == x.shape and residual.dtype == x.dtype:
            normed, total = ops.rms_norm(x, self.weight, residual.contiguous(), self.eps)
            return normed, total
        total = residual + x
        return self.forward(total), total

    def _fused_ops(self, x: torch.Tensor) -> CpuKernels | TritonElementwise | None:
        """The kernels (``elementwise.cpp``, or Triton's on a GPU) when this layer has them and they
        take x, else None."""
        if (self.ops is None or x.dtype not in (torch.float32, torch.bfloat16) or x.dtype != self.weight.dtype
                or x.stride(-1) != 1 or x.requires_grad or self.weight.requires_grad and torch.is_grad_enabled()):
            return None
        return self.ops


class UpcastRMSNorm(nn.Module):
    """RMSNorm with the weight applied in float32 before the cast:
    ``y = ((x / sqrt(mean(x^2) + eps)) * (offset + weight)).to(x.dtype)``, all in float32
    (GPT-OSS: offset 0; Gemma's ``(1 + w)``: ``GemmaRMSNorm``). Llama's ``RMSNorm`` casts first,
    then multiplies in the dtype."""

    offset = 0.0

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size) if self.offset == 0.0 else torch.zeros(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        weight = self.weight.float() if self.offset == 0.0 else self.offset + self.weight.float()
        return (x32 * weight).to(x.dtype)

    def add_and_norm(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual), the sum in x's dtype."""
        total = residual + x
        return self.forward(total), total


class GemmaRMSNorm(UpcastRMSNorm):
    """Gemma's RMSNorm: ``(1 + weight)`` in float32 (transformers' ``Gemma3RMSNorm``)."""

    offset = 1.0


class SiluAndMul(KernelLayer):
    """SwiGLU activation (Shazeer 2020, "GLU Variants Improve Transformer").

    Input [..., 2 * d] = [gate | up]; output [..., d] = silu(gate) * up.
    """

    triton_kernels = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.ops is not None and x.dim() == 2 and x.dtype in (torch.float32, torch.bfloat16):
            return self.ops.silu_and_mul(x.contiguous())
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up


class GeluTanhAndMul(nn.Module):
    """GeGLU activation (Shazeer 2020) with the tanh approximation of GELU, transformers'
    ``gelu_pytorch_tanh`` (Gemma): input [..., 2 * d] = [gate | up]; output [..., d] =
    gelu_tanh(gate) * up, the two operations in the input dtype as transformers runs them."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.gelu(gate, approximate="tanh") * up


ACTIVATIONS: dict[str, type[nn.Module]] = {"silu": SiluAndMul, "gelu_pytorch_tanh": GeluTanhAndMul}


class RouterLinear(nn.Linear):
    """A gate's linear: a mixture of experts' router (hidden -> experts) and Qwen2-MoE's
    shared-expert gate (``kvserve.model.moe``). Runs on the batch-invariant kernels like any
    linear but is never quantized (vLLM leaves them in the model dtype too): a quantized router
    would choose other experts."""


class MergedLinear(nn.Linear):
    """One ``nn.Linear`` holding several checkpoint projections stacked along the output rows.

    ``shard_names[i]`` is the checkpoint module (e.g. ``q_proj``) whose weight fills rows
    ``sum(output_sizes[:i]) .. sum(output_sizes[:i+1])``; the loader uses these to copy
    Hugging Face's separate q/k/v (or gate/up) tensors into the fused weight.
    """

    def __init__(self, in_features: int, output_sizes: list[int], shard_names: list[str], bias: bool):
        super().__init__(in_features, sum(output_sizes), bias=bias)
        assert len(output_sizes) == len(shard_names)
        self.output_sizes = list(output_sizes)
        self.shard_names = list(shard_names)


def compute_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    """Inverse rotary frequencies, float32 [head_dim // 2], on the CPU.

    Default: ``1 / theta^(2i / head_dim)`` (Su et al. 2021, RoFormer). ``linear`` divides by
    ``factor``. ``llama3`` keeps high frequencies, divides low ones by ``factor`` and interpolates
    in between, exactly as transformers' ``_compute_llama3_parameters``.
    """
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").to(torch.float32) / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    if scaling.rope_type == "longrope":  # the short factors; RotaryEmbedding adds the long ones
        return 1.0 / (torch.tensor(scaling.short_factor, dtype=torch.float32, device="cpu") * theta**exponents)
    if scaling.rope_type == "yarn":
        return _yarn_inv_freq(head_dim, theta, scaling)
    factor = scaling.factor
    old_len = scaling.original_max_position_embeddings
    low_freq_wavelen = old_len / scaling.low_freq_factor
    high_freq_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_inv_freq(dim: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    """YaRN's frequencies (transformers' ``_compute_yarn_parameters``, operation for operation):
    the dimensions whose wavelength fits ``beta_fast`` rotations in the original context keep
    their frequency, those under ``beta_slow`` rotations are divided by the factor, a linear ramp
    in between."""

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(scaling.original_max_position_embeddings / (rotations * 2 * math.pi))) / (
            2 * math.log(theta))

    low, high = correction_dim(scaling.beta_fast), correction_dim(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    pos_freqs = theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").to(torch.float32) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (scaling.factor * pos_freqs)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low), 0, 1)
    extrapolation_factor = 1 - ramp
    return interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor


class RotaryEmbedding(nn.Module):
    """Rotary position embedding in the "rotate half" layout of Llama/Hugging Face checkpoints.

    ``cos_sin(positions)`` returns (cos, sin), each [T, rotary_dim] in the requested dtype,
    computed once per forward and shared by all layers; ``apply`` rotates the first rotary_dim
    dimensions of a [T, heads, head_dim] tensor (all of them unless a partial rotary factor says
    otherwise, Phi-4-mini) and passes the rest. The frequencies are a plain CPU tensor (not a
    buffer) so that building the model on the ``meta`` device leaves them intact.

    LongRoPE (Phi-3/Phi-4): a position below ``original_max_position_embeddings`` takes the short
    factors, from there the long ones, and cos and sin are multiplied by the attention factor, as
    vLLM does it per position (transformers switches a whole sequence to the long factors once it
    grows past the original length; the two agree on shorter sequences). YaRN: cos and sin times
    its attention factor too.
    """

    def __init__(self, head_dim: int, theta: float, scaling: RopeScaling | None, rotary_dim: int | None = None):
        super().__init__()
        self.head_dim = head_dim
        self.rotary_dim = rotary_dim or head_dim
        self._inv_freq_cpu = compute_inv_freq(self.rotary_dim, theta, scaling)
        self._inv_freq_by_device: dict[torch.device, torch.Tensor] = {}
        self._long: tuple[int, torch.Tensor] | None = None  # (first position, its inverse frequencies)
        self._attention_scaling = 1.0
        if scaling is not None and scaling.rope_type == "longrope":
            exponents = (torch.arange(0, self.rotary_dim, 2, dtype=torch.int64, device="cpu").to(torch.float32)
                         / self.rotary_dim)  # on the CPU even while the model is built on meta
            long = 1.0 / (torch.tensor(scaling.long_factor, dtype=torch.float32, device="cpu") * theta**exponents)
            self._long = (scaling.original_max_position_embeddings, long)
        if scaling is not None and scaling.rope_type in ("longrope", "yarn"):
            self._attention_scaling = scaling.attention_factor

    def _inv_freq(self, device: torch.device) -> torch.Tensor:
        cached = self._inv_freq_by_device.get(device)
        if cached is None:
            cached = self._inv_freq_cpu.to(device)
            self._inv_freq_by_device[device] = cached
        return cached

    def divide_frequencies(self, factors: torch.Tensor) -> None:
        """Divide the inverse frequencies by per-frequency factors (float32 [head_dim // 2]):
        llama.cpp's ``rope_freqs`` tensor ("freq_factors"), which Llama 3.1 GGUF files carry in
        place of ``rope_scaling``."""
        self._inv_freq_cpu = self._inv_freq_cpu / factors.to("cpu", torch.float32)
        self._inv_freq_by_device.clear()

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.to(torch.float32)[:, None] * self._inv_freq(positions.device)[None, :]
        if self._long is not None:
            first, long = self._long
            long_freqs = positions.to(torch.float32)[:, None] * long.to(positions.device)[None, :]
            freqs = torch.where((positions >= first)[:, None], long_freqs, freqs)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if self._attention_scaling != 1.0:
            cos, sin = cos * self._attention_scaling, sin * self._attention_scaling
        return cos.to(dtype), sin.to(dtype)

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              ops: CpuKernels | TritonElementwise | None = None) -> torch.Tensor:
        """x: [T, heads, head_dim]; cos, sin: [T, rotary_dim] (same dtype as x): the first
        rotary_dim dimensions rotated, the others as they are; on ``ops`` (the calling layer's
        kernels) where they take x (``ops.rotary_takes``), else in torch."""
        rotary_dim = cos.shape[-1]
        if rotary_dim != x.shape[-1]:
            rotated = RotaryEmbedding.apply(x[..., :rotary_dim], cos, sin, ops)
            return torch.cat((rotated, x[..., rotary_dim:]), dim=-1)
        if ops is not None and ops.rotary_takes(x, cos):
            return ops.rotary_embedding(x, cos.contiguous(), sin.contiguous())
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos[:, None, :] + rotated * sin[:, None, :]
