"""A node other than node 0 (``kvserve serve MODEL -tp N --nnodes M --node-rank K
--master-addr A --master-port P``): it serves no API, it runs its ``N / M`` worker ranks
(global ranks ``K*N/M .. (K+1)*N/M - 1``) until the driver shuts them down or dies."""

from __future__ import annotations

import logging

from kvserve.config import EngineConfig
from kvserve.distributed.cpu_pinning import split_cores
from kvserve.distributed.loader import shard_dtype
from kvserve.distributed.worker import WorkerSpec, start_rank

logger = logging.getLogger(__name__)


def run_worker_node(config: EngineConfig) -> int:
    """Start this node's ranks and wait for them. Returns 0 when every rank exited 0, else 1."""
    from kvserve.attention import get_attention_backend
    from kvserve.engine.core import resolve_device

    parallel = config.parallel
    device = resolve_device(config.model.device)
    dtype = shard_dtype(config.model.model, config.model.dtype, device)
    backend = get_attention_backend(config.model.attention_backend, device, config.cache.kv_cache_dtype,
                                    config.cache.block_size).name
    per_node = parallel.ranks_per_node
    cores = split_cores(per_node) if device.type == "cpu" and parallel.pin_cpus else None
    processes = []
    for local_rank in range(per_node):
        rank = parallel.node_rank * per_node + local_rank
        spec = WorkerSpec(config.model.model, dtype, device.type, backend, rank, parallel.tensor_parallel_size,
                          local_rank, parallel.master_addr, parallel.master_port, parallel.dist_timeout,
                          cores[local_rank] if cores else None, config.model.quantization, config.lora,
                          parallel.enable_expert_parallel)
        processes.append((rank, start_rank(spec, daemon=False)))
    logger.info("node %d: tensor-parallel ranks %s started, driver at %s:%d", parallel.node_rank,
                [rank for rank, _ in processes], parallel.master_addr, parallel.master_port)
    failed = []
    for rank, process in processes:
        process.join()
        if process.exitcode != 0:
            failed.append(f"rank {rank} exited with status {process.exitcode}")
    if failed:
        logger.error("node %d: %s", parallel.node_rank, "; ".join(failed))
        return 1
    return 0
