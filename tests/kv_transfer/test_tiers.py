"""The pieces under the connector: a block's bytes out of the cache tensors and back (exact, any
dtype), the disk tier (survives a new instance, checksums, LRU bound, the fingerprint folder) and
the memory store."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from kvserve.kv_transfer.block_io import BlockCodec
from kvserve.kv_transfer.disk_store import DiskKVStore
from kvserve.kv_transfer.memory_store import MemoryKVStore

FINGERPRINT = "ab" * 16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_blocks_go_out_and_back_exactly(dtype):
    torch.manual_seed(0)
    shape = (2, 10, 4, 2, 8)  # [K/V, blocks, block_size, heads, row]
    make = (lambda: torch.randint(-100, 100, shape, dtype=dtype)) if dtype == torch.int8 else \
        (lambda: torch.randn(shape).to(dtype))
    source = [make() for _ in range(3)]
    codec = BlockCodec(source)
    assert codec.nbytes == 3 * 2 * 4 * 2 * 8 * source[0].element_size()
    payloads = codec.gather([7, 2, 5])
    assert payloads.shape == (3, codec.nbytes)
    target = [torch.zeros_like(t) for t in source]
    BlockCodec(target).scatter([1, 8, 3], list(payloads))
    for s, t in zip(source, target):
        assert torch.equal(t[:, 1], s[:, 7]) and torch.equal(t[:, 8], s[:, 2]) and torch.equal(t[:, 3], s[:, 5])
        assert not t[:, 0].any()  # nothing else written


def payload(i: int, n: int = 256) -> bytes:
    return bytes((i * 7 + j) % 256 for j in range(n))


def test_the_disk_tier_keeps_blocks_across_instances(tmp_path):
    store = DiskKVStore(str(tmp_path), FINGERPRINT, max_bytes=1 << 20, block_nbytes=256)
    for i in range(5):
        store.put(1000 + i, np.frombuffer(payload(i), dtype=np.uint8))
    store.put(1000, payload(99))  # already stored or queued: not rewritten
    store.close()
    again = DiskKVStore(str(tmp_path), FINGERPRINT, max_bytes=1 << 20, block_nbytes=256)
    assert again.num_blocks == 5 and all(1000 + i in again for i in range(5))
    assert [again.get(1000 + i) for i in range(5)] == [payload(i) for i in range(5)]
    assert again.get(42) is None
    other = DiskKVStore(str(tmp_path), "cd" * 16, max_bytes=1 << 20, block_nbytes=256)  # another model
    assert other.num_blocks == 0 and other.get(1000) is None
    for s in (again, other):
        s.close()


def test_a_corrupt_block_is_a_miss_and_is_deleted(tmp_path):
    store = DiskKVStore(str(tmp_path), FINGERPRINT, max_bytes=1 << 20, block_nbytes=256)
    store.put(7, payload(1))
    store.put(8, payload(2))
    store.flush()
    path = store._path(7)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    assert store.get(7) is None and 7 not in store and not path.exists() and store.corrupt == 1
    assert store.get(8) == payload(2)
    store.close()


def test_the_disk_tier_drops_the_least_recently_used(tmp_path):
    store = DiskKVStore(str(tmp_path), FINGERPRINT, max_bytes=3 * (256 + 68) + 10, block_nbytes=256)
    assert store.file_bytes == 256 + 68  # a 68-byte header
    for i in range(3):
        store.put(i, payload(i))
    store.flush()
    assert store.get(0) == payload(0)  # 0 is now the most recent
    store.put(3, payload(3))
    store.flush()
    assert [i in store for i in range(4)] == [True, False, True, True]
    assert not store._path(1).exists()
    store.close()
    os.utime(store._path(2), (1, 1))  # the oldest after a restart
    smaller = DiskKVStore(str(tmp_path), FINGERPRINT, max_bytes=2 * (256 + 68), block_nbytes=256)
    assert [i in smaller for i in range(4)] == [True, False, False, True]  # trimmed oldest first
    assert not store._path(2).exists()
    smaller.close()


def test_the_memory_store_keeps_the_newest_within_its_bound():
    store = MemoryKVStore("p2p", max_bytes=3 * 256)
    for i in range(4):
        store.put(i, payload(i))
    assert store.num_blocks == 3 and 0 not in store and store.used_bytes == 3 * 256
    assert store.prefix([1, 2, 9, 3]) == [payload(1), payload(2)]
    assert store.get(3) == payload(3)


def test_a_truncated_block_is_a_miss(tmp_path):
    store = DiskKVStore(str(tmp_path), FINGERPRINT, max_bytes=1 << 20, block_nbytes=256)
    store.put(5, payload(5))
    store.flush()
    path = store._path(5)
    path.write_bytes(path.read_bytes()[:-10])
    assert store.get(5) is None and 5 not in store and not path.exists()
    store.close()


def test_an_unusable_folder_disables_the_tier_and_nothing_fails(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    store = DiskKVStore(str(blocker), FINGERPRINT, max_bytes=1 << 20, block_nbytes=256)
    assert store.disabled and "cannot be used" in store.disabled
    store.put(1, payload(1))
    store.flush()
    assert store.get(1) is None and store.num_blocks == 0
    store.close()


def test_a_failed_write_disables_the_tier(tmp_path, monkeypatch):
    import errno

    from kvserve.kv_transfer import disk_store

    store = DiskKVStore(str(tmp_path), FINGERPRINT, max_bytes=1 << 20, block_nbytes=256)
    store.put(1, payload(1))
    store.flush()
    assert store.get(1) == payload(1)

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(disk_store.os, "replace", full)
    store.put(2, payload(2))
    store.flush()
    assert store.disabled and "No space left" in store.disabled
    assert store.get(1) is None and 2 not in store  # the tier is off: nothing is read or written
    assert not list(tmp_path.glob("*/*/*.tmp"))  # the half-written file is gone
    store.put(3, payload(3))
    store.close()


def test_blocks_read_ahead_come_from_memory(tmp_path):
    import time

    store = DiskKVStore(str(tmp_path), FINGERPRINT, max_bytes=1 << 20, block_nbytes=256)
    for i in range(4):
        store.put(i, payload(i))
    store.flush()
    store.prefetch([0, 1, 9, 2])  # a miss ends the run: 2 is not read ahead
    deadline = time.monotonic() + 10
    while len(store._ready) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert list(store._ready) == [0, 1]
    for i in range(4):
        store._path(i).unlink()  # what was read ahead no longer needs the files
    assert store.get(0) == payload(0) and store.get(1) == payload(1)
    assert store.get(2) is None and 2 not in store  # not read ahead, and its file is gone: a miss
    assert store.get(0) is None  # taken once
    store.close()


def test_a_fifo_or_device_in_a_block_place_is_a_miss_not_a_hang(tmp_path):
    store = DiskKVStore(str(tmp_path), FINGERPRINT, max_bytes=1 << 20, block_nbytes=256)
    for i in range(2):
        store.put(i, payload(i))
    store.flush()
    store._path(0).unlink()
    os.mkfifo(store._path(0))  # nothing ever writes it: a plain read would wait for ever
    store._path(1).unlink()
    store._path(1).symlink_to("/dev/zero")  # a read without end
    assert store.get(0) is None and store.get(1) is None
    assert 0 not in store and 1 not in store
    store.close()
