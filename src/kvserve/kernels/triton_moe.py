"""The experts of a mixture-of-experts layer in Triton, for NVIDIA GPUs: a grouped GEMM over the
(token, expert) pairs sorted by expert, for the gate-up and the down projections, instead of a
loop of per-expert linears (a host round trip for the counts and two launches per expert).

What ``moe.cpp`` is on the CPU for ``SparseMoeBlock`` (``kvserve.model.moe``), which calls
:meth:`TritonMoe.experts` on a CUDA device where Triton imports (:func:`triton_moe_for`); on a CPU
it runs only under Triton's interpreter, which is how the tests check it against the block's torch
code.

The pairs are laid out as vLLM's ``moe_align_block_size`` lays them (Kwon et al.; the layout of
its fused MoE kernel): each expert's pairs, in token order, padded to a multiple of ``BLOCK_M``
rows, so every block of rows belongs to one expert; a table of each expert's weight pointers lets
one launch read every expert's weights where they already are (no stacked copy). The weights: the
experts' float ``nn.Linear`` weights, or their ``QuantizedLinear`` weights packed for Triton
(``kvserve.kernels.triton_quant_linear``: int8, int4, MXFP4), all experts in one format.

Numerics are the torch code's but for the order of each float32 sum (``tl.dot``): each projection
rounds to the model dtype, a bias is added after it in the dtype, the activation is the block's
own module, and a token's weighted expert outputs are added in increasing expert order, each
product rounded as ``SparseMoeBlock.torch_forward`` rounds it. A row is computed alone (padding
rows are masked), so a token's output does not depend on the other tokens but through the row
tile's size (``BLOCK_M``, 16 up to 128 tokens, else 64), as for ``triton_quant_linear``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from kvserve.kernels.triton_support import triton_available

# Imported at first use (``_kernels``), as in ``kvserve.kernels.triton_elementwise``.
triton = None

BLOCK_N = 64
BLOCK_K = 64


def _kernels():
    global triton
    import triton

    from kvserve.kernels import triton_moe_kernels

    return triton_moe_kernels


@dataclass(frozen=True)
class ExpertTable:
    """One projection of every expert held: device tables of int64 pointers (weights or codes,
    scales, offsets, biases; 0 where absent) and their format. ``keep`` holds the tensors the
    pointers point into."""

    weights: torch.Tensor
    scales: torch.Tensor
    offsets: torch.Tensor
    biases: torch.Tensor
    bits: int  # 16: float weights [N, K]; 8, 4: packed codes (``triton_quant_linear``)
    e2m1: bool
    has_offsets: bool
    has_bias: bool
    group_size: int
    shape: tuple[int, int]  # [N, K]
    keep: tuple


def expert_table(linears: Sequence[nn.Module], biases: Sequence[torch.Tensor] | None, dtype: torch.dtype) -> ExpertTable | None:
    """The table of one projection of the experts (``nn.Linear`` weights of ``dtype``, or
    ``QuantizedLinear`` packed for Triton, all alike, without biases or GPTQ act order); None when
    they are not."""
    packed = [getattr(linear, "triton_weight", None) for linear in linears]
    if all(p is not None and linear.input_perm is None and linear.bias is None for p, linear in zip(packed, linears)):
        first = packed[0]
        if any((p.bits, p.e2m1, p.offsets is None, p.group_size, p.shape)
               != (first.bits, first.e2m1, first.offsets is None, first.group_size, first.shape) for p in packed):
            return None
        tensors = [(p.codes, p.scales, p.offsets) for p in packed]
        bits, e2m1, group_size, shape = first.bits, first.e2m1, first.group_size, first.shape
    elif all(isinstance(linear, nn.Linear) and linear.bias is None and linear.weight.dtype == dtype
             and linear.weight.is_contiguous() for linear in linears):
        tensors = [(linear.weight, None, None) for linear in linears]
        bits, e2m1, group_size, shape = 16, False, 1, tuple(linears[0].weight.shape)
        if any(tuple(linear.weight.shape) != shape for linear in linears):
            return None
    else:
        return None
    if any(t is not None and t.data_ptr() % 16 for group in tensors for t in group):
        return None  # the kernel tells Triton the addresses are 16-byte aligned
    device = tensors[0][0].device

    def table(items) -> torch.Tensor:
        return torch.tensor([0 if t is None else t.data_ptr() for t in items], dtype=torch.int64, device=device)

    bias_tensors = None if biases is None else [b.detach().to(dtype).contiguous() for b in biases]
    return ExpertTable(table(t[0] for t in tensors), table(t[1] for t in tensors), table(t[2] for t in tensors),
                       table(bias_tensors or [None] * len(tensors)), bits, e2m1, tensors[0][2] is not None,
                       bias_tensors is not None, group_size, shape, (tensors, bias_tensors))


@dataclass(frozen=True)
class PairLayout:
    """The (token, slot) pairs sorted by expert and padded per expert to whole blocks."""

    pair_at: torch.Tensor        # int64 [capacity]: the pair of each row, -1 for padding
    block_expert: torch.Tensor   # int32 [capacity / BLOCK_M]: the expert of each block, -1 past the last
    row_of_pair: torch.Tensor    # int64 [T * k]: the row of each pair, -1 for an expert not held
    block_m: int


def align_pairs(ids: torch.Tensor, first_expert: int, num_held: int, block_m: int) -> PairLayout:
    """The layout of ``ids`` (int64 [T, k], global expert ids) over the experts
    ``first_expert .. first_expert + num_held - 1`` (the others' pairs are left out), on the
    device, without reading anything back to the host."""
    flat = ids.flatten()
    pairs = flat.numel()
    local = flat - first_expert
    bucket = torch.where((local >= 0) & (local < num_held), local, num_held)
    counts = torch.zeros(num_held + 1, dtype=torch.int64, device=ids.device).scatter_add_(
        0, bucket, torch.ones_like(bucket))[:num_held]  # not bincount: its size is read back from the device
    order = torch.argsort(bucket, stable=True)
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    start = torch.cumsum(counts, 0) - counts
    sorted_bucket = bucket[order]
    held = sorted_bucket < num_held
    expert = sorted_bucket.clamp(max=num_held - 1)
    row = padded_end[expert] - padded[expert] + torch.arange(pairs, device=ids.device) - start[expert]
    row = torch.where(held, row, -1)
    capacity = -(-(pairs + min(pairs, num_held) * (block_m - 1)) // block_m) * block_m  # at most that many experts padded
    pair_at = torch.full((capacity + 1,), -1, dtype=torch.int64, device=ids.device)
    pair_at[torch.where(held, row, capacity)] = torch.where(held, order, -1)  # row ``capacity``: a bin for the rest
    blocks = torch.arange(0, capacity, block_m, device=ids.device)
    block_expert = torch.searchsorted(padded_end, blocks, right=True)
    block_expert = torch.where(block_expert < num_held, block_expert, -1).to(torch.int32)
    row_of_pair = torch.full((pairs,), -1, dtype=torch.int64, device=ids.device).scatter_(0, order, row)
    return PairLayout(pair_at[:capacity].contiguous(), block_expert, row_of_pair, block_m)


class TritonMoe:
    """The grouped GEMMs' launcher."""

    def experts(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: ExpertTable,
                down: ExpertTable, act: Callable[[torch.Tensor], torch.Tensor], first_expert: int) -> torch.Tensor:
        """sum over each token's experts e, in increasing e, of ``(w * expert_e(x)).to(x.dtype)``
        (``SparseMoeBlock.torch_forward``'s loop); x [T, H] contiguous, weights [T, k] (the
        dtype or float32: the product's), ids int64 [T, k] -> [T, H]."""
        tokens, top_k = ids.shape
        num_held = gate_up.weights.numel()
        block_m = 16 if tokens <= 128 else 64  # 128 is a CUDA-graph bucket: a replay takes the eager step's
        layout = align_pairs(ids, first_expert, num_held, block_m)
        hidden = self._gemm(x, layout, gate_up, top_k, gather=True)
        y = self._gemm(act(hidden), layout, down, top_k, gather=False)
        slots = torch.argsort(ids, dim=1, stable=True)  # each token's experts in increasing order
        rows = layout.row_of_pair.view(tokens, top_k).gather(1, slots)
        chosen = weights.gather(1, slots)
        out = torch.zeros_like(x)
        for slot in range(top_k):
            contribution = y.index_select(0, rows[:, slot].clamp(min=0)) * chosen[:, slot, None]
            out = out + torch.where(rows[:, slot, None] >= 0, contribution, 0).to(x.dtype)
        return out

    @staticmethod
    def _gemm(a: torch.Tensor, layout: PairLayout, table: ExpertTable, top_k: int, gather: bool) -> torch.Tensor:
        kernels = _kernels()
        n, k_in = table.shape
        out = torch.empty((layout.pair_at.numel(), n), dtype=a.dtype, device=a.device)
        k_rows = k_in // 2 if table.bits == 4 else k_in
        grid = (layout.block_expert.numel(), triton.cdiv(n, BLOCK_N))
        kernels.moe_gemm_kernel[grid](
            a, layout.pair_at, layout.block_expert, table.weights, table.scales, table.offsets, table.biases, out, n,
            k_in, triton.cdiv(k_rows, BLOCK_K), a.stride(0), table.group_size, TOP_K=top_k, GATHER=gather,
            BITS=table.bits, E2M1=table.e2m1, HAS_OFFSETS=table.has_offsets, HAS_BIAS=table.has_bias,
            PRECISION="ieee" if a.dtype == torch.float32 else None,
            INTERPRETED=triton.knobs.runtime.interpret, BLOCK_M=layout.block_m,
            BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)
        return out


def triton_moe_for(device: torch.device | str | None) -> TritonMoe | None:
    """The grouped GEMMs for a block on ``device``: on CUDA where Triton imports, else None."""
    if device is None or torch.device(device).type != "cuda" or not triton_available():
        return None
    return TritonMoe()
