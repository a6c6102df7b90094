"""A tensor-parallel rank's part of an expert whose checkpoint stores all of a layer's experts in
one tensor (GPT-OSS; the model class's ``split_checkpoint_tensor`` has already cut it into whole
experts, gate and up as ``[gate | up]`` rows). For expert ``e`` of width ``I`` and the rank's
expert rows ``[s, t)`` (``TensorParallelShard.rows_of``: a slice of the width, or all of it under
expert parallelism)::

    <e>.gate_up_proj.weight   [2I, hidden]        -> <e>.gate_proj.weight [I, hidden] and
                                                     <e>.up_proj.weight, sliced as any expert's
    <e>.down_proj.weight      [hidden, I]         -> as stored (sliced as any expert's)
    <e>.gate_up_bias          [2I]                -> [gate[s:t] | up[s:t]]
    <e>.gate_up_proj.{blocks,scales} [2I, ...]    -> [gate rows s:t | up rows s:t]   (MXFP4)
    <e>.down_proj.{blocks,scales} [hidden, I/32, ...] -> groups [s/32, t/32)         (MXFP4)
    <e>.down_bias             [hidden]            -> rank 0's whole, the others' zero when the
                                                     width is split: the all-reduce adds it once

An expert another rank holds (expert parallelism) gives nothing.
"""

from __future__ import annotations

import torch

from kvserve.distributed.shard import TensorParallelShard, check_mxfp4_split
from kvserve.model.quant_tensor import MXFP4_GROUP


def rank_pieces(name: str, tensor: torch.Tensor, shard: TensorParallelShard) -> list[tuple[str, torch.Tensor]]:
    """The rank's tensors (checkpoint names, as ``kvserve.distributed.loader`` maps them) of one
    whole-expert piece ``name`` (``<layer>.mlp.experts.<e>.<kind>``, the whole model's expert
    index) holding ``tensor``; any other piece as it is (the loader slices it as it slices a
    stored tensor).

    Raises:
        ConfigError: an MXFP4 down projection whose rank columns are not whole 32-input groups
            (``check_mxfp4_split``).
    """
    if ".mlp.experts." not in name:
        return [(name, tensor)]
    expert, kind = _expert_and_kind(name)
    held = shard.held_experts
    if held is not None and not held[0] <= int(expert.rpartition(".")[2]) < held[1]:
        return []
    start, end = shard.rows_of("gate_proj", expert)
    if kind == "gate_up_proj.weight":
        half = tensor.shape[0] // 2
        return [(f"{expert}.gate_proj.weight", tensor[:half]), (f"{expert}.up_proj.weight", tensor[half:])]
    if kind in ("gate_up_bias", "gate_up_proj.blocks", "gate_up_proj.scales"):
        half = tensor.shape[0] // 2
        return [(name, torch.cat([tensor[start:end], tensor[half + start : half + end]]))]
    if kind in ("down_proj.blocks", "down_proj.scales"):
        check_mxfp4_split(shard.arch, shard.size, held is not None)
        return [(name, tensor[:, start // MXFP4_GROUP : end // MXFP4_GROUP])]
    if kind == "down_bias" and held is None and shard.rank != 0:
        return [(name, torch.zeros_like(tensor))]
    return [(name, tensor)]


def _expert_and_kind(name: str) -> tuple[str, str]:
    """``<layer>.mlp.experts.<e>.gate_up_proj.weight`` -> (``<layer>.mlp.experts.<e>``,
    ``gate_up_proj.weight``)."""
    head, _, rest = name.partition(".mlp.experts.")
    index, _, kind = rest.partition(".")
    return f"{head}.mlp.experts.{index}", kind
