"""GPTQ and AWQ checkpoints in kvserve's int4 path: each quantized linear's packed int32 tensors
are unpacked, checked and repacked at load into a ``QuantizedTensor`` (plus, for GPTQ act-order,
an input permutation) behind a ``QuantizedLinear`` (``kvserve.model.quant_linear``).

The formats, for a linear of K inputs, N outputs and G groups (GPTQ: Frantar et al. 2022,
"GPTQ: Accurate Post-Training Quantization for Generative Pre-trained Transformers", layout of
AutoGPTQ/GPTQModel; AWQ: Lin et al. 2023, "AWQ: Activation-aware Weight Quantization", AutoAWQ's
GEMM layout; read as vLLM's ``gptq.py`` / ``awq.py`` read them)::

    GPTQ  qweight int32 [K/8, N]  input 8r + i of output n: bits 4i..4i+3 of qweight[r, n]
          qzeros  int32 [G, N/8]  output 8c + i of group g:  bits 4i..4i+3 of qzeros[g, c]
          scales  fp16  [G, N]
          g_idx   int32 [K]       each input's group (k // group_size unless act-order)
          w[n, k] = scales[g, n] * (q[k, n] - zero[g, n]),  g = g_idx[k]
          zero = the stored value + 1 (checkpoint_format "gptq", v1) or the stored value (gptq_v2)
    AWQ   qweight int32 [K, N/8]  output 8c + ORDER[i] of input k: bits 4i..4i+3 of qweight[k, c]
          qzeros  int32 [G, N/8]  the same order, ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
          scales  fp16  [G, N]
          w[n, k] = scales[g, n] * (q[k, n] - zero[g, n]),  g = k // group_size

8-bit GPTQ packs four values per int32 (value i at bits 8i..8i+7) the same way; it is read when
symmetric (every zero point 128) as kvserve's int8 with group-wise float32 scales, ``s * (q - 128)``.

Repacked (exactly the format's weights, ``QuantizedLinear.dequantized_weight``):

- inputs sorted stably by ``g_idx`` when it is not ``k // group_size`` (act order), so each group
  is contiguous; the same permutation is applied to the activations (``input_perm``). Each group
  must hold ``group_size`` inputs.
- a layer whose zero points are all 8 is symmetric int4 (``s * (q - 8)``); any other has float32
  offsets ``s * zero`` (exact: a float16/bfloat16 scale times an integer up to 16).
- scales keep the checkpoint's dtype (float16 or bfloat16); the kernel reads them as float32.
- a fused projection (q/k/v, gate/up) concatenates its shards' outputs; act-order shards must
  share one ``g_idx`` (they do when quantized from the same inputs, as GPTQ does).

Which linears are quantized is read from the tensors (``<module>.qweight``): modules a quantizer
left in float (AWQ's ``modules_to_not_convert``, GPTQModel's ``dynamic`` exclusions) load as float.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from kvserve.config import CheckpointQuantization
from kvserve.errors import CheckpointError
from kvserve.heap import HeapTrimmer, trim
from kvserve.model.layers import MergedLinear
from kvserve.model.quant_linear import QuantizedLinear
from kvserve.model.quant_tensor import QuantizedTensor, from_mxfp4

PACKED_TENSORS = ("qweight", "qzeros", "scales", "g_idx", "blocks")  # blocks, scales: MXFP4
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
_SCALE_DTYPES = (torch.float16, torch.bfloat16)


def unpack_int32(packed: torch.Tensor, dim: int, bits: int = 4) -> torch.Tensor:
    """int32 [R, C] holding p = 32 / bits values per word (value i at bits ``bits*i`` up, low
    bits first) -> int32 [pR, C] (``dim`` 0: word r's values are rows pr..pr+p-1) or [R, pC]
    (``dim`` 1)."""
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    words, mask = packed.to(torch.int32), (1 << bits) - 1
    if dim == 0:
        return ((words[:, None, :] >> shifts[None, :, None]) & mask).reshape(-1, words.shape[1])
    return ((words[:, :, None] >> shifts) & mask).reshape(words.shape[0], -1)


def _awq_columns(values: torch.Tensor) -> torch.Tensor:
    """[R, 8C] in AWQ's interleaved order -> natural column order."""
    inverse = torch.tensor(AWQ_ORDER).argsort()
    index = (torch.arange(values.shape[1]) // 8 * 8) + inverse.repeat(values.shape[1] // 8)
    return values[:, index]


def _checked(tensors: dict[str, torch.Tensor], name: str, kind: str, shape: tuple[int, ...]) -> torch.Tensor:
    tensor = tensors.get(kind)
    if tensor is None:
        raise CheckpointError(f"checkpoint is missing tensor {name}.{kind}")
    if tuple(tensor.shape) != shape:
        raise CheckpointError(f"tensor {name}.{kind} has shape {tuple(tensor.shape)}, expected {shape}")
    if kind in ("qweight", "qzeros", "g_idx") and tensor.dtype != torch.int32:
        raise CheckpointError(f"tensor {name}.{kind} is {tensor.dtype}, expected torch.int32")
    if kind == "scales" and tensor.dtype not in _SCALE_DTYPES:
        raise CheckpointError(f"tensor {name}.scales is {tensor.dtype}, expected float16 or bfloat16")
    return tensor


def _num_groups(spec: CheckpointQuantization, in_features: int, name: str) -> int:
    if spec.group_size == -1:
        return 1
    if in_features % spec.group_size:
        raise CheckpointError(f"{name}: group_size {spec.group_size} does not divide its {in_features} inputs")
    return in_features // spec.group_size


def read_linear(tensors: dict[str, torch.Tensor], spec: CheckpointQuantization, name: str, in_features: int,
                out_features: int) -> tuple[QuantizedTensor, torch.Tensor | None]:
    """One checkpoint linear (``tensors``: its ``qweight``, ``qzeros``, ``scales`` and, GPTQ,
    ``g_idx``) as (QuantizedTensor [out, in] with contiguous groups, input permutation or None).

    Raises:
        CheckpointError: a missing tensor or one of the wrong shape/dtype (named), a group size
            that does not divide the inputs, a ``g_idx`` whose groups are not ``group_size`` each.
    """
    k, n, bits = in_features, out_features, spec.bits
    per = 32 // bits
    groups = _num_groups(spec, k, name)
    if n % per:
        raise CheckpointError(f"{name}: {n} outputs are not a multiple of {per} (packed zero points)")
    scales = _checked(tensors, name, "scales", (groups, n))
    if spec.method == "gptq":
        if k % per:
            raise CheckpointError(f"{name}: {k} inputs are not a multiple of {per} (packed weights)")
        q = unpack_int32(_checked(tensors, name, "qweight", (k // per, n)), 0, bits)
        zeros = unpack_int32(_checked(tensors, name, "qzeros", (groups, n // per)), 1, bits)
        zeros = zeros + (1 if spec.checkpoint_format == "gptq" else 0)
        g_idx = tensors.get("g_idx")
        g_idx = torch.arange(k) // (k // groups) if g_idx is None else _checked(tensors, name, "g_idx", (k,))
    else:
        q = _awq_columns(unpack_int32(_checked(tensors, name, "qweight", (k, n // 8)), 1))
        zeros = _awq_columns(unpack_int32(_checked(tensors, name, "qzeros", (groups, n // 8)), 1))
        g_idx = torch.arange(k) // (k // groups)
    return _repack(q.T, zeros, scales, g_idx.to(torch.int64), k // groups, bits, name)


def _repack(q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor, group_size: int,
            bits: int, name: str) -> tuple[QuantizedTensor, torch.Tensor | None]:
    """q int [N, K] (0..2^bits - 1), zeros int [G, N], scales [G, N], g_idx int64 [K] -> module
    docstring."""
    n, k = q.shape
    groups = scales.shape[0]
    perm = None
    if not torch.equal(g_idx, torch.arange(k) // group_size):
        if g_idx.min() < 0 or g_idx.max() >= groups or \
                not torch.equal(torch.bincount(g_idx, minlength=groups), torch.full((groups,), group_size)):
            raise CheckpointError(f"tensor {name}.g_idx: each of the {groups} groups must hold {group_size} inputs")
        perm = torch.argsort(g_idx, stable=True)
        q = q[:, perm]
    if bits == 8:
        if not bool((zeros == 128).all()):
            raise CheckpointError(f"tensor {name}.qzeros: 8-bit zero points other than 128 (sym false) are not "
                                  "supported; kvserve loads symmetric 8-bit GPTQ")
        weight = QuantizedTensor((q - 128).to(torch.int8).contiguous(), scales.T.to(torch.float32).contiguous(),
                                 None, 8, group_size)
        return weight, perm
    offsets = None
    if not bool((zeros == 8).all()):
        offsets = (scales.to(torch.float32) * zeros.to(torch.float32)).T.contiguous()
    weight = QuantizedTensor(q.to(torch.uint8).contiguous(), scales.T.contiguous(), offsets, 4, group_size)
    return weight, perm


def concat_outputs(parts: list[tuple[QuantizedTensor, torch.Tensor | None]],
                   names: list[str]) -> tuple[QuantizedTensor, torch.Tensor | None]:
    """Fused shards (stacked along the outputs) as one. A symmetric shard beside one with offsets
    gets the offsets ``8 * s`` (exact).

    Raises:
        CheckpointError: the shards' input orders (``g_idx``) or scale dtypes differ.
    """
    if len(parts) == 1:
        return parts[0]
    (first, perm), first_name = parts[0], names[0]
    for (weight, other), name in zip(parts[1:], names[1:], strict=True):
        if (perm is None) != (other is None) or (perm is not None and not torch.equal(perm, other)):
            raise CheckpointError(f"tensors {first_name}.g_idx and {name}.g_idx differ; kvserve fuses these "
                                  "projections into one linear with one input order")
        if weight.scales.dtype != first.scales.dtype:
            raise CheckpointError(f"tensors {first_name}.scales and {name}.scales differ in dtype")
    weights = [weight for weight, _ in parts]
    offsets = None
    if any(not w.symmetric for w in weights):
        offsets = torch.cat([w.offsets if w.offsets is not None else 8 * w.scales.to(torch.float32)
                             for w in weights])
    return QuantizedTensor(torch.cat([w.q for w in weights]), torch.cat([w.scales for w in weights]), offsets,
                           first.bits, first.group_size), perm


def plan_quantized_linears(model: nn.Module, checkpoint_names: Iterable[str], spec: CheckpointQuantization,
                           renamed: dict[str, str] | None = None) -> dict[str, list[str]]:
    """Our linear module name -> the checkpoint modules (shards) that fill it, for every linear the
    checkpoint stores quantized (``<shard>.qweight``); ``renamed`` maps a linear's module name to
    its checkpoint name where they differ (a tensor-parallel row-parallel layer's inner
    ``<name>.linear``).

    Raises:
        CheckpointError: no quantized linear at all; a fused projection with some shards quantized
            and others not; an LM head quantized or not against ``quantization_config.lm_head``.
    """
    quantized = {name.removesuffix(".qweight") for name in checkpoint_names if name.endswith(".qweight")}
    plan: dict[str, list[str]] = {}
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        parent = name.rpartition(".")[0]
        shards = ([f"{parent}.{s}" if parent else s for s in module.shard_names]
                  if isinstance(module, MergedLinear) else [(renamed or {}).get(name, name)])
        present = [shard in quantized for shard in shards]
        if all(present):
            plan[name] = shards
        elif any(present):
            missing = shards[present.index(False)]
            raise CheckpointError(f"{missing} is stored in float but {shards[present.index(True)]} is quantized; "
                                  "kvserve fuses them into one linear")
    if not plan:
        raise CheckpointError(f"quantization_config says {spec.method} but the checkpoint has no quantized "
                              "linear (no <module>.qweight tensor)")
    head = "lm_head" in plan
    if head != spec.lm_head:
        state = "quantized" if head else "in float"
        raise CheckpointError(f"quantization_config.lm_head = {str(spec.lm_head).lower()} but the checkpoint "
                              f"stores the LM head {state}")
    return plan


def plan_mxfp4_linears(model: nn.Module, checkpoint_names: Iterable[str]) -> dict[str, list[str]]:
    """The MXFP4 plan (``plan_quantized_linears``' form): every expert linear
    ``<experts>.{e}.<proj>`` whose layer's checkpoint stores ``<experts>.<proj>_blocks`` (all of
    a layer's experts in one tensor, GPT-OSS's layout; ``split_checkpoint_tensor`` hands each expert
    its ``<proj>.blocks`` and ``<proj>.scales``).

    Raises:
        CheckpointError: no MXFP4 tensor at all.
    """
    stored = {name.removesuffix("_blocks") for name in checkpoint_names if name.endswith("_blocks")}
    plan = {}
    for name, module in model.named_modules():
        expert, _, proj = name.rpartition(".")  # <experts>.{e}, <proj>
        experts, _, index = expert.rpartition(".")
        if isinstance(module, nn.Linear) and index.isdigit() and f"{experts}.{proj}" in stored:
            plan[name] = [name]
    if not plan:
        raise CheckpointError("quantization_config says mxfp4 but the checkpoint has no MXFP4 tensor "
                              "(no <experts>.<proj>_blocks)")
    return plan


def drop_float_weights(model: nn.Module, plan: dict[str, list[str]]) -> None:
    """Remove the float ``weight`` of each planned linear (call on the meta device, before the
    parameters get storage): only their biases are loaded as float."""
    for name in plan:
        model.get_submodule(name).weight = None


def install_quantized_linears(model: nn.Module, plan: dict[str, list[str]],
                              packed: dict[str, dict[str, torch.Tensor]], spec: CheckpointQuantization,
                              kernels, device: torch.device | str) -> None:
    """Replace each planned linear by a ``QuantizedLinear`` read from ``packed`` (checkpoint
    module name -> its ``PACKED_TENSORS``), keeping its loaded bias; ``packed`` is emptied, the
    heap trimmed as it goes (``kvserve.heap``: the checkpoint's tensors, freed as their linears are
    packed, would otherwise stay resident beside them)."""
    trimmer = HeapTrimmer()
    for name, shards in plan.items():
        trimmer.freed(sum(t.numel() * t.element_size() for shard in shards for t in packed.get(shard, {}).values()))
        module = model.get_submodule(name)
        if spec.method == "mxfp4":
            tensors = packed.pop(shards[0])
            try:
                weight = from_mxfp4(tensors["blocks"], tensors["scales"])
            except KeyError as exc:
                raise CheckpointError(f"checkpoint is missing the MXFP4 {exc.args[0]} of {name}") from None
            except ValueError as exc:
                raise CheckpointError(f"{name}: {exc}") from None
            if weight.shape != (module.out_features, module.in_features):
                raise CheckpointError(f"{name}: MXFP4 weight of shape {weight.shape}, expected "
                                      f"{(module.out_features, module.in_features)}")
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, QuantizedLinear(weight.to(device), module.bias, kernels))
            continue
        sizes = module.output_sizes if isinstance(module, MergedLinear) else [module.out_features]
        parts = [read_linear(packed.pop(shard), spec, shard, module.in_features, size)
                 for shard, size in zip(shards, sizes, strict=True)]
        weight, perm = concat_outputs(parts, shards)
        parent, _, child = name.rpartition(".")
        layer = QuantizedLinear(weight.to(device), module.bias, kernels, input_perm=perm)
        setattr(model.get_submodule(parent) if parent else model, child, layer)
    trim()
