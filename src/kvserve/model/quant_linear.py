"""``QuantizedLinear``: ``y = x W^T + b`` over a weight-only int8/int4 ``QuantizedTensor``, and
``quantize_linears``, which swaps a loaded model's linears for them (``--quantization``).

On the CPU the integers are packed once into the panels of kvserve's quantized GEMM
(``kernels/csrc/quant_linear.cpp``), which widens them in registers and applies each group's
scale (and offset) once; every output element is one fixed sequence of float32 operations
whatever the number of rows, the row's place in the batch, the thread count and the instruction
set (the file's header has the sequence), so quantized models are batch-invariant like float
ones. On CPUs with AMX tiles, bfloat16 activations go to ``amx_quant_linear.cpp`` instead
(``pack_quantized_amx``: integers widened to bfloat16 tiles per 32-input chunk; a lone row runs the
tiles' own arithmetic on vector FMAs, so every M gives the same bits), which at 64 rows is several
times faster than vector FMAs; a layer packed for it makes the vector panels on the first float32
input. On CUDA with Triton the weight is packed for ``kernels/triton_quant_linear.py`` (the
integers read in the GEMM, as on the CPU); elsewhere (no compiler, no Triton) the weight is
dequantized per call and ``F.linear`` runs.

Packed layout (kW floats per vector, kNV vectors per panel, kNR = kW * kNV output columns per
panel, from ``quant_linear_layout`` of the kernels' library: its variant's instruction set, so a
layer runs on the library that packed it)::

    packed      uint8 [P, K, kNR]       int8: column j of the panel at byte j
                uint8 [P, K, kNR / 2]   int4: byte g*kW + i = column 2g*kW + i (low nibble)
                                              | column (2g+1)*kW + i (high nibble)
    scales      float32 [P, K / group_size, kNR]
    neg_offsets float32 [P, K / group_size, kNR]  (-offsets; int4 with zero points only)

A GPTQ act-order checkpoint (``kvserve.model.prequantized``) groups inputs by ``g_idx``, not by
position: its weight is stored with the inputs sorted by group (``input_perm``), and each input
row is permuted the same way before the GEMM (``x[..., input_perm] @ W[:, input_perm]^T`` is
``x @ W^T``); the permutation is a copy, so rows stay batch-invariant.
"""

from __future__ import annotations

from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from kvserve import huge_pages
from kvserve.heap import HeapTrimmer, trim
from kvserve.kernels import kernels_for, triton_quant_linear
from kvserve.kernels.triton_quant_linear import TritonQuantLinear, triton_quant_for
from kvserve.model.layers import RouterLinear
from kvserve.model.quant_tensor import QuantizedTensor, quantize_int4, quantize_int8

KERNEL_DTYPES = (torch.float32, torch.bfloat16)
TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
AMX_BLOCK = {8: 16, 4: 64}  # output columns per block of the AMX layout, by bits
AMX_CHUNK = 32  # inputs per chunk (a tile's depth)
METHODS = ("int8", "int4")
# int4 without zero points, by measurement (docs/benchmarks.md section 5.4, "Quantized weights"): on the
# built-in model's held-out perplexity the two forms differ by at most 0.02% at each group size
# (zero points ahead by 0.02% at group 32, symmetric by 0.01% at 128), while zero points read 20%
# more bytes per step at group 32 (a float32 offset per group) and one more FMA per group.
INT4_SYMMETRIC = True


