"""Building an engine's KV transfer from ``--kv-transfer-config``: the connector over its tiers
and sinks, the producer's block server, the consumer's fetcher."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from kvserve.kv_transfer.block_io import BlockCodec
from kvserve.kv_transfer.config import KVTransferConfig, PDConfig
from kvserve.kv_transfer.connector import KVConnector, KVTier
from kvserve.kv_transfer.disk_store import DiskKVStore
from kvserve.kv_transfer.fingerprint import kv_fingerprint
from kvserve.kv_transfer.memory_store import MemoryKVStore
from kvserve.kv_transfer.pd import BlockServer, PDConsumer

logger = logging.getLogger(__name__)


@dataclass
class KVTransfer:
    """An engine's KV transfer (``EngineCore.kv_transfer``)."""

    connector: KVConnector
    fingerprint: str
    pd: PDConfig | None = None
    server: BlockServer | None = None  # a producer's
    consumer: PDConsumer | None = None  # a consumer's (the front end calls its prefetch)

    def kv_transfer_params(self) -> dict | None:
        """What a producer's responses tell the router (vLLM's keys): where to fetch the blocks."""
        if self.pd is None or self.pd.role != "producer":
            return None
        return {"do_remote_prefill": True, "do_remote_decode": False, "remote_host": self.pd.host,
                "remote_port": self.pd.port, "remote_engine_id": self.fingerprint}

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        self.connector.close()


def build_kv_transfer(config, loaded, kv_caches: list[torch.Tensor], block_size: int,
                      transfer: KVTransferConfig) -> KVTransfer:
    """The connector for ``transfer`` over ``kv_caches`` (``EngineConfig`` checked the options).

    Raises:
        OSError: the disk tier's folder or the producer's port cannot be used.
    """
    model = config.model
    fingerprint = kv_fingerprint(model.model, model.tokenizer, str(loaded.dtype).removeprefix("torch."),
                                 model.quantization.label, config.cache.kv_cache_dtype, block_size,
                                 loaded.cached_kv_heads, dict(model.hf_overrides))
    tiers: list[KVTier] = []
    sinks: list[KVTier] = []
    server = consumer = None
    codec = BlockCodec(kv_caches)
    if transfer.host_bytes:  # first: the cheapest place to find a block
        host = MemoryKVStore("host", transfer.host_bytes)
        tiers.append(host)
        sinks.append(host)
    if transfer.pd is not None:
        store = MemoryKVStore("p2p", transfer.pd.staging_bytes)
        if transfer.pd.role == "producer":
            sinks.append(store)
            server = BlockServer(store, fingerprint, transfer.pd.host, transfer.pd.port)
        else:
            tiers.append(store)
            consumer = PDConsumer(store, fingerprint, block_size, codec.nbytes)
    if transfer.disk is not None:
        disk = DiskKVStore(transfer.disk.path, fingerprint, transfer.disk.max_bytes, codec.nbytes)
        tiers.append(disk)
        sinks.append(disk)
        if not disk.disabled:
            logger.info("KV disk tier: %s (%.1f of %.1f GiB used, %d KiB per block)", disk.root,
                        disk.used_bytes / (1 << 30), transfer.disk.max_bytes / (1 << 30), codec.nbytes >> 10)
    return KVTransfer(KVConnector(tiers, sinks, codec), fingerprint, transfer.pd, server, consumer)
