"""Applying many adapters in one batch: ``LoRALinear`` wraps a projection and adds each token's
adapter, ``y = base(x) + B_s (A_s x)`` (scaling folded into ``B_s``), with a stacked-slot layout in
the spirit of Punica's BGMV / S-LoRA (Chen et al. 2023, "Punica"; Sheng et al. 2023, "S-LoRA").

Weights of the loaded adapters sit in ``max_loras`` preallocated slots of ``max_rank`` per shard
(an adapter of a smaller rank is zero-padded, which adds exact zeros)::

    A (shrink), all shards of a slot together, slots stacked along the outputs:
        rows:  [ slot 0: q r | k r | v r | pad ][ slot 1: ... ] ...         W_A [slots * a_width, in]
    B (expand), one matrix per shard, slots stacked along the inputs (the rank):
        cols:  [ slot 0: r ][ slot 1: r ] ...                                 W_B,j [out_j, slots * r]

One step uses the slots ``lo .. hi - 1`` (the range holding its adapters) and, per module::

    H = x W_A[lo:hi]^T                  [T, S * a_width]   every token against every used slot
    H_j = H masked to the token's slot  [T, S * r]         (other slots' columns set to 0)
    y[:, shard j] += H_j W_B,j[:, lo*r : hi*r]^T

so a step runs one shrink and one expand per shard, whatever the number of adapters, and reads
each used adapter's weights once. On the CPU both products go through kvserve's batch-invariant
GEMM (``kvserve.model.invariant_linear``): a token's delta is the same sequence of FMAs as its
adapter alone would give (the masked columns add exact zeros), so a request's logits have the
same bits alone and in any mixed batch. Elsewhere (CUDA, no compiler) ``F.linear`` computes the
same products without that guarantee.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from kvserve.lora.peft_adapter import ModuleLoRA


class LoRABatch:
    """The adapter of each token of one forward, shared by every ``LoRALinear``.

    Args:
        token_slots: int [T], each token's slot, -1 for the base model.
        lo, hi: the slot range used (``lo <= slot < hi`` for every adapted token).
        device: where the masks go.

    A module called on a tile of the rows (the MLP runs long prefills in tiles) gets the mask of
    that tile: each module sees every token once per forward, in order, so a per-module cursor
    says where its next call starts.
    """

    def __init__(self, token_slots: np.ndarray, lo: int, hi: int, device: torch.device):
        self.lo, self.hi = lo, hi
        self.num_tokens = len(token_slots)
        adapted = token_slots >= 0
        self._adapted_before = np.concatenate([[0], np.cumsum(adapted)])
        local = np.where(adapted, token_slots - lo, -1)
        mask = local[:, None] == np.arange(hi - lo)[None, :]
        self.mask = torch.from_numpy(mask[:, :, None]).to(device)  # [T, S, 1] bool
        self._cursor: dict[int, int] = {}

    def rows(self, module: nn.Module, n: int) -> tuple[int, int]:
        """The rows ``[start, start + n)`` of ``module``'s next call."""
        start = self._cursor.get(id(module), 0)
        if n == self.num_tokens:
            start = 0
        self._cursor[id(module)] = (start + n) % self.num_tokens
        return start, start + n

    def any_adapted(self, start: int, end: int) -> bool:
        return bool(self._adapted_before[end] - self._adapted_before[start])


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
        kernels: ``kvserve.kernels.cpu_kernels()`` for the batch-invariant CPU path, or None.
    """

    def __init__(self, base: nn.Module, in_features: int, shard_sizes: list[int], max_loras: int, max_rank: int,
                 dtype: torch.dtype, device: torch.device, kernels: ModuleType | None):
        super().__init__()
        self.base = base
        self.in_features = in_features
        self.shard_sizes = list(shard_sizes)
        self.offsets = np.concatenate([[0], np.cumsum(shard_sizes)]).tolist()
        self.max_loras, self.rank = max_loras, max_rank
        self._kernels = kernels
        self.panel = kernels.linear_panel_width() if kernels is not None else 1
        self.a_width = -(-len(shard_sizes) * max_rank // self.panel) * self.panel
        self.batch: LoRABatch | None = None
        self._init_slots(dtype, device)

    def _init_slots(self, dtype: torch.dtype, device: torch.device) -> None:
        slots, r, p = self.max_loras, self.rank, self.panel
        if self._kernels is not None:  # packed panels [P, K, panel] (kvserve/kernels/csrc/linear.cpp)
            self.a = torch.zeros(slots * self.a_width // p, self.in_features, p, dtype=dtype, device=device)
            self.b = [torch.zeros(-(-n // p), slots * r, p, dtype=dtype, device=device) for n in self.shard_sizes]
        else:
            self.a = torch.zeros(slots * self.a_width, self.in_features, dtype=dtype, device=device)
            self.b = [torch.zeros(n, slots * r, dtype=dtype, device=device) for n in self.shard_sizes]

    # -- slots -------------------------------------------------------------------------------------

    def set_slot(self, slot: int, weights: ModuleLoRA | None) -> None:
        """Write one adapter's weights (or zeros: None / shards it does not adapt) into ``slot``."""
        r = self.rank
        dtype, device = self.a.dtype, self.a.device
        a = torch.zeros(self.a_width, self.in_features, dtype=dtype)
        bs = [torch.zeros(n, r, dtype=dtype) for n in self.shard_sizes]
        for j in range(len(self.shard_sizes)):
            a_j = None if weights is None else weights.a[j]
            if a_j is not None:
                rank = a_j.shape[0]
                a[j * r : j * r + rank] = a_j
                bs[j][:, :rank] = weights.b[j]
        if self._kernels is not None:
            pa = self.a_width // self.panel
            self.a[slot * pa : (slot + 1) * pa] = self._kernels.pack_linear_weight(a).to(device)
            for j, b in enumerate(bs):
                self.b[j][:, slot * r : (slot + 1) * r] = self._kernels.pack_linear_weight(b).to(device)
        else:
            self.a[slot * self.a_width : (slot + 1) * self.a_width] = a.to(device)
            for j, b in enumerate(bs):
                self.b[j][:, slot * r : (slot + 1) * r] = b.to(device)

    # -- forward -----------------------------------------------------------------------------------

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        batch = self.batch
        if batch is None:
            return y
        start, end = batch.rows(self, x.shape[0])
        if not batch.any_adapted(start, end):
            return y
        lo, hi, r = batch.lo, batch.hi, self.rank
        num_slots = hi - lo
        rows = x.reshape(-1, self.in_features).contiguous()
        h = self._shrink(rows, lo, hi).view(rows.shape[0], num_slots, self.a_width)
        mask = batch.mask[start:end]
        out = y.view(-1, y.shape[-1])
        for j, (first, last) in enumerate(zip(self.offsets[:-1], self.offsets[1:])):
            h_j = torch.where(mask, h[:, :, j * r : (j + 1) * r], 0).view(rows.shape[0], num_slots * r)
            delta = self._expand(h_j, j, lo, hi)
            if len(self.shard_sizes) == 1:
                out += delta
            else:
                out[:, first:last] += delta
        return y

    def _shrink(self, rows: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        if self._kernels is not None:
            pa = self.a_width // self.panel
            return self._kernels.invariant_linear(rows, self.a[lo * pa : hi * pa], None, (hi - lo) * self.a_width)
        return F.linear(rows, self.a[lo * self.a_width : hi * self.a_width].to(rows.dtype))

    def _expand(self, h: torch.Tensor, shard: int, lo: int, hi: int) -> torch.Tensor:
        r = self.rank
        if self._kernels is not None:
            return self._kernels.invariant_linear(h, self.b[shard][:, lo * r : hi * r], None, self.shard_sizes[shard])
        return F.linear(h, self.b[shard][:, lo * r : hi * r].to(h.dtype))

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, shard_sizes={self.shard_sizes}, max_loras={self.max_loras}, "
                f"max_rank={self.rank}, packed={self._kernels is not None}")
