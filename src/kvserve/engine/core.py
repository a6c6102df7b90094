"""``EngineCore``: the only owner of the scheduler, the KV-cache manager and the model. One
``step()`` = schedule -> execute -> update (see DESIGN.md)."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from kvserve.attention import get_attention_backend
from kvserve.config import EngineConfig
from kvserve.engine.activation_profile import GRAPH_AND_WORKSPACE_BYTES, peak_activation_bytes
from kvserve.engine.engine_request import EngineRequest
from kvserve.engine.kv_sizing import KVCachePlan, available_host_memory_bytes, plan_kv_cache
from kvserve.errors import ConfigError, EngineDeadError
from kvserve.kv_cache.events import KVCacheEvent
from kvserve.kv_cache.manager import KVCacheManager
from kvserve.model.arch_config import ModelArchConfig
from kvserve.model.loader import LoadedModel, default_dtype_for_device, load_model
from kvserve.model.kv_cache_layout import kv_cache_bytes_per_block
from kvserve.model.runner import ModelRunner
from kvserve.outputs import EngineCoreOutput
from kvserve.pooling.config import resolve_pooler_config
from kvserve.pooling.engine_rules import check_pooling_options, pooling_engine_config
from kvserve.pooling.pooler import Pooler
from kvserve.request import Request, RequestStatus
from kvserve.scheduler.admission import check_kv_fit
from kvserve.scheduler.scheduler import Scheduler
from kvserve.scheduler.stats import SchedulerStats
from kvserve.spec_decode.proposer import build_proposer, propose_drafts

if TYPE_CHECKING:
    from kvserve.lora.registry import LoRARegistry
    from kvserve.slo.cost_model import StepWork

logger = logging.getLogger(__name__)

# Steps in a row in which every request failed, after which the engine is taken to be broken.
MAX_CONSECUTIVE_FAILED_STEPS = 3


@dataclass(frozen=True)
class StepStats:
    """One non-empty engine step, for metrics and logs.

    Attributes:
        timestamp: ``time.time()`` at the end of the step, seconds.
        duration: wall time of schedule + execute + update, seconds.
        num_requests: requests in the batch.
        num_prefill_tokens: tokens of requests still inside their prompt.
        num_decode_tokens: tokens of requests past their prompt (1 each).
        scheduler: the scheduler's snapshot after the step.
    """

    timestamp: float
    duration: float
    num_requests: int
    num_prefill_tokens: int
    num_decode_tokens: int
    scheduler: SchedulerStats


@dataclass(frozen=True)
class StepResult:
    """One ``EngineCore.step()``: per-request outputs (new tokens, finishes), the step's stats
    (None when nothing ran) and the prefix-cache events it caused (empty unless enabled)."""

    outputs: list[EngineCoreOutput]
    stats: StepStats | None
    kv_events: list[KVCacheEvent] = dataclasses.field(default_factory=list)


def resolve_device(name: str) -> torch.device:
    """``auto`` = CUDA when available, else CPU.

    Raises:
        ConfigError: CUDA was asked for but this torch build or machine has none.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {name}: CUDA is not available (torch {torch.__version__}); use --device cpu")
    return device


def resolve_max_model_len(arch: ModelArchConfig, wanted: int | None, max_seq_length: int | None = None) -> int:
    """The context length: ``--max-model-len`` or the checkpoint's ``max_position_embeddings``
    (less RoBERTa's position offset, ``ModelArchConfig``), capped by a sentence-transformers
    ``max_seq_length`` when given (``PoolerConfig.max_seq_length``).

    Raises:
        ConfigError: ``wanted`` exceeds the model's.
    """
    model_max = arch.max_position_embeddings
    if max_seq_length is not None and max_seq_length < model_max:
        model_max = max_seq_length
    if wanted is None:
        return model_max
    if wanted > model_max:
        limit = "max_seq_length" if model_max == max_seq_length else "max_position_embeddings"
        raise ConfigError(f"--max-model-len {wanted} exceeds the model's {limit} ({model_max})")
    return wanted


