"""The layers that talk to the other ranks: row-parallel linears (o_proj, down_proj), a mixture
of experts whose ranks each give a partial sum, and the vocabulary-parallel embedding.
Column-parallel layers (qkv_proj, gate_up_proj, the LM head) need no layer of their own: they
are the model's usual ``MergedLinear`` / ``nn.Linear`` built with the rank's smaller sizes
(``TensorParallelShard.local_arch``), loaded with the rank's rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kvserve.distributed.communicator import Communicator
from kvserve.distributed.shard import TensorParallelShard


class RowParallelLinear(nn.Module):
    """``y = all_reduce(x_r W_r^T) + b``: each rank multiplies its input columns (its heads' or
    MLP rows' outputs) by its columns of the weight; one all-reduce sums the partial products.

    Input [T, in_features / N] -> [T, out_features], every rank the same bits. ``linear`` (the
    rank's columns, no bias) is a child module, so ``use_invariant_linears`` swaps it for the
    batch-invariant GEMM like any other linear; the bias (whole) is added once, after the sum.
    """

    def __init__(self, linear: nn.Linear, bias: bool, communicator: Communicator):
        super().__init__()
        self.linear = linear
        self.bias = nn.Parameter(torch.empty(linear.out_features)) if bias else None
        self.communicator = communicator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.communicator.all_reduce(self.linear(x).contiguous())
        return out if self.bias is None else out + self.bias


class VocabParallelEmbedding(nn.Module):
    """Embedding of the rank's vocabulary rows ``[start, start + num_real)``; ids outside give a
    zero row, and one all-reduce adds the one rank's row that holds each id (exact: ``x + 0 = x``).

    Input int64 [T] -> [T, hidden] in the weight's dtype. ``weight`` is [vocab_per_rank, hidden]
    (rows past ``num_real`` are zero padding on the last rank).
    """

    def __init__(self, num_rows: int, hidden_size: int, start: int, num_real: int, communicator: Communicator):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_rows, hidden_size))
        self.start = start
        self.num_real = num_real
        self.communicator = communicator

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.start
        outside = (local < 0) | (local >= self.num_real)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out.masked_fill_(outside[:, None], 0)
        return self.communicator.all_reduce(out)


class ParallelMoeBlock(nn.Module):
    """``all_reduce(block(x))``: a mixture of experts (``kvserve.model.moe.SparseMoeBlock``) whose
    rank holds a slice of every expert's width, or whole experts of its own (expert parallelism),
    and a slice of the shared expert; every rank routes all tokens with the whole router, so the
    rank outputs are partial sums of the layer's output (in float32 for bfloat16, as
    ``Communicator.all_reduce`` sums). [T, hidden] -> [T, hidden], every rank the same bits."""

    def __init__(self, block: nn.Module, communicator: Communicator):
        super().__init__()
        self.block = block
        self.communicator = communicator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.communicator.all_reduce(self.block(x).contiguous())


def parallelize(model: nn.Module, shard: TensorParallelShard, communicator: Communicator) -> nn.Module:
    """Swap ``model``'s (a Llama-family model built from ``shard.local_arch()``, on any device,
    also ``meta``) row-parallel projections and embedding for the layers above, in place.
    Returns ``model``."""
    from kvserve.model.moe import SparseMoeBlock

    arch = shard.arch
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        attn.o_proj = _row_parallel(attn.o_proj, communicator)
        if isinstance(mlp, SparseMoeBlock):
            layer.mlp = ParallelMoeBlock(mlp, communicator)
        else:
            mlp.down_proj = _row_parallel(mlp.down_proj, communicator)
    old = model.model.embed_tokens
    start, end = shard.vocab_rows
    embedding = VocabParallelEmbedding(shard.vocab_per_rank, arch.hidden_size, start, end - start, communicator)
    embedding.weight = old.weight
    model.model.embed_tokens = embedding
    return model


def _row_parallel(linear: nn.Linear, communicator: Communicator) -> RowParallelLinear:
    bias = linear.bias is not None
    inner = nn.Linear(linear.in_features, linear.out_features, bias=False, device=linear.weight.device,
                      dtype=linear.weight.dtype)
    inner.weight = linear.weight
    layer = RowParallelLinear(inner, bias, communicator)
    if bias:
        layer.bias = linear.bias
    return layer
