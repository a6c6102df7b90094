"""The disk tier: full KV blocks as files, found by their prefix-cache hash, kept across restarts.

    <path>/<fingerprint>/<first 2 hex digits>/<block hash, 64 hex digits>.kvb
    file = header (magic, fingerprint, block hash, payload length, CRC-32 of the payload) + payload

One file per block (every layer's K and V of the block: ``kvserve.kv_transfer.block_io``). Files are
written by one writer thread (``put`` only queues; the engine thread never waits on the disk),
each to a temporary name then renamed, so a crash leaves whole files or none. A request's blocks
are read ahead by a reader thread when it is queued (``prefetch``): by the time it is admitted,
``get`` usually finds them checked and in memory (``READ_AHEAD_BYTES`` at most) and only reads the
disk itself for those not read yet. The index (hash ->
bytes, least recently used first) is rebuilt from the folder at start-up, oldest modification
first; a read refreshes a file's place (and its modification time). Past ``max_bytes`` the least
recently used files are deleted. A file whose header or checksum does not match (bit flips, a
truncated file) is deleted and counts as a miss, never as KV. A folder that cannot be created or a
write that fails (a full disk, a read-only folder) is logged and disables the tier: it then holds
nothing and takes nothing, and serving goes on without it.
"""

from __future__ import annotations

import logging
import os
import queue
import stat
import struct
import threading
import time
import zlib
from collections import OrderedDict
from itertools import takewhile
from pathlib import Path

logger = logging.getLogger(__name__)

MAGIC = b"KVSBLK01"
_HEADER = struct.Struct("<8s16s32sQI")  # magic, fingerprint, block hash, payload bytes, crc32
SUFFIX = ".kvb"
QUEUE_BYTES = 256 << 20  # blocks waiting for the writer at most; later ones are dropped (counted)
READ_AHEAD_BYTES = 256 << 20  # blocks read ahead and not taken yet at most (the oldest dropped)