class EngineCore:
    """Loads the model, sizes the KV cache and runs engine steps.

    Args:
        config: the engine configuration; ``scheduler.max_model_len`` is replaced by the resolved
            context length (``--max-model-len`` or the checkpoint's ``max_position_embeddings``)
            and ``model.quantization`` by what the checkpoint holds (a GPTQ/AWQ one's method).

    Raises:
        CheckpointError: the model folder cannot be loaded.
        ConfigError: ``--max-model-len`` exceeds the model's, the KV budget is too small, or an
            engine choice (device, attention backend) cannot work here.
    """

    def __init__(self, config: EngineConfig):
        self.device = resolve_device(config.model.device)
        self.tensor_parallel = None  # kvserve.distributed.driver.TensorParallelDriver with -tp > 1
        self.pooler_config = resolve_pooler_config(config.model)  # None: a generative model
        if self.pooler_config is not None:
            check_pooling_options(config)
        self.loaded = self._load(config)
        try:
            self._init_rest(config)
        except BaseException:
            self.shutdown()
            raise

    def _init_rest(self, config: EngineConfig) -> None:
        pooler = self.pooler_config
        self.max_model_len = resolve_max_model_len(self.loaded.arch, config.model.max_model_len,
                                                   None if pooler is None else pooler.max_seq_length)
        if pooler is not None:
            config = pooling_engine_config(config, pooler, self.max_model_len)
        self.draft = self._load_draft(config)
        self.config = dataclasses.replace(
            config, scheduler=dataclasses.replace(config.scheduler, max_model_len=self.max_model_len),
            model=dataclasses.replace(config.model, quantization=self.loaded.quantization),
        )
        self.kv_plan = self._plan_kv_cache()
        self.kv_cache_manager = KVCacheManager(
            self.kv_plan.num_blocks, self.kv_plan.block_size, self.config.cache.enable_prefix_caching,
            enable_kv_cache_events=self.config.cache.enable_kv_cache_events,
        )
        self.scheduler = Scheduler(self.config.scheduler, self.kv_cache_manager, self.config.speculative,
                                   max_loras=self.config.lora.max_loras if self.config.lora else 0)
        self.runner = ModelRunner(self.loaded, self.kv_plan.num_blocks, self.kv_plan.block_size, self.device,
                                  max_num_reqs=self.config.scheduler.max_num_seqs, max_model_len=self.max_model_len,
                                  seed=config.model.seed,
                                  lora_config=self.config.lora,
                                  kv_cache_dtype=self.config.cache.kv_cache_dtype,
                                  enforce_eager=self.config.model.enforce_eager,
                                  pooler=None if pooler is None else Pooler(pooler, self._classifier_head()))
        self.proposer = self._build_proposer()  # speculative decoding's drafts, or None
        self.kv_transfer = self._build_kv_transfer()  # KV beyond the pool (kvserve.kv_transfer), or None
        if self.tensor_parallel is not None:
            self.tensor_parallel.init_kv_cache(self.kv_plan.num_blocks, self.kv_plan.block_size,
                                               self.config.cache.kv_cache_dtype)
        # Requests with nothing to compute (max_tokens == 0, no prompt logprobs): finished on
        # admission, reported by the next step() without touching the scheduler or the KV cache.
        self._finished_on_admission: list[Request] = []
        self._num_failed_steps = 0
        # the last step's work and start while its cost waits for the next step's start (the loop
        # went on at once: what requests wait for is the interval, output processing included)
        self._step_to_learn: tuple[StepWork, float] | None = None

    def _build_kv_transfer(self):
        transfer = self.config.kv_transfer
        if transfer is None:
            return None
        from kvserve.kv_transfer.scheduling import ExternalKV
        from kvserve.kv_transfer.setup import build_kv_transfer

        if self.pooler_config is not None:
            raise ConfigError("--kv-transfer-config applies to generative models (this one pools)")
        built = build_kv_transfer(self.config, self.loaded, self.runner.kv_caches, self.kv_plan.block_size, transfer)
        self.scheduler.external_kv = ExternalKV(built.connector, self.kv_plan.block_size)
        self.kv_cache_manager.record_cached_blocks()
        return built

    def _classifier_head(self):
        """A ``classify`` model's head (its ``classify`` method: pooled float32 [H] -> logits), or
        None for an embedding model (``kvserve.pooling.pooler``)."""
        return getattr(self.loaded.model, "classify", None) if self.pooler_config.task == "classify" else None

    def _load(self, config: EngineConfig) -> LoadedModel:
        start = time.perf_counter()
        dtype = config.model.dtype
        if dtype == "auto":
            dtype = default_dtype_for_device(config.model.model, self.device, config.model.load_format)
        backend = get_attention_backend(config.model.attention_backend, self.device, config.cache.kv_cache_dtype,
                                        config.cache.block_size)
        plan = self._memory_plan(config, dtype)
        if config.parallel.tensor_parallel_size > 1:
            loaded = self._load_shard(config, backend)
        else:
            loaded = load_model(config.model.model, dtype, self.device, backend, config.model.quantization,
                                pooler=self.pooler_config, hf_overrides=config.model.hf_overrides,
                                tokenizer_dir=config.model.tokenizer, load_format=config.model.load_format)
        logger.info(
            "Loaded %s (%s, %s, weights %s, %s attention%s) on %s in %.2f s", config.model.model,
            loaded.arch.architecture, str(loaded.dtype).removeprefix("torch."), loaded.weight_format, backend.name,
            "" if plan is None else f"; {plan.describe()}", self.device, time.perf_counter() - start,
        )
        return loaded

    def _memory_plan(self, config: EngineConfig, dtype):
        """The model's parameters and weight bytes (``kvserve.model.memory_plan``) for a float
        checkpoint served by this process, checked against the host's free memory first on the
        CPU; None for GGUF files and GPTQ/AWQ checkpoints (their weights load as stored)."""
        from kvserve.checkpoint_quantization import resolve_quantization
        from kvserve.model.gguf_file import find_gguf
        from kvserve.model.loader import load_arch_config, resolve_dtype
        from kvserve.model.memory_plan import check_fits, memory_plan

        model = config.model.model
        if find_gguf(model) is not None or resolve_quantization(model, config.model.quantization).checkpoint is not None:
            return None
        arch = load_arch_config(model, config.model.hf_overrides)
        name = str(resolve_dtype(dtype, arch)).removeprefix("torch.")
        plan = memory_plan(arch, name, config.model.quantization)
        if self.device.type == "cpu" and config.parallel.tensor_parallel_size == 1:
            check_fits(plan, available_host_memory_bytes(), model)
        return plan

    def _load_shard(self, config: EngineConfig, backend) -> LoadedModel:
        """Rank 0's shard; the other ranks start and load theirs (``kvserve.distributed``)."""
        from kvserve.distributed.driver import TensorParallelDriver
        from kvserve.distributed.shard import check_parallel_options
        from kvserve.distributed.loader import shard_dtype

        check_parallel_options(config)
        dtype = shard_dtype(config.model.model, config.model.dtype, self.device)
        self.tensor_parallel = TensorParallelDriver(config.parallel, config.model.model, dtype, self.device, backend,
                                                    config.model.quantization, config.lora)
        return self.tensor_parallel.loaded

    def check_health(self) -> None:
        """Called while idle (about every ``health_check_interval`` seconds): with tensor
        parallelism, every rank is alive and answers.

        Raises:
            EngineDeadError: a rank is gone (the message names it).
        """
        if self.tensor_parallel is not None:
            self.tensor_parallel.check_health()

    @property
    def health_check_interval(self) -> float | None:
        """Seconds between idle ``check_health`` calls; None = nothing to check."""
        if self.tensor_parallel is None:
            return None
        from kvserve.distributed.driver import HEALTH_CHECK_INTERVAL

        return HEALTH_CHECK_INTERVAL

    def shutdown(self) -> None:
        """Stop the tensor-parallel worker ranks, if any, and the KV transfer's threads (writing
        what the disk tier has queued) (idempotent)."""
        if self.tensor_parallel is not None:
            self.tensor_parallel.shutdown()
        transfer, self.kv_transfer = getattr(self, "kv_transfer", None), None
        if transfer is not None:
            transfer.close()

    def _load_draft(self, config: EngineConfig) -> LoadedModel | None:
        """The draft model of ``--speculative-config`` method draft_model (target's dtype,
        device and attention backend), or None. Under tensor parallelism it runs whole on rank 0
        beside the driver's proposer (the other ranks only verify: their target forwards)."""
        spec = config.speculative
        if spec is None or spec.method != "draft_model":
            return None
        from kvserve.spec_decode.draft_model import check_draft_model

        backend = get_attention_backend(config.model.attention_backend, self.device, config.cache.kv_cache_dtype,
                                        config.cache.block_size)
        draft = load_model(spec.model, self.loaded.dtype, self.device, backend)
        check_draft_model(draft, self.loaded.arch.vocab_size, self.max_model_len)
        num_params = sum(p.numel() for p in draft.model.parameters())
        logger.info("Loaded draft model %s (%.1fM parameters, k=%d)", spec.model, num_params / 1e6,
                    spec.num_speculative_tokens)
        return draft

    def _build_proposer(self):
        spec = self.config.speculative
        if spec is None:
            return None
        return build_proposer(spec, max_model_len=self.max_model_len, draft=self.draft,
                              num_blocks=self.kv_plan.num_blocks, block_size=self.kv_plan.block_size,
                              enforce_eager=self.config.model.enforce_eager)

    def _plan_kv_cache(self) -> KVCachePlan:
        cache = self.config.cache
        bytes_per_block = kv_cache_bytes_per_block(self.loaded.arch, cache.block_size, self.loaded.dtype,
                                                   cache.kv_cache_dtype, self.loaded.cached_kv_heads)
        if self.draft is not None:
            from kvserve.spec_decode.draft_model import draft_kv_bytes_per_block

            bytes_per_block += draft_kv_bytes_per_block(self.draft, cache.block_size)
        free_device = None
        if self.device.type == "cuda":
            free_device = self._free_device_bytes()
        return plan_kv_cache(
            cache, bytes_per_block, self.max_model_len, self.config.scheduler.max_num_seqs,
            self.device.type, free_device,
        )

    def _free_device_bytes(self) -> int:
        """The KV cache's share of the GPU: ``--gpu-memory-utilization`` of its memory, less what
        is held now (weights, other processes), the measured peak of the largest step's
        activations (``kvserve.engine.activation_profile``) and a margin for graphs and workspaces.
        No profile when the budget is given (``--kv-cache-memory-bytes``, a block count) or the
        model's forward crosses processes (``-tp``).

        Raises:
            ConfigError: the profiled step does not fit, or fails on the device (named).
        """
        cache, scheduler = self.config.cache, self.config.scheduler
        activations = 0
        if (cache.num_blocks_override is None and cache.kv_cache_memory_bytes is None and self.loaded.shard is None
                and self.pooler_config is None):
            num_tokens = scheduler.max_num_batched_tokens
            spec = self.config.speculative
            num_rows = scheduler.max_num_seqs * (1 + (spec.num_speculative_tokens if spec is not None else 0))
            try:
                activations = peak_activation_bytes(self.loaded, num_tokens, self.max_model_len, num_rows,
                                                    cache.block_size, cache.kv_cache_dtype, self.device)
            except torch.OutOfMemoryError as exc:
                raise ConfigError(f"a step of {num_tokens} tokens does not fit the GPU beside the weights; lower "
                                  "--max-num-batched-tokens or --max-num-seqs") from exc
            except Exception as exc:  # noqa: BLE001 - a GPU-only failure (a kernel that does not compile), named
                raise ConfigError(f"running the model on the GPU failed ({type(exc).__name__}: {exc}); "
                                  "--attention-backend torch runs without Triton") from exc
        free, total = torch.cuda.mem_get_info(self.device)
        budget = int(total * cache.gpu_memory_utilization) - (total - free) - activations - GRAPH_AND_WORKSPACE_BYTES
        logger.info("GPU memory: %.2f GiB total, %.2f GiB held after loading, activations peak at %.2f GiB: "
                    "%.2f GiB for the KV cache (--gpu-memory-utilization %.2f)", total / 2**30, (total - free) / 2**30,
                    activations / 2**30, max(0, budget) / 2**30, cache.gpu_memory_utilization)
        return budget

    @property
    def vocab_size(self) -> int:
        return self.loaded.arch.vocab_size

    @staticmethod
    def has_no_work(request: Request) -> bool:
        """True for a request that neither generates (``max_tokens == 0``), scores its prompt nor
        pools it: it finishes at once, with ``length`` and no token."""
        return (request.max_tokens == 0 and request.sampling_params.prompt_logprobs is None
                and request.spec.pooling_params is None)

    def add_requests(self, call: list[EngineRequest]) -> None:
        """Queue the choices of one call's requests, all or none (``Scheduler.add_requests``
        raises before anything is queued, blaming ``prompt`` or ``n`` when they could never fit
        the queue). A request with no work (:meth:`has_no_work`) is checked the same way but
        never queued."""
        requests = [child for request in call for child in request.make_requests()]
        capacity_param = "prompt" if len(call) > 1 else "n"
        no_work = [r for r in requests if self.has_no_work(r)]
        for request in no_work:
            check_kv_fit(request, self.kv_cache_manager)
        self.scheduler.add_requests([r for r in requests if not self.has_no_work(r)], capacity_param)
        for request in no_work:
            request.status = RequestStatus.FINISHED_LENGTH_CAPPED
            self._finished_on_admission.append(request)

    def finish_requests(self, request_ids: list[str], status: RequestStatus) -> None:
        """Finish requests now (client gone: ``FINISHED_ABORTED``; a stop string found:
        ``FINISHED_STOPPED``; the front end failed on it: ``FINISHED_ERROR``); their blocks are
        freed."""
        if self._finished_on_admission:
            dropped = set(request_ids)
            self._finished_on_admission = [r for r in self._finished_on_admission if r.request_id not in dropped]
        self.scheduler.finish_requests(request_ids, status)

    def has_unfinished_requests(self) -> bool:
        return bool(self._finished_on_admission) or self.scheduler.has_unfinished_requests()

    def _take_finished_on_admission(self) -> list[EngineCoreOutput]:
        finished, self._finished_on_admission = self._finished_on_admission, []
        return [EngineCoreOutput(r.request_id, [], finish_reason=r.status.finish_reason) for r in finished]

    def step(self) -> StepResult:
        """Schedule, execute and update once. Returns the per-request outputs of the step and its
        stats (None when nothing was scheduled). A request whose processing fails finishes with
        ``error``; the others go on.

        Raises:
            EngineDeadError: a failure no single request explains (the scheduler failed, or every
                request of the step failed alone).
        """
        start = time.perf_counter()
        if self._step_to_learn is not None:
            work, began = self._step_to_learn
            self._step_to_learn = None
            self.scheduler.slo.cost_model.observe(work, start - began)
        finished_on_admission = self._take_finished_on_admission()
        try:
            scheduler_output = self.scheduler.schedule()
        except Exception as exc:
            raise EngineDeadError(f"the scheduler failed: {type(exc).__name__}: {exc}") from exc
        if scheduler_output.kv_loads:
            self.kv_transfer.connector.load(scheduler_output.kv_loads)
        try:
            runner_output = self.runner.execute_model(scheduler_output)
        except EngineDeadError as exc:  # said with the local rank whose exit caused it, where one has exited
            exited = None if self.tensor_parallel is None else self.tensor_parallel.exited_rank(wait=1.0)
            if exited is None:
                raise
            raise EngineDeadError(f"{exited}; the engine stops ({exc})") from exc
        if scheduler_output.is_empty:
            return StepResult(finished_on_admission, None, self.kv_cache_manager.take_events())
        if self.proposer is not None and scheduler_output.propose_draft_req_ids:
            propose_drafts(self.proposer, self.runner.input_batch, scheduler_output.propose_draft_req_ids,
                           self.runner.faults, runner_output)
        self._count_failed_steps(scheduler_output, runner_output)
        slo = self.scheduler.slo
        work = slo.step_work(scheduler_output, self.scheduler.requests)  # before the requests advance
        outputs = finished_on_admission + self.scheduler.update_from_output(scheduler_output, runner_output)
        if self.kv_transfer is not None:  # blocks that entered the prefix cache, before the pool reuses them
            self.kv_transfer.connector.save(self.kv_cache_manager.take_cached_blocks())
        duration = time.perf_counter() - start
        if self.has_unfinished_requests():  # the next step follows at once: learn the interval
            self._step_to_learn = (work, start)
        else:
            slo.cost_model.observe(work, duration)
        stats = StepStats(
            timestamp=time.time(),
            duration=duration,
            num_requests=len(scheduler_output.num_scheduled_tokens),
            num_prefill_tokens=work.prefill_tokens,
            num_decode_tokens=scheduler_output.total_num_scheduled_tokens - work.prefill_tokens,
            scheduler=self.scheduler.make_stats(),
        )
        return StepResult(outputs, stats, self.kv_cache_manager.take_events())

    def _count_failed_steps(self, scheduler_output, runner_output) -> None:
        """A step in which every request failed (alone: the runner's groups are bisected) is
        counted; ``MAX_CONSECUTIVE_FAILED_STEPS`` of them in a row mean the failure is not the
        requests' but the engine's (requests that arrive one per step could not show it).

        Raises:
            EngineDeadError: the limit is reached.
        """
        if len(runner_output.errors) < len(scheduler_output.num_scheduled_tokens):
            self._num_failed_steps = 0
            return
        self._num_failed_steps += 1
        if self._num_failed_steps >= MAX_CONSECUTIVE_FAILED_STEPS:
            raise EngineDeadError(f"{self._num_failed_steps} steps in a row failed for every request: "
                                  f"{next(iter(runner_output.errors.values()))}")

    def make_stats(self) -> SchedulerStats:
        return self.scheduler.make_stats()

    def serving_facts(self) -> dict[str, Any]:
        """What a benchmark needs to compute the roofline of a run against this engine
        (``kvserve.bench.roofline``) and ``/version`` reports: the model folder, the dtype it runs
        in, the weights' quantization (``QuantizationConfig.label``), the KV cache dtype, how many
        requests run at once and the device."""
        config = self.config
        return {"model": config.model.model, "dtype": str(self.loaded.dtype).removeprefix("torch."),
                "quantization": config.model.quantization.label, "kv_cache_dtype": config.cache.kv_cache_dtype,
                "max_num_seqs": config.scheduler.max_num_seqs, "device": str(self.device)}

    def lora_registry(self) -> LoRARegistry | None:
        """A new registry of the adapters this engine can run (``--enable-lora``), else None."""
        if self.config.lora is None:
            return None
        from kvserve.lora.registry import LoRARegistry

        return LoRARegistry(self.config.lora, self.loaded.arch)
