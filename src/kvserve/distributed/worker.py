"""A tensor-parallel worker rank (1 .. N-1): its shard of the weights and of the KV cache, and a
loop that mirrors the driver's model calls::

    join the store ("joined/r") -> join the groups -> load the shard ("loaded/r", or "error/r")
    loop:  message = receive (an idle engine may send nothing for hours: the wait for the next
           message has no practical limit; a driver process that exits or dies closes its
           connections, which ends the wait at once)
           InitKVCache -> allocate    Forward -> forward (its all-reduces; its LoRA slot
                                      loads and token -> slot map first, with --enable-lora)
           ComputeLogits -> receive hidden rows, LM head rows, gather to the driver
           Heartbeat -> nothing       Shutdown -> exit 0

Any failure (a peer gone, a timeout, an error of its own) ends the process with status 1 and one
log line; the driver then fails its next collective or health check.

A node's ranks start forked from a server process that imported torch and the worker's modules
once (multiprocessing's ``forkserver``: it starts no threads and no CUDA context), not as fresh
interpreters: a fresh one spends ~3.5 s importing torch before it can join, a forked one joins in
a fraction of a second, from the second engine of a process on (scripts and tests that build
engines in turn; a server pays the import once either way). Each rank takes the environment of its
starter as it is at the start (OpenMP's wait policy excepted: libgomp read it in the server).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
from dataclasses import dataclass

import torch

from kvserve.config import LoRAConfig, QuantizationConfig
from kvserve.distributed.messages import ComputeLogits, Forward, Heartbeat, InitKVCache, Shutdown
from kvserve.process_exit import exit_now

logger = logging.getLogger(__name__)

# Seconds a worker waits for the driver's next message (an offline LLM may idle for long; a
# serving engine sends a heartbeat every second). Collectives inside a call use --dist-timeout.
IDLE_WAIT = 7 * 24 * 3600.0  # under 2**31 ms


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker process needs (picklable: it crosses to the rank's process).

    Attributes:
        model_dir: the checkpoint folder (every node reads its own copy of the same files).
        dtype: the model dtype the driver resolved.
        device: ``cpu`` or ``cuda`` (a CUDA rank uses ``cuda:<local rank>``).
        attention_backend: the resolved backend name (``torch`` or ``cpu_paged``).
        rank, world_size, local_rank: this rank, all ranks, its index on this node.
        master_addr, master_port: the driver's store.
        timeout: ``--dist-timeout`` seconds.
        cores: CPU cores to run on (None: not pinned).
        quantization: ``--quantization`` (each rank quantizes its slices).
        lora: ``--enable-lora`` and its flags (adapter slots for the rank's shard), or None.
        expert_parallel: ``--enable-expert-parallel``.
        environment: the starter's environment variables (:func:`start_rank` sets them).
    """

    model_dir: str
    dtype: torch.dtype
    device: str
    attention_backend: str
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    timeout: float
    cores: tuple[int, ...] | None = None
    quantization: QuantizationConfig = QuantizationConfig()
    lora: LoRAConfig | None = None
    expert_parallel: bool = False
    environment: dict[str, str] | None = None

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cuda", self.local_rank) if self.device == "cuda" else torch.device(self.device)


def start_rank(spec: WorkerSpec, daemon: bool) -> torch.multiprocessing.Process:
    """Start the process of ``spec``'s rank (see the module docstring) with this process's environment."""
    context = torch.multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["kvserve.distributed.worker", "kvserve.distributed.loader"])
    spec = dataclasses.replace(spec, environment=dict(os.environ))
    process = context.Process(target=worker_main, args=(spec,), name=f"kvserve-tp-rank{spec.rank}", daemon=daemon)
    process.start()
    return process