class DiskKVStore:
    """Args:
        path: the tier's folder (created).
        fingerprint: 32 hex digits (``kvserve.kv_transfer.fingerprint``): a sub-folder.
        max_bytes: size bound of the files (headers included).
        block_nbytes: a payload's size (files of another size are ignored).
    """

    name = "disk"

    def __init__(self, path: str, fingerprint: str, max_bytes: int, block_nbytes: int):
        self.root = Path(path) / fingerprint
        self.disabled: str | None = None  # why the tier stopped (a failed write), or None
        self._ready: OrderedDict[int, bytes] = OrderedDict()  # read ahead, checked, not taken yet
        self._reads: queue.Queue = queue.Queue()
        self.fingerprint = bytes.fromhex(fingerprint)[:16]
        self.max_bytes = max_bytes
        self.file_bytes = _HEADER.size + block_nbytes
        self.block_nbytes = block_nbytes
        self._index: OrderedDict[int, None] = OrderedDict()  # block hash, least recently used first
        self._pending: set[int] = set()
        self._lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, QUEUE_BYTES // self.file_bytes))
        self.dropped_writes = 0
        self.corrupt = 0
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self._scan()
        except OSError as exc:
            self._disable(f"its folder {self.root} cannot be used: {exc}")
        self._writer = threading.Thread(target=self._write_loop, name="kvserve-kv-disk", daemon=True)
        self._writer.start()
        self._reader = threading.Thread(target=self._read_loop, name="kvserve-kv-disk-read", daemon=True)
        self._reader.start()

    # -- queries -----------------------------------------------------------------------------

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._index

    @property
    def num_blocks(self) -> int:
        return len(self._index)

    @property
    def used_bytes(self) -> int:
        return len(self._index) * self.file_bytes

    def get(self, block_hash: int) -> bytes | None:
        """The block's payload, or None (absent, unreadable or corrupt: then deleted)."""
        with self._lock:
            payload = self._ready.pop(block_hash, None)
        if payload is not None:
            return payload
        return self._read(block_hash)

    def prefetch(self, hashes: list[int]) -> None:
        """Read these blocks ahead, on the reader thread: the run of them from the first that the
        tier holds (the blocks after a miss cannot be used)."""
        wanted = list(takewhile(self._index.__contains__, hashes))
        if wanted:
            self._reads.put(wanted)

    def _read_loop(self) -> None:
        while True:
            hashes = self._reads.get()
            if hashes is None:
                return
            for block_hash in hashes:
                if block_hash in self._ready:
                    continue
                payload = self._read(block_hash)
                if payload is None:
                    break  # the blocks after a miss cannot be used
                with self._lock:
                    self._ready[block_hash] = payload
                    while len(self._ready) * self.block_nbytes > READ_AHEAD_BYTES:
                        self._ready.popitem(last=False)

    def _read(self, block_hash: int) -> bytes | None:
        if block_hash not in self._index:
            return None
        path = self._path(block_hash)
        try:
            data = self._read_file(path)
        except OSError:
            self._forget(block_hash)
            return None
        payload = None if data is None else self._check(data, block_hash)
        if payload is None:
            self.corrupt += 1
            logger.warning("KV disk tier: %s is corrupt; deleted (its block is recomputed)", path)
            self._forget(block_hash, delete=True)
            return None
        with self._lock:
            if block_hash in self._index:
                self._index.move_to_end(block_hash)
        try:
            os.utime(path)  # its place in the LRU order after a restart
        except OSError:
            pass
        return payload

    def _read_file(self, path: Path) -> bytes | None:
        """The file's bytes, or None when it is not a regular file of a block's size (a FIFO or a
        device put in its place must not block or flood the engine thread)."""
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size != self.file_bytes:
                return None
            with os.fdopen(fd, "rb", closefd=False) as f:
                return f.read(self.file_bytes)
        finally:
            os.close(fd)

    def _check(self, data: bytes, block_hash: int) -> bytes | None:
        if len(data) != self.file_bytes:
            return None
        magic, fingerprint, stored_hash, length, crc = _HEADER.unpack_from(data)
        payload = data[_HEADER.size:]
        if magic != MAGIC or fingerprint != self.fingerprint or stored_hash != block_hash.to_bytes(32, "big") \
                or length != len(payload) or zlib.crc32(payload) != crc:
            return None
        return payload

    # -- changes -----------------------------------------------------------------------------

    def put(self, block_hash: int, payload) -> None:
        """Queue a block for writing (nothing when it is stored or queued already or the tier is
        disabled; dropped and counted when the writer is ``QUEUE_BYTES`` behind)."""
        if self.disabled:
            return
        with self._lock:
            if block_hash in self._index or block_hash in self._pending:
                return
            self._pending.add(block_hash)
        try:
            self._queue.put_nowait((block_hash, payload))
        except queue.Full:
            with self._lock:
                self._pending.discard(block_hash)
            self.dropped_writes += 1

    def flush(self) -> None:
        """Wait until every queued block is written."""
        self._queue.join()

    def close(self) -> None:
        """Write what is queued, then stop the writer and the reader."""
        self._queue.put(None)
        self._writer.join()
        self._reads.put(None)
        self._reader.join()

    # -- the writer and the index ------------------------------------------------------------

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                if not self.disabled:
                    self._write(*item)
            except OSError as exc:  # a full disk, a read-only folder: serving goes on without the tier
                self._disable(f"writing a block failed: {exc}")
            finally:
                if item is not None:
                    with self._lock:
                        self._pending.discard(item[0])
                self._queue.task_done()

    def _write(self, block_hash: int, payload) -> None:
        payload = memoryview(payload).cast("B")
        header = _HEADER.pack(MAGIC, self.fingerprint, block_hash.to_bytes(32, "big"), len(payload),
                              zlib.crc32(payload))
        path = self._path(block_hash)
        path.parent.mkdir(exist_ok=True)
        temporary = path.with_suffix(f".{threading.get_ident()}.tmp")
        try:
            with open(temporary, "wb") as f:
                f.write(header)
                f.write(payload)
            os.replace(temporary, path)
        except OSError:
            temporary.unlink(missing_ok=True)
            raise
        with self._lock:
            self._index[block_hash] = None
            victims = []
            while len(self._index) * self.file_bytes > self.max_bytes and self._index:
                victims.append(self._index.popitem(last=False)[0])
        for victim in victims:
            self._path(victim).unlink(missing_ok=True)

    def _disable(self, why: str) -> None:
        logger.error("KV disk tier disabled (serving goes on without it): %s", why)
        with self._lock:
            self.disabled = why
            self._index.clear()
            self._ready.clear()

    def _forget(self, block_hash: int, delete: bool = False) -> None:
        with self._lock:
            self._index.pop(block_hash, None)
        if delete:
            self._path(block_hash).unlink(missing_ok=True)

    def _path(self, block_hash: int) -> Path:
        name = f"{block_hash:064x}"
        return self.root / name[:2] / (name + SUFFIX)

    def _scan(self) -> None:
        """Rebuild the index from the folder (oldest first), dropping unfinished writes and files
        of another size; trim to ``max_bytes``."""
        started = time.perf_counter()
        found = []
        for path in self.root.glob(f"*/*{SUFFIX}"):
            try:
                stat = path.stat()
                block_hash = int(path.stem, 16)
            except (OSError, ValueError):
                continue
            if stat.st_size != self.file_bytes:
                path.unlink(missing_ok=True)
                continue
            found.append((stat.st_mtime, block_hash))
        for path in self.root.glob("*/*.tmp"):
            path.unlink(missing_ok=True)
        found.sort()
        excess = max(0, len(found) - self.max_bytes // self.file_bytes)
        for _, block_hash in found[:excess]:
            self._path(block_hash).unlink(missing_ok=True)
        self._index = OrderedDict((block_hash, None) for _, block_hash in found[excess:])
        if self._index:
            logger.info("KV disk tier %s: %d blocks (%.1f MiB) found in %.2f s", self.root, len(self._index),
                        self.used_bytes / (1 << 20), time.perf_counter() - started)
