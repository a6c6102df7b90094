"""How many KV blocks the engine gets, decided once at start-up from the memory budget."""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass

from kvserve.config import CacheConfig
from kvserve.errors import ConfigError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class KVCachePlan:
    """Attributes:
    num_blocks: KV blocks to allocate.
    block_size: tokens per block.
    bytes_per_block: K and V of all layers for one block, bytes.
    budget_bytes: the memory budget the plan was cut from, bytes.
    max_concurrency: requests of ``max_model_len`` tokens that fit at once (in the usable blocks:
        block 0 is the reserved null block).
    """

    num_blocks: int
    block_size: int
    bytes_per_block: int
    budget_bytes: int
    max_concurrency: float


def available_host_memory_bytes() -> int:
    """``MemAvailable`` from /proc/meminfo (Linux), else total physical memory."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def plan_kv_cache(
    cache: CacheConfig,
    bytes_per_block: int,
    max_model_len: int,
    max_num_seqs: int,
    device_type: str,
    free_device_bytes: int | None = None,
) -> KVCachePlan:
    """Size the paged KV cache.

    Budget: ``--kv-cache-memory-bytes`` when given; else on CPU ``cpu_kv_cache_fraction`` of the
    available RAM, on CUDA ``free_device_bytes`` (device memory times
    ``--gpu-memory-utilization`` minus what weights and activations hold). The plan never
    exceeds what ``max_num_seqs`` requests of ``max_model_len`` tokens can use, so small models
    do not reserve gigabytes they cannot fill. A model that caches nothing (an encoder:
    ``bytes_per_block`` 0) gets exactly that many blocks: the scheduler's accounting of its
    requests, no memory.

    Raises:
        ValueError: the budget holds fewer blocks than one request of ``max_model_len`` needs.
    """
    blocks_per_seq = math.ceil(max_model_len / cache.block_size)
    if cache.num_blocks_override is not None:
        num_blocks = cache.num_blocks_override
        budget = num_blocks * bytes_per_block
    else:
        if cache.kv_cache_memory_bytes is not None:
            budget = cache.kv_cache_memory_bytes
        elif device_type == "cuda":
            assert free_device_bytes is not None
            budget = free_device_bytes
        else:
            budget = int(available_host_memory_bytes() * cache.cpu_kv_cache_fraction)
        fits = budget // bytes_per_block if bytes_per_block else blocks_per_seq * max_num_seqs + 1
        num_blocks = min(fits, blocks_per_seq * max_num_seqs + 1)
    usable = num_blocks - 1
    if usable < blocks_per_seq and cache.num_blocks_override is None:
        needed = (blocks_per_seq + 1) * bytes_per_block
        fits = max(0, usable) * cache.block_size
        raise ConfigError(
            f"the KV cache budget of {budget / 2**20:.2f} MiB holds {max(0, usable)} usable blocks of "
            f"{cache.block_size} tokens (plus the reserved null block), fewer than the {blocks_per_seq} one "
            f"request of max_model_len={max_model_len} needs: give --kv-cache-memory-bytes {needed} or more, "
            f"or lower --max-model-len to {fits} or less"
        )
    plan = KVCachePlan(
        num_blocks=num_blocks, block_size=cache.block_size, bytes_per_block=bytes_per_block,
        budget_bytes=budget, max_concurrency=(num_blocks - 1) / blocks_per_seq,
    )
    logger.info(
        "KV cache%s: %d blocks x %d tokens (%.1f MiB, %.1f KiB/block); max concurrency %.1fx at "
        "max_model_len=%d", "" if cache.kv_cache_dtype == "auto" else f" ({cache.kv_cache_dtype})", plan.num_blocks,
        plan.block_size, num_blocks * bytes_per_block / 2**20, bytes_per_block / 1024, plan.max_concurrency,
        max_model_len,
    )
    return plan
