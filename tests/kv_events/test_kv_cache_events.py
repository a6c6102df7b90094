"""The KV manager's events, encoded in vLLM's schema and applied by a consumer, rebuild exactly the
set of hashes the block pool can hit; each stored block's tokens re-hash to its announced hash."""

from __future__ import annotations

import random

import msgspec

from kvserve.kv_cache.block_hash import ROOT_HASH, hash_block_tokens
from kvserve.kv_cache.events import AllBlocksCleared, BlockRemoved, BlockStored
from kvserve.kv_cache.manager import KVCacheManager
from kvserve.kv_events.subscriber import WorkerBlockIndex
from kvserve.kv_events.wire import decode_batch, encode_batch, external_block_hash
from kvserve.request import Request
from kvserve.sampling_params import SamplingParams


def _prefill(manager, request):
    blocks, num_cached = manager.get_computed_blocks(request)
    new = manager.allocate_slots(request, request.num_tokens - num_cached, blocks, num_cached)
    if new is None:
        return False
    request.num_computed_tokens = request.num_tokens
    manager.cache_blocks(request, request.num_computed_tokens)
    return True


def _pool_view(manager):
    return {external_block_hash(h) for h in manager.block_pool.cached_block_hash_to_block}


def _check_chain(index: WorkerBlockIndex, full_by_external: dict[int, int]) -> None:
    """Every block the consumer holds re-hashes (parent's full hash, its tokens, its extra keys)
    to the external hash it was announced under."""
    for external, (parent, tokens, extra) in index.blocks.items():
        parent_full = ROOT_HASH if parent is None else full_by_external[parent]
        full = hash_block_tokens(parent_full, tokens, tuple(extra) if extra else ())
        assert external_block_hash(full) == external
        full_by_external[external] = full


def test_first_events_have_vllm_fields_and_order():
    manager = KVCacheManager(num_blocks=8, block_size=4, enable_kv_cache_events=True)
    request = Request.of("a", list(range(10)), SamplingParams(), cache_salt="tenant")
    assert _prefill(manager, request)
    [stored] = manager.take_events()
    assert isinstance(stored, BlockStored)
    assert stored.parent_block_hash is None and stored.token_ids == tuple(range(8)) and stored.block_size == 4
    h0 = hash_block_tokens(ROOT_HASH, range(4), ("tenant",))
    h1 = hash_block_tokens(h0, range(4, 8), ("tenant",))
    assert stored.block_hashes == (h0, h1) and stored.extra_keys == (("tenant",), ("tenant",))
    payload = encode_batch(12.5, [stored], "CPU", 0)
    raw = msgspec.msgpack.decode(payload)
    assert raw == [12.5, [{"type": "BlockStored", "block_hashes": [h0 & (2**64 - 1), h1 & (2**64 - 1)],
                           "parent_block_hash": None, "token_ids": list(range(8)), "block_size": 4,
                           "lora_id": None, "medium": "CPU", "lora_name": None,
                           "extra_keys": [["tenant"], ["tenant"]], "group_idx": 0,
                           "kv_cache_spec_kind": "full_attention"}], 0]
    assert manager.take_events() == []


def test_events_off_record_nothing():
    manager = KVCacheManager(num_blocks=8, block_size=4)
    assert _prefill(manager, Request.of("a", list(range(10)), SamplingParams()))
    assert manager.take_events() == [] and manager.events.events == []


def test_consumer_rebuilds_the_pool_under_eviction_and_reset():
    rng = random.Random(7)
    manager = KVCacheManager(num_blocks=24, block_size=4, enable_kv_cache_events=True)
    index = WorkerBlockIndex(keep_tokens=True)
    full_by_external: dict[int, int] = {}
    prefixes = [[rng.randrange(50) for _ in range(12)] for _ in range(5)]
    live: list[Request] = []
    kinds = set()
    for step in range(300):
        if live and (len(live) > 3 or rng.random() < 0.4):
            manager.free(live.pop(rng.randrange(len(live))))
        else:
            tokens = rng.choice(prefixes)[: rng.randrange(4, 13)] + [rng.randrange(50) for _ in range(rng.randrange(9))]
            salt = rng.choice([None, None, "s"])
            request = Request.of(f"r{step}", tokens, SamplingParams(), cache_salt=salt)
            if _prefill(manager, request):
                live.append(request)
        if step == 150:
            manager.reset_prefix_cache()
        events = manager.take_events()
        kinds.update(type(e) for e in events)
        if events:  # through the wire, as a subscriber gets them
            index.apply(decode_batch(encode_batch(float(step), events, "CPU", 0)))
        assert index.hashes == _pool_view(manager), step
        _check_chain(index, full_by_external)
        manager.check_integrity()
    assert kinds == {BlockStored, BlockRemoved, AllBlocksCleared}


def test_duplicate_prefix_computed_twice_is_announced_once():
    manager = KVCacheManager(num_blocks=10, block_size=4, enable_kv_cache_events=True)
    a, b = Request.of("a", list(range(9)), SamplingParams()), Request.of("b", list(range(9)), SamplingParams())
    for request in (a, b):  # both admitted before either is computed: neither hits
        blocks, n = manager.get_computed_blocks(request)
        assert n == 0 and manager.allocate_slots(request, request.num_tokens) is not None
    for request in (a, b):
        request.num_computed_tokens = request.num_tokens
        manager.cache_blocks(request, request.num_tokens)
    events = manager.take_events()
    assert len(events) == 1 and len(events[0].block_hashes) == 2
    manager.free(b)  # b's unhashed blocks go back without an event
    assert manager.take_events() == []
