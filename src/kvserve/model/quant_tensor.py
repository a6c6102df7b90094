"""Weight-only quantized matrices: the canonical form, kvserve's quantizers (``--quantization
int8|int4``) and the exact dequantization the kernel and the tests are checked against.

A ``QuantizedTensor`` is a [N, K] weight (N outputs, K inputs) stored as integers ``q`` and, per
output row n and group g of ``group_size`` consecutive inputs, a scale and (int4 with zero points)
an offset::

    bits 8:                 w[n, k] = scales[n, g] * q[n, k]                 q int8 in [-127, 127]
    bits 4, symmetric:      w[n, k] = scales[n, g] * (q[n, k] - 8)           q uint8 in [0, 15]
    bits 4, zero points:    w[n, k] = scales[n, g] * q[n, k] - offsets[n, g] q uint8 in [0, 15]
                            (offsets = scale * zero point)                     g = k // group_size
    bits 4, codebook e2m1:  w[n, k] = scales[n, g] * E2M1_DOUBLED[q[n, k]]   q uint8 in [0, 15]

The e2m1 codebook is MXFP4 (OCP Microscaling, 2023; GPT-OSS's experts): a 4-bit E2M1 float per
weight (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives; codes 8-15 are 0-7 negated) and an E8M0
scale ``2^(e - 127)`` per 32 inputs. kvserve keeps the values doubled to integers (0 .. 12) and
the scale halved, ``2^(e - 128)`` in float32: the same products, and the kernels multiply by small
integers as for int4 (``from_mxfp4``, ``to_mxfp4``).

The offsets of kvserve's own quantizer are float16 (``scale * zero`` rounded); a GPTQ/AWQ
checkpoint's (``kvserve.model.prequantized``) are float32, where ``scale * zero`` of a float16 or
bfloat16 scale and a zero point up to 16 is exact, so ``scales * q - offsets`` is exactly the
format's ``scale * (q - zero)``. A symmetric 8-bit GPTQ checkpoint is int8 with group-wise
float32 scales and ``q - 128`` in [-128, 127].

kvserve's GEMM (``kernels/csrc/quant_linear.cpp``) reads the integers and the per-group values
directly; ``dequantize`` is the reference for tests and the portable (no C++ kernels, CUDA) path.

The quantizers, from float weights:

- int8: per output channel, symmetric (``group_size = K``): ``s = max|w| / 127``,
  ``q = round(w / s)`` (half to even); scales float32.
- int4: group-wise (32, 64 or 128 inputs). Symmetric, llama.cpp Q4_0's rule (the element of
  largest magnitude maps to -8: ``s = w_peak / -8``, ``q = clamp(round(w / s) + 8, 0, 15)``), or
  with a zero point (``s = (max - min) / 15``, ``z = round(-min / s)``). Scales and offsets are
  float16, and the integers are computed from the float16-rounded values, so the stored tensors
  define the weight. Both try a few clippings of the range per group and keep the one of least
  squared error (the search of llama.cpp's and AWQ's quantizers, without activations). Which of
  the two kvserve uses is decided by measured quality (``kvserve.model.quant_linear``,
  docs/benchmarks.md section 5.4, "Quantized weights").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvserve.config import INT4_GROUP_SIZES

# Clipping ratios tried per group by the int4 quantizers (1.0 = the full range).
_CLIP_RATIOS = (1.0, 0.95, 0.9, 0.85, 0.8)
_ROWS_PER_PASS = 8192


@dataclass(frozen=True)
class QuantizedTensor:
    """A [N, K] weight as integers + per-group scales (see the module docstring).

    Attributes:
        q: int8 [N, K] (bits 8) or uint8 [N, K] holding 0..15 (bits 4).
        scales: [N, K // group_size], float32 (int8) or float16 (int4; bfloat16 from a checkpoint; float32 from a
            GGUF Q4_K, ``kvserve.model.gguf_tensors``).
        offsets: [N, K // group_size] of the scales' dtype or float32 (exact products, see the
            module docstring), or None (int8; symmetric int4).
        bits: 8 or 4.
        group_size: inputs per group; divides K (K = one group per output channel).
    """

    q: torch.Tensor
    scales: torch.Tensor
    offsets: torch.Tensor | None
    bits: int
    group_size: int
    codebook: str = "int"  # or "e2m1" (bits 4, no offsets): what a code stands for

    def __post_init__(self):
        n, k = self.q.shape
        if self.bits not in (8, 4):
            raise ValueError(f"bits must be 8 or 4, not {self.bits}")
        if k % self.group_size:
            raise ValueError(f"group_size {self.group_size} does not divide {k} inputs")
        expected = (n, k // self.group_size)
        if tuple(self.scales.shape) != expected:
            raise ValueError(f"scales have shape {tuple(self.scales.shape)}, expected {expected}")
        if self.offsets is not None and (self.bits != 4 or self.offsets.shape != self.scales.shape
                                         or self.offsets.dtype not in (self.scales.dtype, torch.float32)):
            raise ValueError("offsets are int4 only and must match the scales' shape (dtype: theirs or float32)")
        e2m1_misused = self.codebook == "e2m1" and (self.bits != 4 or self.offsets is not None)
        if self.codebook not in ("int", "e2m1") or e2m1_misused:
            raise ValueError(f"codebook {self.codebook!r}: 'int', or 'e2m1' for 4-bit weights without offsets")

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    @property
    def symmetric(self) -> bool:
        return self.offsets is None

    def nbytes(self) -> int:
        """Bytes of the packed integers and the group parameters."""
        n, k = self.shape
        params = sum(t.numel() * t.element_size() for t in (self.scales, self.offsets) if t is not None)
        return n * k * self.bits // 8 + params

    def dequantize(self) -> torch.Tensor:
        """float32 [N, K] by the module docstring's formulas in float32: int8 ``s * q`` (one
        rounding), symmetric int4 ``s * (q - 8)`` (exact: float16 scale times a 4-bit integer),
        int4 with zero points ``s * q - m`` (the product exact, one rounding)."""
        n, k = self.shape
        groups = k // self.group_size
        q = self.q.to(torch.float32).view(n, groups, self.group_size)
        if self.codebook == "e2m1":
            q = E2M1_DOUBLED.to(q.device)[self.q.long()].view(n, groups, self.group_size)
        elif self.bits == 4 and self.offsets is None:
            q = q - 8
        w = q * self.scales.to(torch.float32)[:, :, None]
        if self.offsets is not None:
            w = w - self.offsets.to(torch.float32)[:, :, None]
        return w.reshape(n, k)

    def to(self, device: torch.device | str) -> QuantizedTensor:
        move = (lambda t: None if t is None else t.to(device))  # noqa: E731
        return QuantizedTensor(move(self.q), move(self.scales), move(self.offsets), self.bits, self.group_size,
                               self.codebook)


# MXFP4's E2M1 values by code, doubled (module docstring); -0.0 where the format has it.
E2M1_DOUBLED = torch.tensor([0.0, 1, 2, 3, 4, 6, 8, 12, -0.0, -1, -2, -3, -4, -6, -8, -12])
MXFP4_GROUP = 32


def from_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> QuantizedTensor:
    """An MXFP4 weight as checkpoints store it (GPT-OSS; transformers' ``convert_moe_packed_tensors``
    reads the same): ``blocks`` uint8 [N, K / 32, 16], byte j of a group holding element 2j in its
    low nibble and 2j + 1 in its high one; ``scales`` uint8 [N, K / 32], the E8M0 exponents
    (scale ``2^(e - 127)``) -> QuantizedTensor [N, K], codebook e2m1.

    Raises:
        ValueError: shapes or dtypes other than these.
    """
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8 or blocks.dim() != 3 or blocks.shape[2] != 16 \
            or tuple(scales.shape) != tuple(blocks.shape[:2]):
        raise ValueError(f"MXFP4 blocks uint8 [N, G, 16] and scales uint8 [N, G], got {blocks.dtype} "
                         f"{tuple(blocks.shape)} and {scales.dtype} {tuple(scales.shape)}")
    n, groups, _ = blocks.shape
    q = torch.stack((blocks & 15, blocks >> 4), dim=3).reshape(n, groups * MXFP4_GROUP)
    halved = torch.ldexp(torch.ones(scales.shape, dtype=torch.float32), scales.to(torch.int32) - 128)
    return QuantizedTensor(q.contiguous(), halved, None, 4, MXFP4_GROUP, "e2m1")


def to_mxfp4(weight: QuantizedTensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(blocks, scales) as ``from_mxfp4`` reads them, of an e2m1 weight whose scales are powers of
    two in the E8M0 range."""
    n, k = weight.shape
    q = weight.q.view(n, k // MXFP4_GROUP, MXFP4_GROUP // 2, 2)
    blocks = (q[..., 0] | (q[..., 1] << 4)).contiguous()
    exponents = torch.frexp(weight.scales.to(torch.float32))[1] - 1 + 128  # 2^(e - 128) = 0.5 * 2^(e - 127)
    return blocks, exponents.clamp(0, 255).to(torch.uint8)


@torch.no_grad()
def quantize_mxfp4(weight: torch.Tensor) -> QuantizedTensor:
    """MXFP4 of a float [N, K] weight (K a multiple of 32) by the OCP rule: per 32 inputs the scale
    ``2^(floor(log2(max|w|)) - 2)`` (E2M1's largest exponent is 2), each element rounded to the
    nearest E2M1 value (ties to the smaller magnitude), saturating at +-6. For writing test and benchmark
    checkpoints in the released GPT-OSS format."""
    n, k = weight.shape
    if k % MXFP4_GROUP:
        raise ValueError(f"MXFP4 groups of {MXFP4_GROUP} do not divide the {k} inputs")
    w = weight.detach().to(torch.float32).reshape(n, k // MXFP4_GROUP, MXFP4_GROUP)
    peak = w.abs().amax(dim=2)
    exponent = torch.where(peak > 0, torch.floor(torch.log2(peak.clamp_min(2.0**-126))) - 2, torch.zeros_like(peak))
    exponent = exponent.clamp(-127, 127)
    scaled = (w / torch.ldexp(torch.ones_like(peak), exponent.to(torch.int32))[:, :, None]).clamp(-6, 6)
    magnitudes = E2M1_DOUBLED[:8] / 2  # 0, 0.5, ..., 6
    distance = (scaled.abs()[..., None] - magnitudes).abs()
    code = distance.argmin(dim=-1)  # the first of equal distances: the smaller magnitude
    q = (code + 8 * (scaled < 0)).to(torch.uint8).reshape(n, k)
    halved = torch.ldexp(torch.ones_like(peak), exponent.to(torch.int32) - 1)
    return QuantizedTensor(q, halved, None, 4, MXFP4_GROUP, "e2m1")


@torch.no_grad()
def quantize_int8(weight: torch.Tensor) -> QuantizedTensor:
    """Per-output-channel symmetric int8: ``s = max|w| / 127`` (1 for an all-zero row),
    ``q = round(w / s)`` (half to even). weight: [N, K] float; scales float32 [N, 1]."""
    w = weight.detach().to(torch.float32)
    scale = w.abs().amax(dim=1, keepdim=True) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / scale).clamp_(-127, 127).to(torch.int8)
    return QuantizedTensor(q, scale, None, 8, w.shape[1])


@torch.no_grad()
def quantize_int4(weight: torch.Tensor, group_size: int = 128, symmetric: bool = True) -> QuantizedTensor:
    """Group-wise int4 (see the module docstring); scales (and offsets) float16, the integers
    computed from the float16-rounded values, so the stored tensors define the weight.

    Raises:
        ValueError: ``group_size`` is not one of 32, 64, 128 or does not divide K.
    """
    if group_size not in INT4_GROUP_SIZES:
        raise ValueError(f"int4 group size must be one of {INT4_GROUP_SIZES}, not {group_size}")
    n, k = weight.shape
    if k % group_size:
        raise ValueError(f"int4 group size {group_size} does not divide the {k} inputs")
    parts = [_quantize_int4_rows(rows, group_size, symmetric) for rows in weight.detach().split(_ROWS_PER_PASS)]
    q, scales = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    offsets = None if symmetric else torch.cat([p[2] for p in parts])
    return QuantizedTensor(q, scales, offsets, 4, group_size)


def _quantize_int4_rows(weight: torch.Tensor, group_size: int, symmetric: bool):
    """(q uint8, scales float16, offsets float16 or None) of some rows (the search's temporaries
    are a few times the rows' float32 size: an LM head goes through in slices)."""
    n, k = weight.shape
    w = weight.to(torch.float32).reshape(n, k // group_size, group_size)
    best = None
    for ratio in _CLIP_RATIOS:
        candidate = _int4_symmetric(w, ratio) if symmetric else _int4_asymmetric(w, ratio)
        error = (_dequantize_groups(*candidate) - w).double().square().sum(dim=2)  # float64: no near-ties
        if best is None:
            best, best_error = list(candidate), error
            continue
        better = error < best_error
        best_error = torch.where(better, error, best_error)
        for i, value in enumerate(candidate):
            if value is not None:
                mask = better[:, :, None] if value.dim() == 3 else better
                best[i] = torch.where(mask, value, best[i])
    q, scales, offsets = best
    return q.reshape(n, k).to(torch.uint8), scales.to(torch.float16), None if symmetric else offsets.to(torch.float16)


def _dequantize_groups(q: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor | None) -> torch.Tensor:
    s = scales.to(torch.float32)[:, :, None]
    m = 8 * s if offsets is None else offsets.to(torch.float32)[:, :, None]
    return q.to(torch.float32) * s - m


def _int4_symmetric(w: torch.Tensor, ratio: float):
    """Q4_0's rule on a clipped range: the largest-magnitude value (signed) maps to -8."""
    index = w.abs().argmax(dim=2, keepdim=True)
    peak = torch.gather(w, 2, index)[:, :, 0] * ratio
    scale = (peak / -8).to(torch.float16).to(torch.float32)
    scale = torch.where(scale != 0, scale, torch.ones_like(scale))
    q = torch.round(w / scale[:, :, None] + 8).clamp_(0, 15)
    return q, scale, None


def _int4_asymmetric(w: torch.Tensor, ratio: float):
    """Zero point per group: ``[min, max]`` (clipped towards its middle) onto 0..15."""
    low, high = w.amin(dim=2), w.amax(dim=2)
    middle = (low + high) / 2
    low, high = middle + (low - middle) * ratio, middle + (high - middle) * ratio
    scale = ((high - low) / 15).to(torch.float16).to(torch.float32)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    zero = torch.round(-low / scale).clamp_(0, 15)
    offsets = (scale * zero).to(torch.float16).to(torch.float32)
    q = torch.round((w + offsets[:, :, None]) / scale[:, :, None]).clamp_(0, 15)
    return q, scale, offsets