def worker_main(spec: WorkerSpec) -> None:
    """Process entry point: run the worker; exit 1 with one log line on any failure."""
    if spec.environment is not None:
        os.environ.clear()
        os.environ.update(spec.environment)
        if os.environ.get("OMP_NUM_THREADS", "").isdigit():  # libgomp read the server's at its start
            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s tp-rank{spec.rank} %(levelname)s %(message)s")
    try:
        worker = TensorParallelWorker(spec)
    except BaseException as exc:  # noqa: BLE001 - reported to the driver, then exit
        logger.error("tensor-parallel rank %d failed to start: %s: %s", spec.rank, type(exc).__name__, exc)
        sys.exit(1)
    try:
        worker.run()
    except BaseException as exc:  # noqa: BLE001
        logger.error("tensor-parallel rank %d stops: %s: %s", spec.rank, type(exc).__name__, exc)
        sys.exit(1)
    finally:
        worker.communicator.close()
    exit_now(0)  # the groups are closed: nothing left needs the interpreter's teardown


class TensorParallelWorker:
    """One worker rank (see the module docstring). Raises what failed."""

    def __init__(self, spec: WorkerSpec):
        from kvserve.attention import get_attention_backend
        from kvserve.distributed.communicator import Communicator, make_store
        from kvserve.distributed.cpu_pinning import pin_current_thread
        from kvserve.distributed.loader import load_shard
        from kvserve.model.invariant_linear import use_invariant_linears

        if spec.cores:
            pin_current_thread(spec.cores)
        self.spec = spec
        self.device = spec.torch_device
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.store = make_store(spec.master_addr, spec.master_port, spec.rank, spec.world_size, spec.timeout)
        self.store.set(f"joined/{spec.rank}", "1")
        self.communicator = Communicator(self.store, spec.rank, spec.world_size, self.device, spec.timeout)
        try:
            backend = get_attention_backend(spec.attention_backend, self.device)
            self.loaded = load_shard(spec.model_dir, spec.dtype, self.device, backend, spec.rank, self.communicator,
                                     spec.quantization, spec.expert_parallel)
            if self.device.type == "cpu":
                use_invariant_linears(self.loaded.model)
            self.lora = self._init_lora()
        except BaseException as exc:
            self.store.set(f"error/{spec.rank}", f"{type(exc).__name__}: {exc}")
            raise
        self.store.set(f"loaded/{spec.rank}", "1")
        self.kv_caches: list[torch.Tensor] = []

    def _init_lora(self):
        if self.spec.lora is None:
            return None
        from kvserve.lora.manager import LoRAManager

        loaded = self.loaded
        return LoRAManager(loaded.model, loaded.arch, self.spec.lora, self.device, loaded.dtype, shard=loaded.shard)

    @torch.inference_mode()
    def run(self) -> None:
        """Serve the driver's messages until ``Shutdown``."""
        while True:
            message = self.communicator.receive_message(timeout=IDLE_WAIT)
            if isinstance(message, Shutdown):
                return
            if isinstance(message, Forward):
                input_ids, positions, metadata = message.to_inputs(self.device)
                if message.lora is not None and self.lora is None:
                    raise TypeError("the driver sent LoRA adapters but this rank has no LoRA slots")
                with contextlib.nullcontext() if self.lora is None else self.lora.apply_step(message.lora):
                    self.loaded.model(input_ids, positions, self.kv_caches, metadata)
            elif isinstance(message, ComputeLogits):
                hidden = torch.empty(message.num_rows, self.loaded.arch.hidden_size, dtype=message.dtype,
                                     device=self.device)
                self.communicator.broadcast(hidden)
                self.communicator.gather(self.loaded.model.compute_logits(hidden).contiguous())
            elif isinstance(message, InitKVCache):
                self.kv_caches = self._allocate_kv_caches(message)
            elif not isinstance(message, Heartbeat):
                raise TypeError(f"unknown message {type(message).__name__}")

    def _allocate_kv_caches(self, message: InitKVCache) -> list[torch.Tensor]:
        from kvserve.model.kv_cache_layout import allocate_kv_caches

        return allocate_kv_caches(self.loaded.arch, message.num_blocks, message.block_size, message.kv_cache_dtype,
                                  self.loaded.dtype, self.device, self.loaded.cached_kv_heads)
