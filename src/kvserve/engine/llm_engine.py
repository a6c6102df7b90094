"""``LLMEngine``: the engine core plus its front end (tokenizer, input and output processing),
driven synchronously by the caller. ``LLM`` (offline) and ``AsyncLLM`` (server) are built on it.

    process_inputs(prompt, params)  ─► EngineRequest      (input processor: validation)
    add_requests([EngineRequest])   ─► queued, all or none (scheduler: capacity, KV fit)
    step()                          ─► EngineStep          (delta RequestOutputs + stats)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from kvserve.config import EngineConfig
from kvserve.engine.core import EngineCore, StepStats
from kvserve.engine.engine_request import EngineRequest
from kvserve.engine.input_processor import DEFAULT_FIELDS, FieldNames, InputProcessor, PromptInput
from kvserve.engine.output_processor import OutputProcessor, RequestState
from kvserve.lora.request import LoRARequest
from kvserve.metrics.stats import IterationStats
from kvserve.outputs import RequestOutput
from kvserve.request import RequestStatus
from kvserve.sampling_params import SamplingParams
from kvserve.structured_output.manager import StructuredOutputManager
from kvserve.tokenizer import eos_token_ids, load_tokenizer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineStep:
    """What one ``LLMEngine.step()`` produced.

    Attributes:
        outputs: one delta ``RequestOutput`` per request that changed.
        stats: the core step's stats (None when nothing ran).
        finished: the front-end state of each request that finished in this step (all choices).
        iteration: what the step delivered to clients (TTFTs, inter-token gaps, token counts).
        kv_events: the step's prefix-cache events (``kvserve.kv_cache.events``; empty unless
            ``enable_kv_cache_events``).
    """

    outputs: list[RequestOutput]
    stats: StepStats | None = None
    finished: list[RequestState] = field(default_factory=list)
    iteration: IterationStats = field(default_factory=IterationStats)
    kv_events: list = field(default_factory=list)


def build_input_processor(config: EngineConfig, tokenizer, vocab_size: int, max_model_len: int,
                          build_backend_now: bool = False) -> InputProcessor:
    """The input processor of a model, with its structured-output backend (built in the
    background from now on with ``build_backend_now``, else at the first constrained request)."""
    eos = eos_token_ids(config.model.model, tokenizer)
    return InputProcessor(tokenizer, vocab_size, max_model_len, eos,
                          priority_scheduling=config.scheduler.policy == "priority",
                          lora_enabled=config.lora is not None,
                          structured_outputs=StructuredOutputManager(tokenizer, vocab_size, eos,
                                                                     config.structured_outputs,
                                                                     build_now=build_backend_now))


def serving_facts(engine: LLMEngine) -> dict[str, Any] | None:
    """What a benchmark needs to compute the roofline of a run against this engine
    (``kvserve.bench.roofline``): the model folder, the dtype it runs in, the weights'
    quantization (``QuantizationConfig.label``), the KV cache dtype, how many requests run at
    once and the device (None for an engine without a loaded model)."""
    core = engine.core
    if getattr(core, "loaded", None) is None:
        return None
    return {"model": engine.config.model.model, "dtype": str(core.loaded.dtype).removeprefix("torch."),
            "quantization": engine.config.model.quantization.label,
            "kv_cache_dtype": engine.config.cache.kv_cache_dtype,
            "max_num_seqs": engine.config.scheduler.max_num_seqs, "device": str(core.device)}


class LLMEngine:
    """Args:
    config: engine configuration.
    chat_template: a template (text or file path) overriding the checkpoint's.
    input_processor: the input processor to use (a server builds it before the weights load);
        None builds one (with its structured-output backend) from the model.

    Raises:
        CheckpointError: the model or tokenizer folder cannot be loaded.
        ConfigError: a flag that cannot work (see ``EngineCore``).
    """

    def __init__(self, config: EngineConfig, chat_template: str | None = None,
                 input_processor: InputProcessor | None = None):
        self.core = EngineCore(config)
        self.config = self.core.config
        if input_processor is None:
            try:
                tokenizer = load_tokenizer(config.model.tokenizer or config.model.model, chat_template)
                input_processor = build_input_processor(config, tokenizer, self.core.vocab_size,
                                                        self.core.max_model_len)
            except BaseException:
                self.core.shutdown()
                raise
        self.input_processor = input_processor
        self.tokenizer = input_processor.tokenizer
        self.eos_token_ids = input_processor.eos_token_ids
        self.output_processor = OutputProcessor(self.tokenizer)
        self.lora_registry = None
        if self.config.lora is not None:
            from kvserve.lora.registry import LoRARegistry

            self.lora_registry = LoRARegistry(self.config.lora, self.core.loaded.arch)

    def shutdown(self) -> None:
        """Stop the engine's other processes (tensor-parallel ranks), if any; idempotent."""
        self.core.shutdown()

    @property
    def max_model_len(self) -> int:
        return self.core.max_model_len

    @property
    def vocab_size(self) -> int:
        return self.core.vocab_size

    def process_inputs(self, request_id: str, prompt: PromptInput, params: SamplingParams, *, priority: int = 0,
                       cache_salt: str | None = None, arrival_time: float | None = None,
                       fields: FieldNames = DEFAULT_FIELDS, reasoning: Any = None,
                       lora_request: LoRARequest | None = None) -> EngineRequest:
        """Validate and normalise one prompt's request (``InputProcessor.process``)."""
        return self.input_processor.process(request_id, prompt, params, priority=priority, cache_salt=cache_salt,
                                            arrival_time=arrival_time, fields=fields, reasoning=reasoning,
                                            lora_request=lora_request)

    def add_requests(self, requests: list[EngineRequest]) -> list[RequestState]:
        """Queue the requests of one call as one unit: all of them, or (when it raises) none.

        Raises:
            ValueError: a request id already in use or given twice.
            InvalidRequestError, RequestRejectedError: a request can never fit the KV cache, or
                the waiting queue cannot take them all (``Scheduler.add_requests``).
        """
        ids = [r.request_id for r in requests]
        if len(set(ids)) != len(ids) or any(i in self.output_processor.requests for i in ids):
            raise ValueError(f"request ids must be new and distinct, got {ids}")
        self.core.add_requests([child for request in requests for child in request.make_requests()],
                               capacity_param="prompt" if len(requests) > 1 else "n")
        return [self.output_processor.add_request(request) for request in requests]

    def add_request(self, request_id: str, prompt: PromptInput, params: SamplingParams, **kwargs) -> RequestState:
        """Process and queue one prompt (``process_inputs`` then ``add_requests``)."""
        return self.add_requests([self.process_inputs(request_id, prompt, params, **kwargs)])[0]

    def abort_request(self, request_id: str) -> None:
        """Abort every choice of ``request_id`` (unknown ids are ignored)."""
        self.core.finish_requests(self.output_processor.child_ids(request_id), RequestStatus.FINISHED_ABORTED)
        self.output_processor.remove(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.core.has_unfinished_requests()

    def step(self) -> EngineStep:
        """One engine step: the delta outputs of the requests that changed, and its stats.
        Finished requests are dropped from the front end after their last delta.

        Raises:
            EngineDeadError: a failure no single request explains (``EngineCore.step``).
        """
        result = self.core.step()
        processed = self.output_processor.process_outputs(result.outputs)
        if processed.to_stop:
            self.core.finish_requests(processed.to_stop, RequestStatus.FINISHED_STOPPED)
        if processed.to_fail:
            self.core.finish_requests(processed.to_fail, RequestStatus.FINISHED_ERROR)
        finished = []
        for delta in processed.request_outputs:
            if delta.finished:
                finished.append(self.output_processor.requests[delta.request_id])
                self.output_processor.remove(delta.request_id)
        return EngineStep(processed.request_outputs, result.stats, finished, processed.iteration, result.kv_events)
