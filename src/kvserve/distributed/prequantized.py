"""A tensor-parallel rank's slices of a GPTQ / AWQ checkpoint's packed tensors (formats in
``kvserve.model.prequantized``): a rank reads only its part of ``qweight``, ``qzeros``, ``scales``
and ``g_idx`` (memory-mapped slices), and the usual reader repacks them into its
``QuantizedLinear``, which then holds exactly the rank's rows or columns of the format's weights.

For a linear of K inputs, N outputs, group size g (-1: one group of all K inputs), p values per
int32 (8 at 4 bits, 4 at 8 bits)::

    column-parallel (q/k/v, gate/up, LM head): the rank's outputs [s, e)
        GPTQ  qweight [:, s:e]      qzeros [:, s/p:e/p]   scales [:, s:e]   g_idx whole
        AWQ   qweight [:, s/8:e/8]  qzeros [:, s/8:e/8]   scales [:, s:e]
        s and e multiples of p (AWQ: 8): whole packed words
    row-parallel (o_proj, down_proj): the rank's inputs [s, e)
        GPTQ  qweight [s/p:e/p, :]  qzeros, scales: group rows [s/g:e/g) (g = -1: the one row)
              g_idx [s:e] - s/g     (must be k // g there: no act order)
        AWQ   qweight [s:e, :]      qzeros, scales: group rows as GPTQ
        s and e multiples of g: a group never straddles two ranks

Refused by name (``ConfigError``), as no rank could hold whole groups of its own: a row-parallel
layer whose rank boundaries are not multiples of the group size, GPTQ act order (``desc_act`` with
a ``g_idx`` that is not ``k // g``) on a row-parallel layer, a packed word split between ranks,
and a quantized LM head whose vocabulary does not split evenly.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from kvserve.config import CheckpointQuantization
from kvserve.errors import ConfigError
from kvserve.model.arch_config import ModelArchConfig


def check_prequantized_split(arch: ModelArchConfig, spec: CheckpointQuantization, size: int) -> None:
    """Before any rank starts: whether ``size`` ranks can each hold whole groups of the
    row-parallel layers (o_proj, down_proj) of a checkpoint quantized as ``spec``.

    Raises:
        ConfigError: one line naming the checkpoint's format, ``--tensor-parallel-size`` and
            the layer or ``desc_act``.
    """
    if size == 1 or spec.group_size == -1:
        return
    flag = f"a {spec.label} checkpoint with --tensor-parallel-size {size} is not supported"
    if spec.desc_act:
        raise ConfigError(f"{flag}: act order (quantization_config.desc_act) puts a rank's o_proj/down_proj "
                          "inputs in scattered groups, so no rank holds whole groups; serve it with "
                          "--tensor-parallel-size 1")
    for layer, inputs in (("o_proj", arch.num_attention_heads * arch.head_dim), ("down_proj", arch.intermediate_size)):
        if (inputs // size) % spec.group_size:
            raise ConfigError(f"{flag}: each rank takes {inputs // size} of {layer}'s {inputs} inputs, not a "
                              f"multiple of group_size {spec.group_size}, so a group would straddle two ranks")


class PackedSplit(NamedTuple):
    """How a rank slices one checkpoint linear: ``kind`` ``column`` (outputs ``[start, end)``),
    ``row`` (inputs ``[start, end)``) or ``whole``."""

    kind: str
    start: int = 0
    end: int = 0


def read_packed_slice(tensor_slice: Any, module: str, part: str, split: PackedSplit, spec: CheckpointQuantization,
                      tp: int) -> torch.Tensor:
    """The rank's slice of checkpoint tensor ``<module>.<part>`` (``part`` in qweight, qzeros,
    scales, g_idx; ``tensor_slice`` a safetensors ``get_slice`` handle).

    Raises:
        ConfigError: the split is impossible (see the module docstring), naming the layer, the
            group size and ``--tensor-parallel-size``.
    """
    if split.kind == "whole":
        return tensor_slice[:]
    start, end = split.start, split.end
    per = 32 // spec.bits
    flag = f"a {spec.label} checkpoint with --tensor-parallel-size {tp}"
    if split.kind == "column":
        word = 8 if spec.method == "awq" else per
        if start % word or end % word:
            raise ConfigError(f"{flag}: {module} splits its outputs at {start}..{end}, not at multiples of {word} "
                              "(packed int32 words)")
        if part == "g_idx":
            return tensor_slice[:]
        if part == "scales" or (part == "qweight" and spec.method == "gptq"):
            return tensor_slice[:, start:end]
        return tensor_slice[:, start // word : end // word]
    channel, group = spec.group_size == -1, spec.group_size
    if not channel and (start % group or end % group):
        raise ConfigError(f"{flag}: {module} splits its inputs at {start}..{end}, which is not a multiple of "
                          f"group_size {group}: each rank must hold whole groups (use a smaller "
                          "--tensor-parallel-size or a checkpoint with a smaller group size)")
    groups = slice(0, 1) if channel else slice(start // group, end // group)
    if part in ("qzeros", "scales"):
        return tensor_slice[groups]
    if part == "qweight":
        if spec.method == "awq":
            return tensor_slice[start:end]
        if start % per or end % per:
            raise ConfigError(f"{flag}: {module} splits its inputs at {start}..{end}, not at multiples of {per} "
                              "(packed int32 words)")
        return tensor_slice[start // per : end // per]
    g_idx = tensor_slice[start:end].to(torch.int64)
    expected = torch.zeros(end - start, dtype=torch.int64) if channel else torch.arange(start, end) // group
    if not torch.equal(g_idx, expected):
        raise ConfigError(f"{flag}: {module} is quantized in act order (desc_act: its g_idx is not input // "
                          f"group_size), so its inputs cannot be split between ranks at group boundaries; "
                          "serve it with --tensor-parallel-size 1 or a checkpoint without act order")
    return (g_idx - groups.start).to(torch.int32)
