"""vLLM's KV-event wire format (msgpack via msgspec, as vLLM encodes it).

One ZMQ message = three frames ``(topic, seq, payload)``: ``seq`` an 8-byte big-endian counter
from 0, ``payload`` one msgpack ``KVEventBatch``. The batch is a positional array
``[ts, events, data_parallel_rank]``; each event is a map tagged by ``"type"`` (vLLM dropped the
positional layout of events in vllm-project/vllm#42892; the batch stayed positional)::

    [1789095808.83,
     [{"type": "BlockStored", "block_hashes": [15760518052499183552], "parent_block_hash": null,
       "token_ids": [...16 ids...], "block_size": 16, "lora_id": null, "medium": "CPU",
       "lora_name": null, "extra_keys": [null], "group_idx": 0,
       "kv_cache_spec_kind": "full_attention"},
      {"type": "BlockRemoved", "block_hashes": [...], "medium": "CPU", "group_idx": 0},
      {"type": "AllBlocksCleared"}],
     0]

Block hashes travel as vLLM's default external form (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``):
the low 64 bits of the block hash, an unsigned integer (:func:`external_block_hash`). ``medium``
names where the KV cache lives: ``GPU`` on a CUDA device (vLLM's ``MEDIUM_GPU``), ``CPU`` on the
CPU. Field names, order and defaults follow ``vllm/distributed/kv_events.py``; fields at their
default (None) are left out, as msgspec's ``omit_defaults`` does there.
"""

from __future__ import annotations

from typing import Any

import msgspec

from kvserve.kv_cache import events as kv

EXTERNAL_HASH_MASK = (1 << 64) - 1


def external_block_hash(block_hash: int) -> int:
    """The 64-bit hash a consumer sees: the low 64 bits of kvserve's 256-bit block hash (the
    same bits vLLM keeps of its 32-byte digest: ``int.from_bytes(digest, "big") & (2**64 - 1)``)."""
    return block_hash & EXTERNAL_HASH_MASK


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of the three events; encoded as a map with ``"type"`` = the class name."""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


def to_wire(event: kv.KVCacheEvent, medium: str) -> BlockStored | BlockRemoved | AllBlocksCleared:
    """One typed kvserve event in vLLM's schema (one KV-cache group, full attention, no LoRA)."""
    if isinstance(event, kv.BlockStored):
        parent = event.parent_block_hash
        return BlockStored(
            block_hashes=[external_block_hash(h) for h in event.block_hashes],
            parent_block_hash=None if parent is None else external_block_hash(parent),
            token_ids=list(event.token_ids), block_size=event.block_size, lora_id=None, medium=medium,
            lora_name=None, extra_keys=list(event.extra_keys) or [None] * len(event.block_hashes),
            group_idx=0, kv_cache_spec_kind="full_attention")
    if isinstance(event, kv.BlockRemoved):
        return BlockRemoved(block_hashes=[external_block_hash(h) for h in event.block_hashes], medium=medium,
                            group_idx=0)
    return AllBlocksCleared()


def encode_batch(ts: float, events: list[kv.KVCacheEvent], medium: str, data_parallel_rank: int,
                 encoder: msgspec.msgpack.Encoder | None = None) -> bytes:
    """The msgpack payload of one batch."""
    batch = KVEventBatch(ts=ts, events=[to_wire(e, medium) for e in events], data_parallel_rank=data_parallel_rank)
    return (encoder or msgspec.msgpack.Encoder()).encode(batch)


def decode_batch(payload: bytes) -> KVEventBatch:
    """Decode a payload from vLLM or kvserve, in either event layout: maps tagged ``"type"``
    (current vLLM) or the older positional arrays ``["BlockStored", hashes, parent, tokens,
    block_size, lora_id, medium, ...]``.

    Raises:
        msgspec.DecodeError / ValueError: not a KV event batch.
    """
    raw = msgspec.msgpack.decode(payload)
    if isinstance(raw, dict):  # a map-shaped batch
        raw = [raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")]
    ts, events = raw[0], raw[1]
    rank = raw[2] if len(raw) > 2 else None
    return KVEventBatch(ts=float(ts), events=[_event(e) for e in events], data_parallel_rank=rank)


_POSITIONAL = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                    "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"),
    "BlockRemoved": ("block_hashes", "medium", "group_idx"),
    "AllBlocksCleared": (),
}
_TYPES = {"BlockStored": BlockStored, "BlockRemoved": BlockRemoved, "AllBlocksCleared": AllBlocksCleared}


def _event(raw: Any) -> BlockStored | BlockRemoved | AllBlocksCleared:
    if isinstance(raw, dict):
        kind = raw.get("type")
        fields = {k: v for k, v in raw.items() if k != "type"}
    elif isinstance(raw, (list, tuple)) and raw:
        kind = raw[0]
        fields = dict(zip(_POSITIONAL.get(kind, ()), raw[1:]))
    else:
        raise ValueError(f"not a KV event: {raw!r}")
    if kind not in _TYPES:
        raise ValueError(f"unknown KV event type {kind!r}")
    known = set(_POSITIONAL[kind])
    values = {k: v for k, v in fields.items() if k in known}
    for name in ("lora_id", "medium", "lora_name", "parent_block_hash"):
        if name in known:
            values.setdefault(name, None)
    return msgspec.convert(values, _TYPES[kind], strict=False)
