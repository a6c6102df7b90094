"""Applying many adapters in one batch: ``LoRALinear`` wraps a projection and adds each token's
adapter, ``y = base(x) + B_s (A_s x)`` (scaling folded into ``B_s``), with the weights of the
loaded adapters in preallocated slots (the layout of Punica / S-LoRA: Chen et al. 2023,
"Punica"; Sheng et al. 2023, "S-LoRA").

Slots hold ``max_rank`` per shard (an adapter of a smaller rank is zero-padded: exact zeros)::

    A^T  [slots, in, shards * r]    columns [q r | k r | v r] of slot s (one shard for o_proj, down_proj)
    B^T  [slots, r, out]            output column n reads the r values of its own shard

A step's tokens are grouped by slot once (``LoRABatch``: the segments of Punica's SGMV). On the
CPU, kvserve's ``lora_apply`` kernel (``kvserve/kernels/csrc/lora.cpp``) then does shrink and
expand for all segments in one call per projection, reading each used adapter's weights once,
every value one fixed sequence of float operations: a request gets the same bits alone and in any
mixed batch. Elsewhere (CUDA, no compiler) the same products run per segment through torch
matmuls (not batch-invariant).
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import torch
from torch import nn

from kvserve.lora.peft_adapter import ModuleLoRA


class Segments:
    """The adapted tokens of some rows grouped by slot (int64 tensors on the CPU).

    Attributes:
        order: [Ta] token indices (relative to the rows' first token), grouped by slot.
        starts: [S + 1] segment ``i`` is ``order[starts[i]:starts[i + 1]]``.
        slots: [S] each segment's slot.
    """

    def __init__(self, token_slots: np.ndarray):
        adapted = np.flatnonzero(token_slots >= 0)
        order = adapted[np.argsort(token_slots[adapted], kind="stable")]
        slots, counts = np.unique(token_slots[order], return_counts=True)
        self.order = torch.from_numpy(order.astype(np.int64))
        self.starts = torch.from_numpy(np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))
        self.slots = torch.from_numpy(slots.astype(np.int64))
        self.num_segments = len(slots)


class LoRABatch:
    """The adapter slot of each token of one forward, shared by every ``LoRALinear``.

    Args:
        token_slots: int [T], each token's slot, -1 for the base model.

    A module called on a tile of the rows (the MLP runs long prefills in tiles) gets the segments
    of that tile: each module sees every token once per forward, in order, so a per-module cursor
    says where its next call starts.
    """

    def __init__(self, token_slots: np.ndarray):
        self.token_slots = token_slots
        self.num_tokens = len(token_slots)
        self._segments: dict[tuple[int, int], Segments] = {}
        self._cursor: dict[int, int] = {}

    def segments(self, module: nn.Module, n: int) -> Segments:
        """The segments of ``module``'s next call, on ``n`` rows."""
        start = 0 if n == self.num_tokens else self._cursor.get(id(module), 0)
        self._cursor[id(module)] = (start + n) % self.num_tokens
        key = (start, start + n)
        found = self._segments.get(key)
        if found is None:
            found = self._segments[key] = Segments(self.token_slots[start : start + n])
        return found


class LoRALinear(nn.Module):
    """A projection (``nn.Linear``, ``MergedLinear`` or ``InvariantLinear``) plus per-token
    adapters held in slots (see the module docstring).

    Input [T, in_features] -> [T, sum(shard_sizes)] in the input's dtype.

    Args:
        base: the projection.
        in_features: its inputs.
        shard_sizes: output rows of each fused shard (``[q, kv, kv]``, ``[inter, inter]`` or one).
        max_loras: slots.
        max_rank: rank per shard and slot.
        dtype: the slots' dtype (``--lora-dtype``).
        device: the model's device.
        kernels: ``kvserve.kernels.kernels_for(device)`` for the CPU kernel, or None (torch matmuls).
    """

    def __init__(self, base: nn.Module, in_features: int, shard_sizes: list[int], max_loras: int, max_rank: int,
                 dtype: torch.dtype, device: torch.device, kernels: ModuleType | None):
        super().__init__()
        self.base = base
        self.in_features = in_features
        self.shard_sizes = list(shard_sizes)
        self.offsets = np.concatenate([[0], np.cumsum(shard_sizes)]).tolist()
        self.shard_offsets = torch.tensor(self.offsets, dtype=torch.int64)
        self.max_loras, self.rank = max_loras, max_rank
        self._kernels = kernels
        self.batch: LoRABatch | None = None
        num_shards, out = len(shard_sizes), sum(shard_sizes)
        self.a = torch.zeros(max_loras, in_features, num_shards * max_rank, dtype=dtype, device=device)  # A^T
        self.b = torch.zeros(max_loras, max_rank, out, dtype=dtype, device=device)  # B^T

    def set_slot(self, slot: int, weights: ModuleLoRA | None) -> None:
        """Write one adapter's weights (or zeros: None / shards it does not adapt) into ``slot``."""
        r = self.rank
        a, b = torch.zeros_like(self.a[slot]), torch.zeros_like(self.b[slot])
        for j, (first, last) in enumerate(zip(self.offsets[:-1], self.offsets[1:])):
            a_j = None if weights is None else weights.a[j]
            if a_j is not None:
                rank = a_j.shape[0]
                a[:, j * r : j * r + rank] = a_j.t().to(a.dtype)
                b[:rank, first:last] = weights.b[j].t().to(b.dtype)
        self.a[slot] = a
        self.b[slot] = b

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        batch = self.batch
        if batch is None:
            return y
        segments = batch.segments(self, x.shape[0])
        if segments.num_segments == 0:
            return y
        rows = x.reshape(-1, self.in_features).contiguous()
        out = y.view(-1, y.shape[-1])
        if self._kernels is not None:
            self._kernels.lora_apply(rows, out, self.a, self.b, segments.order, segments.starts, segments.slots,
                                     self.shard_offsets, self.rank)
        else:
            self._apply_torch(rows, out, segments)
        return y

    def _apply_torch(self, rows: torch.Tensor, out: torch.Tensor, segments: Segments) -> None:
        r = self.rank
        starts = segments.starts.tolist()
        for i, slot in enumerate(segments.slots.tolist()):
            index = segments.order[starts[i] : starts[i + 1]].to(rows.device)
            h = rows.index_select(0, index) @ self.a[slot].to(rows.dtype)
            for j, (first, last) in enumerate(zip(self.offsets[:-1], self.offsets[1:])):
                delta = h[:, j * r : (j + 1) * r] @ self.b[slot, :, first:last].to(rows.dtype)
                out[:, first:last].index_add_(0, index, delta)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, shard_sizes={self.shard_sizes}, max_loras={self.max_loras}, "
                f"max_rank={self.rank}, kernel={self._kernels is not None}")
