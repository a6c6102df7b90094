"""Rank 0, the driver: it lives in the engine core's process, beside the one scheduler and KV
manager, and runs the same ``ModelRunner`` as a single process does, over a model whose calls
reach every rank::

    ModelRunner (rank 0)                                  worker ranks 1..N-1
    ─────────────────────                                 ───────────────────
    model(ids, positions, kv, meta) ─ Forward(inputs) ──► model(...)       all-reduces in step
    model.compute_logits(h)         ─ ComputeLogits ────► broadcast h ─► LM head rows
                                    ◄── gather logits ───                 (rank 0 concatenates)
    sampling, logits processors, logprobs, the persistent batch: rank 0 only

The scheduler and the KV manager know nothing of ranks; the workers never see a request. The
driver starts the ranks of its node (``worker.start_rank``); the ranks of other
nodes are started there (``kvserve serve ... --node-rank K``, ``run_worker_node``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time

import torch
from torch import nn

from kvserve.attention.backend import AttentionBackend, AttentionMetadata
from kvserve.config import LoRAConfig, ParallelConfig, QuantizationConfig
from kvserve.distributed.communicator import START_TIMEOUT, Communicator, make_store
from kvserve.distributed.cpu_pinning import pin_current_thread, split_cores, unpin
from kvserve.distributed.loader import load_shard
from kvserve.distributed.messages import ComputeLogits, Forward, Heartbeat, InitKVCache, Shutdown
from kvserve.distributed.worker import WorkerSpec, start_rank
from kvserve.errors import ConfigError, EngineDeadError
from kvserve.model.loader import LoadedModel

logger = logging.getLogger(__name__)

# Seconds between heartbeats while the engine is idle (``EngineCore.check_health``).
HEALTH_CHECK_INTERVAL = 1.0


class TensorParallelModel(nn.Module):
    """Rank 0's model: its shard (``module``), with every call announced to the other ranks.

    ``forward(input_ids [T], positions [T], kv_caches, attn_metadata) -> hidden [T, hidden]``
    (replicated on every rank after the last all-reduce); ``compute_logits(hidden [R, hidden])
    -> [R, vocab_size]`` gathered from the ranks' vocabulary shards, in the model dtype.

    Raises:
        EngineDeadError: a collective failed (a rank died or timed out), or the forward failed
            after the other ranks had started theirs (their collectives can no longer match).
    """

    def __init__(self, module: nn.Module, communicator: Communicator, vocab_size: int):
        super().__init__()
        self.module = module
        self.communicator = communicator
        self.vocab_size = vocab_size
        # The runner's kvserve.lora.manager.LoRAManager with --enable-lora: each forward carries
        # its adapters to the other ranks (LoRAManager.step_message).
        self.lora = None

    @property
    def model(self) -> nn.Module:
        """The rank's decoder (``module.model``: embedding, layers, norm), where code written for
        one process finds it (``kvserve.lora.manager`` wraps its projections)."""
        return self.module.model

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                attn_metadata: AttentionMetadata) -> torch.Tensor:
        lora = None if self.lora is None else self.lora.step_message()
        self.communicator.send_message(Forward.of(input_ids, positions, attn_metadata, lora))
        with _engine_dead_on_failure("forward"):
            return self.module(input_ids, positions, kv_caches, attn_metadata)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden.contiguous()
        self.communicator.send_message(ComputeLogits(hidden.shape[0], hidden.dtype))
        with _engine_dead_on_failure("LM head"):
            self.communicator.broadcast(hidden)
            parts = self.communicator.gather(self.module.compute_logits(hidden).contiguous())
        return torch.cat(parts, dim=-1)[:, : self.vocab_size]


@contextlib.contextmanager
def _engine_dead_on_failure(what: str):
    """Rank 0 failing after the other ranks started the same call leaves their collectives
    unmatched: the engine cannot go on, whichever request was running."""
    try:
        yield
    except EngineDeadError:
        raise
    except Exception as exc:
        raise EngineDeadError(f"the tensor-parallel {what} failed on rank 0: {type(exc).__name__}: {exc}") from exc


class TensorParallelDriver:
    """Starts this node's worker ranks, joins the group as rank 0 and loads rank 0's shard.

    Args:
        parallel: ``-tp``, nodes, store address, timeout, pinning.
        model_dir: checkpoint folder.
        dtype: the resolved model dtype (every rank uses it).
        device: rank 0's device (CUDA ranks use ``cuda:<local rank>``).
        backend: rank 0's attention backend (the workers build one of the same name).
        quantization: ``--quantization`` (every rank quantizes its own slices).
        lora: ``--enable-lora`` and its flags (every rank keeps adapter slots for its shard).

    Attributes:
        loaded: rank 0's ``LoadedModel``: ``model`` is a :class:`TensorParallelModel`.

    Raises:
        ConfigError: a rank failed to start or load, exited, or did not join and load within
            ``START_TIMEOUT`` (the message names it and why).
    """

    def __init__(self, parallel: ParallelConfig, model_dir: str, dtype: torch.dtype, device: torch.device,
                 backend: AttentionBackend, quantization: QuantizationConfig = QuantizationConfig(),
                 lora: LoRAConfig | None = None):
        self.parallel = parallel
        self.world_size = parallel.tensor_parallel_size
        self.processes: dict[int, torch.multiprocessing.Process] = {}
        self._pinned = None
        self._closed = False
        cores = split_cores(parallel.ranks_per_node) if device.type == "cpu" and parallel.pin_cpus else None
        self.store = make_store(parallel.master_addr, parallel.master_port, 0, self.world_size, parallel.dist_timeout)
        try:
            self._spawn(model_dir, dtype, device, backend.name, cores, quantization, lora)
            if cores is not None:
                self._pinned = pin_current_thread(cores[0])
            self._wait_for("joined")
            self.communicator = Communicator(self.store, 0, self.world_size, device, parallel.dist_timeout)
            loaded = load_shard(model_dir, dtype, device, backend, 0, self.communicator, quantization,
                                parallel.enable_expert_parallel)
            self._wait_for("loaded")
        except BaseException:
            self.shutdown()
            raise
        model = TensorParallelModel(loaded.model, self.communicator, loaded.arch.vocab_size)
        self.loaded: LoadedModel = dataclasses.replace(loaded, model=model)
        logger.info("tensor parallelism: %d ranks over %d node(s), rank 0 holds %.1fM parameters%s",
                    self.world_size, parallel.nnodes, sum(p.numel() for p in loaded.model.parameters()) / 1e6,
                    f", cores per rank {[list(c) for c in cores]}" if cores else "")

    def _spawn(self, model_dir: str, dtype: torch.dtype, device: torch.device, backend_name: str,
               cores: list[tuple[int, ...]] | None, quantization: QuantizationConfig,
               lora: LoRAConfig | None) -> None:
        for local_rank in range(1, self.parallel.ranks_per_node):
            spec = WorkerSpec(model_dir, dtype, device.type, backend_name, local_rank, self.world_size, local_rank,
                              self.parallel.master_addr, self.store.port, self.parallel.dist_timeout,
                              cores[local_rank] if cores else None, quantization, lora,
                              self.parallel.enable_expert_parallel)
            self.processes[local_rank] = start_rank(spec, daemon=True)

    def _wait_for(self, stage: str) -> None:
        """Until every other rank has set ``<stage>/<rank>`` in the store.

        Raises:
            ConfigError: a rank reported an error, its local process exited, or the timeout passed.
        """
        deadline = time.monotonic() + max(self.parallel.dist_timeout, START_TIMEOUT)
        pending = set(range(1, self.world_size))
        while pending:
            for rank in sorted(pending):
                if self.store.check([f"error/{rank}"]):
                    raise ConfigError(f"tensor-parallel rank {rank} failed: {self.store.get(f'error/{rank}').decode()}")
                if self.store.check([f"{stage}/{rank}"]):
                    pending.discard(rank)
                    continue
                process = self.processes.get(rank)
                if process is not None and not process.is_alive():
                    raise ConfigError(f"tensor-parallel rank {rank} (pid {process.pid}) exited with status "
                                      f"{process.exitcode} before it {stage}")
            if pending and time.monotonic() > deadline:
                where = "" if self.parallel.nnodes == 1 else (
                    f"; are the other nodes started with --master-addr {self.parallel.master_addr} "
                    f"--master-port {self.parallel.master_port}?")
                raise ConfigError(f"tensor-parallel rank(s) {sorted(pending)} not {stage} within "
                                  f"{max(self.parallel.dist_timeout, START_TIMEOUT):g} s{where}")
            time.sleep(0.02)

    def init_kv_cache(self, num_blocks: int, block_size: int, kv_cache_dtype: str) -> None:
        """Have every worker allocate its KV cache (rank 0's is the runner's)."""
        self.communicator.send_message(InitKVCache(num_blocks, block_size, kv_cache_dtype))

    def check_health(self) -> None:
        """Between steps: every local worker process is alive and every rank takes a heartbeat.

        Raises:
            EngineDeadError: naming the rank that exited, or the failed collective.
        """
        exited = self.exited_rank()
        if exited is not None:
            raise EngineDeadError(f"{exited}; the engine stops")
        self.communicator.send_message(Heartbeat())

    def exited_rank(self, wait: float = 0.0) -> str | None:
        """``tensor-parallel rank R (pid P) exited with status S`` for the first local rank whose
        process has exited, waiting up to ``wait`` seconds for one to (a collective that just
        failed on a dead peer's closed connection can see it before the OS reports the exit);
        None when every local rank runs (a remote rank, or one that hung)."""
        deadline = time.monotonic() + wait
        while True:
            for rank, process in self.processes.items():
                if not process.is_alive():
                    return f"tensor-parallel rank {rank} (pid {process.pid}) exited with status {process.exitcode}"
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the workers (a ``Shutdown`` message, then terminate what is left), close the
        groups, and give the calling thread its cores back. Idempotent."""
        if self._closed:
            return
        self._closed = True
        communicator = getattr(self, "communicator", None)
        if communicator is not None:
            try:
                communicator.send_message(Shutdown())
            except EngineDeadError:
                pass
        deadline = time.monotonic() + timeout
        for process in self.processes.values():
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.terminate()
                process.join(5.0)
        if communicator is not None:
            communicator.close()
        if self._pinned is not None:
            unpin(self._pinned)
            self._pinned = None
