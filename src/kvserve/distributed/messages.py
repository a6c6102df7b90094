"""What rank 0 (the driver) sends the other ranks, one message per model call: typed frozen
dataclasses, pickled by ``Communicator.send_message``. The scheduler's output never leaves the
driver: the runner there turns it into a flat batch, and the workers get only the model's inputs
(token ids, positions, attention layout: a few hundred bytes for a decode step)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from kvserve.attention.backend import AttentionMetadata
from kvserve.lora.request import LoRARequest


@dataclass(frozen=True)
class InitKVCache:
    """Allocate the KV cache: ``num_blocks`` blocks of ``block_size`` tokens, ``kv_cache_dtype``
    as ``--kv-cache-dtype`` (each rank caches its own KV heads)."""

    num_blocks: int
    block_size: int
    kv_cache_dtype: str


@dataclass(frozen=True)
class LoRAStep:
    """The adapters of one forward (``--enable-lora``), decided on the driver
    (``kvserve.lora.manager.LoRAManager``) and applied by every rank to its own shard.

    Attributes:
        loads: ``(slot, adapter)`` written into the driver's slots since the last forward, in
            order: each rank reads the adapter's folder (its own CPU cache) and writes its slice
            of the weights into the same slot.
        token_slots: int64 [T], each token's slot (-1: the base model); None when no token of
            this forward runs an adapter.
    """

    loads: tuple[tuple[int, LoRARequest], ...] = ()
    token_slots: np.ndarray | None = None


@dataclass(frozen=True)
class Forward:
    """One forward over a flat batch (``kvserve.model.model_inputs``): host arrays of the
    tensors the driver's model call got (int64 ids/positions/slots, int32 layout)."""

    input_ids: np.ndarray
    positions: np.ndarray
    query_start_loc: np.ndarray
    seq_lens: np.ndarray
    block_tables: np.ndarray
    slot_mapping: np.ndarray
    max_query_len: int
    max_seq_len: int
    lora: LoRAStep | None = None

    @classmethod
    def of(cls, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata,
           lora: LoRAStep | None = None) -> Forward:
        def host(tensor: torch.Tensor) -> np.ndarray:
            return tensor.detach().cpu().numpy()

        return cls(host(input_ids), host(positions), host(metadata.query_start_loc_cpu), host(metadata.seq_lens_cpu),
                   host(metadata.block_tables), host(metadata.slot_mapping), metadata.max_query_len,
                   metadata.max_seq_len, lora)

    def to_inputs(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """(input_ids, positions, attn_metadata) on ``device``, as the driver's model got them."""
        query_start_loc_cpu = torch.from_numpy(self.query_start_loc)
        seq_lens_cpu = torch.from_numpy(self.seq_lens)
        metadata = AttentionMetadata(
            query_start_loc=query_start_loc_cpu.to(device), seq_lens=seq_lens_cpu.to(device),
            block_tables=torch.from_numpy(self.block_tables).to(device),
            slot_mapping=torch.from_numpy(self.slot_mapping).to(device),
            max_query_len=self.max_query_len, max_seq_len=self.max_seq_len,
            query_start_loc_cpu=query_start_loc_cpu, seq_lens_cpu=seq_lens_cpu,
        )
        return (torch.from_numpy(self.input_ids).to(device), torch.from_numpy(self.positions).to(device), metadata)


@dataclass(frozen=True)
class ComputeLogits:
    """The LM head over ``num_rows`` hidden rows, which follow in one broadcast ([num_rows,
    hidden] of ``dtype``); each rank's vocabulary logits are then gathered on the driver."""

    num_rows: int
    dtype: torch.dtype


@dataclass(frozen=True)
class Heartbeat:
    """Nothing to do: the driver is idle and alive (sent about once a second while idle)."""


@dataclass(frozen=True)
class Shutdown:
    """Leave the loop and exit 0."""


Message = InitKVCache | Forward | ComputeLogits | Heartbeat | Shutdown
