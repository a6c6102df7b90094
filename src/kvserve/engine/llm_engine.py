"""``LLMEngine``: the offline ``LLM``'s synchronous driver over the engine's pieces (the server's
``AsyncLLM`` drives the same pieces from its engine thread):

    process_inputs(prompt, params)  ─► EngineRequest      (InputProcessor: every request check)
    add_requests([EngineRequest])   ─► queued, all or none (EngineCore: capacity, KV fit)
    step()                          ─► EngineStep          (EngineCore.step, OutputProcessor)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from kvserve.config import EngineConfig
from kvserve.engine.core import EngineCore, StepStats
from kvserve.engine.engine_request import EngineRequest
from kvserve.engine.input_processor import InputProcessor, build_input_processor
from kvserve.engine.output_processor import OutputProcessor, RequestState
from kvserve.metrics.stats import IterationStats
from kvserve.outputs import RequestOutput
from kvserve.request import RequestStatus
from kvserve.tokenizer import load_tokenizer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineStep:
    """What one ``LLMEngine.step()`` produced.

    Attributes:
        outputs: one delta ``RequestOutput`` per request that changed.
        stats: the core step's stats (None when nothing ran).
        finished: the front-end state of each request that finished in this step (all choices).
        iteration: what the step delivered to clients (TTFTs, inter-token gaps, token counts).
    """

    outputs: list[RequestOutput]
    stats: StepStats | None = None
    finished: list[RequestState] = field(default_factory=list)
    iteration: IterationStats = field(default_factory=IterationStats)


def build_engine(config: EngineConfig, chat_template: str | None = None) -> tuple[EngineCore, InputProcessor]:
    """The engine core (the model loaded) and its input processor (the tokenizer, with
    ``chat_template`` overriding the checkpoint's); the core is shut down if the rest fails.

    Raises:
        CheckpointError: the model or tokenizer folder cannot be loaded.
        ConfigError: a flag that cannot work (see ``EngineCore``).
    """
    core = EngineCore(config)
    try:
        tokenizer = load_tokenizer(config.model.tokenizer or config.model.model, chat_template)
        return core, build_input_processor(config, tokenizer, core.vocab_size, core.max_model_len)
    except BaseException:
        core.shutdown()
        raise


class LLMEngine:
    """Args:
    config: engine configuration.
    chat_template: a template (text or file path) overriding the checkpoint's.

    Raises:
        CheckpointError: the model or tokenizer folder cannot be loaded.
        ConfigError: a flag that cannot work (see ``EngineCore``).
    """

    def __init__(self, config: EngineConfig, chat_template: str | None = None):
        self.core, self.input_processor = build_engine(config, chat_template)
        self.config = self.core.config
        self.max_model_len, self.vocab_size = self.core.max_model_len, self.core.vocab_size
        self.tokenizer = self.input_processor.tokenizer
        self.eos_token_ids = self.input_processor.eos_token_ids
        self.process_inputs = self.input_processor.process  # validate and normalise one prompt's request
        self.output_processor = OutputProcessor(self.tokenizer)
        self.lora_registry = self.core.lora_registry()

    def shutdown(self) -> None:
        """Stop the engine's other processes (tensor-parallel ranks), if any; idempotent."""
        self.core.shutdown()

    def add_requests(self, requests: list[EngineRequest]) -> list[RequestState]:
        """Queue the requests of one call as one unit: all of them, or (when it raises) none.

        Raises:
            ValueError: a request id already in use or given twice.
            InvalidRequestError, RequestRejectedError: a request can never fit the KV cache, or
                the waiting queue cannot take them all (``Scheduler.add_requests``).
        """
        self.output_processor.check_new(requests)
        self.core.add_requests(requests)
        return [self.output_processor.add_request(request) for request in requests]

    def add_request(self, request_id: str, prompt: Any, params: Any, **kwargs: Any) -> RequestState:
        """Process and queue one prompt (``process_inputs`` then ``add_requests``)."""
        return self.add_requests([self.process_inputs(request_id, prompt, params, **kwargs)])[0]

    def abort_request(self, request_id: str) -> None:
        """Abort every choice of ``request_id`` (unknown ids are ignored)."""
        self.core.finish_requests(self.output_processor.remove(request_id), RequestStatus.FINISHED_ABORTED)

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
        processed.finish_in(self.core)
        return EngineStep(processed.request_outputs, result.stats, processed.finished, processed.iteration)