def pack_quantized(weight: QuantizedTensor, width: int, vectors: int) -> tuple[torch.Tensor, torch.Tensor,
                                                                               torch.Tensor | None]:
    """(packed, scales, neg_offsets) in the kernel's panel layout (module docstring) for vectors
    of ``width`` floats and ``vectors`` vectors per panel."""
    n, k = weight.shape
    cols = width * vectors
    panels = -(-n // cols)
    pad = panels * cols - n

    def panel_major(t: torch.Tensor) -> torch.Tensor:  # [N, X] -> [P, X, cols]
        t = F.pad(t, (0, 0, 0, pad)) if pad else t
        return t.reshape(panels, cols, t.shape[1]).transpose(1, 2).contiguous()

    q = panel_major(weight.q.view(torch.uint8))
    if weight.bits == 4:
        pairs = q.reshape(panels, k, vectors // 2, 2, width)
        q = (pairs[:, :, :, 0] | (pairs[:, :, :, 1] << 4)).reshape(panels, k, cols // 2).contiguous()
    scales = panel_major(weight.scales.to(torch.float32))
    neg_offsets = None if weight.offsets is None else panel_major(-weight.offsets.to(torch.float32))
    return q, scales, neg_offsets


def amx_eligible(weight: QuantizedTensor) -> bool:
    """The AMX kernel takes groups of whole 32-input chunks (or one group per output channel)."""
    return weight.group_size == weight.shape[1] or weight.group_size % AMX_CHUNK == 0


def pack_quantized_amx(weight: QuantizedTensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(packed, scales, neg_offsets) in the AMX kernel's layout (``amx_quant_linear.cpp``):
    blocks of B output columns (``AMX_BLOCK``: 16 for int8, 64 for int4), N and K padded with zeros
    to B and 32; packed uint8 [ceil(N/B), K', B] for int8 (row k: input k of the block's columns)
    and [ceil(N/B), K'/2, B] for int4 (row r: input 2r in the low nibbles, 2r + 1 in the high
    ones); scales and negated offsets float32 [ceil(N/B), K / group_size, B]."""
    n, k = weight.shape
    block = AMX_BLOCK[weight.bits]
    blocks, chunks = -(-n // block), -(-k // AMX_CHUNK)
    q = F.pad(weight.q.view(torch.uint8), (0, chunks * AMX_CHUNK - k, 0, blocks * block - n))
    rows = q.view(blocks, block, chunks * AMX_CHUNK).transpose(1, 2)  # [blocks, K', B]
    if weight.bits == 4:
        rows = rows[:, 0::2] | (rows[:, 1::2] << 4)
    packed = rows.contiguous()

    def block_major(t: torch.Tensor) -> torch.Tensor:  # [N, G] -> [blocks, G, B] float32
        t = F.pad(t.to(torch.float32), (0, 0, 0, blocks * block - n))
        return t.view(blocks, block, t.shape[1]).transpose(1, 2).contiguous()

    neg_offsets = None if weight.offsets is None else block_major(-weight.offsets.to(torch.float32))
    return packed, block_major(weight.scales), neg_offsets


def unpack_quantized_amx(packed: torch.Tensor, bits: int, n: int, k: int) -> torch.Tensor:
    """The integers [N, K] (int8 as uint8 bytes; int4 one value per byte) of ``pack_quantized_amx``'s
    ``packed``."""
    rows = packed
    if bits == 4:
        rows = torch.stack((packed & 15, packed >> 4), dim=2).flatten(1, 2)
    blocks, width, block = rows.shape
    return rows.transpose(1, 2).reshape(blocks * block, width)[:n, :k].contiguous()


class QuantizedLinear(nn.Module):
    """A linear layer over a ``QuantizedTensor`` (module docstring).

    Input [..., in_features] float32 or bfloat16 (other dtypes and devices: the dequantized
    path) -> [..., out_features] in the input's dtype. The bias is kept as float32. Holds no
    ``nn.Parameter``. ``triton_weight``: the weight packed for Triton
    (``triton_quant_linear.PackedWeight``; also what ``kvserve.kernels.triton_moe`` reads), or None.

    Args:
        weight: the quantized [out_features, in_features] weight.
        bias: [out_features] or None.
        kernels: the compiled module from ``kvserve.kernels.kernels_for(device)`` (or, in the tests of
            every instruction set, ``kernels_for_variant(name)``), or None off the CPU.
        triton: the Triton kernels for a weight off the CPU (default: ``triton_quant_for`` of its
            device: CUDA where Triton imports; the tests pass them for CPU tensors under Triton's
            interpreter); without either, the weight is dequantized per call.
        input_perm: int64 [in_features] or None: ``weight`` holds the inputs in this order
            (column j of ``weight`` is input ``input_perm[j]``; GPTQ act-order, module docstring).
        amx: run bfloat16 activations on AMX tiles (``amx_quant_linear.cpp``): None (default)
            where the CPU has them and the group size allows (``amx_eligible``), False never
            (the vector kernel's panels; tests of that path), True insists (an error where it
            cannot). An AMX layer gives float32 activations the vector kernel, over panels made
            from its own on first use.
    """

    def __init__(self, weight: QuantizedTensor, bias: torch.Tensor | None, kernels: ModuleType | None,
                 input_perm: torch.Tensor | None = None, amx: bool | None = None,
                 triton: TritonQuantLinear | None = None):
        super().__init__()
        self.input_perm = None if input_perm is None else input_perm.to(weight.q.device, torch.int64)
        self._param_dtypes = (weight.scales.dtype, None if weight.offsets is None else weight.offsets.dtype)
        self.out_features, self.in_features = weight.shape
        self.bits, self.group_size, self.symmetric = weight.bits, weight.group_size, weight.symmetric
        self.codebook = weight.codebook
        self.weight_bytes = weight.nbytes()
        self._kernels = kernels if kernels is not None and weight.q.device.type == "cpu" else None
        self._triton = None if self._kernels is not None else triton or triton_quant_for(weight.q.device)
        self.triton_weight = None if self._triton is None else triton_quant_linear.pack(weight)
        self.bias = None if bias is None else bias.detach().to(torch.float32).contiguous()
        self.weight = weight  # kept on the fallback path only (below)
        available = self._kernels is not None and self._kernels.amx_linear_available() and amx_eligible(weight)
        if amx and not available:
            raise ValueError("the AMX kernel needs a CPU (and OS) with AMX-BF16 and a group size of K or a "
                             f"multiple of {AMX_CHUNK} (this layer: {weight.group_size} of {self.in_features})")
        self.amx = available if amx is None else amx
        self._vector: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None = None
        if self._kernels is not None:
            pack = pack_quantized_amx(weight) if self.amx else pack_quantized(weight, *self._kernels.quant_linear_layout())
            self.packed, self.scales, self.neg_offsets = huge_pages.place(pack[0]), pack[1], pack[2]
        if self._kernels is not None or self._triton is not None:
            self.weight = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.input_perm is not None:
            x = x.index_select(-1, self.input_perm)
        if self._triton is not None and x.dtype in TRITON_DTYPES and x.device == self.triton_weight.codes.device:
            shape = x.shape
            rows = x.reshape(-1, self.in_features)
            out = self._triton.linear(rows if rows.stride(-1) == 1 else rows.contiguous(), self.triton_weight, self.bias)
            return out.reshape(*shape[:-1], self.out_features)
        if self._kernels is None or x.dtype not in KERNEL_DTYPES or x.device.type != "cpu":
            bias = None if self.bias is None else self.bias.to(x.dtype)
            return F.linear(x, self.stored_weight().dequantize().to(x.dtype), bias)  # x in the stored order
        shape = x.shape
        rows = x.reshape(-1, self.in_features).contiguous()
        amx, packed, scales, neg_offsets = self.kernel_weights(rows.dtype)
        if amx:
            out = self._kernels.amx_quant_linear(rows, packed, scales, neg_offsets, self.bias, self.out_features,
                                                 self.group_size, self.bits, self.codebook_id)
        else:
            out = self._kernels.quant_linear(rows, packed, scales, neg_offsets, self.bias, self.out_features,
                                             self.group_size, self.bits, self.codebook_id)
        return out.reshape(*shape[:-1], self.out_features)

    @property
    def codebook_id(self) -> int:
        """The kernels' number for ``codebook`` (``kvserve.kernels.ops_linear.CODEBOOKS``)."""
        return 1 if self.codebook == "e2m1" else 0

    @property
    def on_kernels(self) -> bool:
        """Whether the forward runs kvserve's kernels (CPU float32/bfloat16 activations), not the
        dequantize-per-call path."""
        return self._kernels is not None

    def kernel_weights(self, dtype: torch.dtype) -> tuple[bool, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(AMX tiles?, packed, scales, neg_offsets) the forward of ``dtype`` activations passes to
        its kernel (``amx_quant_linear`` or ``quant_linear``); also what
        ``kvserve.model.fused_decoder`` calls. Only with ``on_kernels``."""
        if self.amx and dtype == torch.bfloat16:
            return True, self.packed, self.scales, self.neg_offsets
        return (False, *self._vector_panels())

    def _vector_panels(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The vector kernel's (packed, scales, neg_offsets): the layer's own, or for an AMX layer
        (whose tiles take only bfloat16 activations) made once when float32 activations arrive."""
        if not self.amx:
            return self.packed, self.scales, self.neg_offsets
        if self._vector is None:
            packed, scales, neg_offsets = pack_quantized(self.stored_weight(), *self._kernels.quant_linear_layout())
            self._vector = huge_pages.place(packed), scales, neg_offsets
        return self._vector

    def stored_weight(self) -> QuantizedTensor:
        """The weight as given, from the packed form when packed: inputs in the stored order
        (``input_perm``'s)."""
        if self.weight is not None:
            return self.weight
        if self.triton_weight is not None:
            return triton_quant_linear.unpack(self.triton_weight, *self._param_dtypes)
        return unpack_quantized(self)

    def dequantized_weight(self) -> torch.Tensor:
        """float32 [out_features, in_features] (``QuantizedTensor.dequantize``), inputs in their
        original order (``input_perm`` undone)."""
        w = self.stored_weight().dequantize()
        return w if self.input_perm is None else w[:, torch.argsort(self.input_perm)]

    def format(self) -> str:
        """e.g. ``int8 (per channel)``, ``int4 (group 32, symmetric)``, ``int4 (group 128, zero
        points, act order)``."""
        order = ", act order" if self.input_perm is not None else ""
        if self.codebook == "e2m1":
            return f"mxfp4 (group {self.group_size})"
        if self.bits == 8:
            group = "per channel" if self.group_size == self.in_features else f"group {self.group_size}"
            return f"int8 ({group}{order})"
        return f"int4 (group {self.group_size}, {'symmetric' if self.symmetric else 'zero points'}{order})"

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"{self.format()}, amx={self.amx}")


def unpack_quantized(layer: QuantizedLinear) -> QuantizedTensor:
    """The ``QuantizedTensor`` a packed layer holds (inverse of ``pack_quantized``; int4 scales
    and offsets come back in the dtypes the layer was given: float16 from the quantizer, a
    checkpoint's own, float32 offsets)."""
    n, k = layer.out_features, layer.in_features
    panels, _, cols = layer.scales.shape

    def row_major(t: torch.Tensor) -> torch.Tensor:  # [P, X, cols] -> [N, X]
        return t.transpose(1, 2).reshape(panels * cols, t.shape[1])[:n].contiguous()

    if layer.amx:
        q = unpack_quantized_amx(layer.packed, layer.bits, n, k)
    else:
        q = layer.packed
        if layer.bits == 4:
            width = layer._kernels.quant_linear_layout()[0]
            q = q.reshape(panels, k, cols // width // 2, width)
            q = torch.stack((q & 15, q >> 4), dim=3).reshape(panels, k, cols)
        q = row_major(q)
    if layer.bits == 8:
        return QuantizedTensor(q.view(torch.int8), row_major(layer.scales), None, 8, layer.group_size)
    scale_dtype, offset_dtype = layer._param_dtypes
    offsets = None if layer.neg_offsets is None else (-row_major(layer.neg_offsets)).to(offset_dtype)
    return QuantizedTensor(q, row_major(layer.scales).to(scale_dtype), offsets, 4, layer.group_size, layer.codebook)


def quantize_weight(weight: torch.Tensor, method: str, group_size: int) -> QuantizedTensor:
    """A float [N, K] weight by ``method`` (``int8``: per channel; ``int4``: groups of
    ``group_size``, ``INT4_SYMMETRIC``).

    Raises:
        ValueError: unknown method; an int4 group size that is not 32/64/128 or does not divide K.
    """
    if method == "int8":
        return quantize_int8(weight)
    if method == "int4":
        return quantize_int4(weight, group_size, INT4_SYMMETRIC)
    raise ValueError(f"unknown quantization method {method!r}; kvserve quantizes to {', '.join(METHODS)}")


@torch.no_grad()
def quantize_linears(model: nn.Module, method: str, group_size: int = 32, lm_head: bool = False) -> int:
    """Replace every ``nn.Linear`` of a loaded ``model`` (QKV, O, gate-up, down; the LM head too
    with ``lm_head``, a tied one included: the embedding keeps its float weight for the lookup)
    by a ``QuantizedLinear`` quantized from its float weight, in place, one layer at a time.
    Returns how many were replaced.

    Raises:
        ValueError: as ``quantize_weight`` (an int4 group size that does not divide a layer's
            inputs names the layer).
    """
    head = getattr(model, "lm_head", None)
    # (parent, name) only: each float weight is freed as soon as its layer is quantized.
    targets = [(parent, name) for parent in model.modules() for name, child in parent.named_children()
               if isinstance(child, nn.Linear) and not isinstance(child, RouterLinear) and (lm_head or child is not head)]
    trimmer = HeapTrimmer()
    for parent, name in targets:
        child = getattr(parent, name)
        try:
            weight = quantize_weight(child.weight, method, group_size)
        except ValueError as exc:
            raise ValueError(f"{name} ({child.in_features} inputs): {exc}") from None
        setattr(parent, name, QuantizedLinear(weight, child.bias, kernels_for(child.weight.device)))
        trimmer.freed(child.weight.numel() * child.weight.element_size())
        del child
    trim()
    return len(targets)
