"""``LLMEngine``: the engine core plus its front end (tokenizer, input and output processing),
driven synchronously by the caller. ``LLM`` (offline) and ``AsyncLLM`` (server) are built on it."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from kvserve.config import EngineConfig
from kvserve.engine.core import EngineCore, StepStats
from kvserve.engine.input_processor import InputProcessor
from kvserve.engine.output_processor import OutputProcessor, RequestState
from kvserve.outputs import RequestOutput
from kvserve.request import RequestStatus
from kvserve.sampling_params import SamplingParams
from kvserve.tokenizer import eos_token_ids, load_tokenizer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerateRequest:
    """One user request (all its ``sampling_params.n`` choices) handed to the engine.

    Attributes:
        request_id: unique id.
        prompt_token_ids: the prompt, token ids.
        sampling_params: how to sample.
        prompt: the prompt text (for ``RequestOutput.prompt``), or None.
        priority, cache_salt: scheduling priority; prefix-cache salt.
        arrival_time: ``time.time()`` when the caller received the request (None: now).
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    prompt: str | None = None
    priority: int = 0
    cache_salt: str | None = None
    arrival_time: float | None = None


class LLMEngine:
    """Args:
    config: engine configuration.
    chat_template: a template (text or file path) overriding the checkpoint's.

    Raises:
        CheckpointError: the model or tokenizer folder cannot be loaded.
    """

    def __init__(self, config: EngineConfig, chat_template: str | None = None):
        self.core = EngineCore(config)
        self.config = self.core.config
        tokenizer_dir = config.model.tokenizer or config.model.model
        self.tokenizer = load_tokenizer(tokenizer_dir, chat_template)
        self.eos_token_ids = eos_token_ids(config.model.model, self.tokenizer)
        self.input_processor = InputProcessor(
            self.tokenizer, self.core.vocab_size, self.core.max_model_len, self.eos_token_ids,
            priority_scheduling=config.scheduler.policy == "priority",
        )
        self.output_processor = OutputProcessor(self.tokenizer)
        self.last_step_stats: StepStats | None = None
        self.last_finished: list[RequestState] = []

    @property
    def max_model_len(self) -> int:
        return self.core.max_model_len

    @property
    def vocab_size(self) -> int:
        return self.core.vocab_size

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        prompt: str | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        arrival_time: float | None = None,
    ) -> RequestState:
        """Validate and queue a request (all its choices); nothing is queued when it raises.

        Raises:
            InvalidRequestError, RequestRejectedError: see ``InputProcessor.make_requests``,
                ``EngineCore.check_capacity`` and ``Scheduler.add_request``.
        """
        item = GenerateRequest(request_id, prompt_token_ids, params, prompt, priority, cache_salt, arrival_time)
        return self.add_requests([item])[0]

    def add_requests(self, items: list[GenerateRequest]) -> list[RequestState]:
        """Validate and queue several requests as one unit (the prompts of one API call): every
        prompt is validated and the waiting queue is checked for all their choices before the
        first is queued, so either all are queued or none is.

        Raises:
            ValueError: a request id already in use (or given twice).
            InvalidRequestError, RequestRejectedError: as :meth:`add_request`, for any item.
        """
        ids = [item.request_id for item in items]
        if len(set(ids)) != len(ids):
            raise ValueError(f"request ids repeat within one call: {ids}")
        for request_id in ids:
            if request_id in self.output_processor.requests:
                raise ValueError(f"request id {request_id!r} is already in use")
        groups = [
            self.input_processor.make_requests(
                item.request_id, item.prompt_token_ids, item.sampling_params, priority=item.priority,
                cache_salt=item.cache_salt, arrival_time=item.arrival_time,
            )
            for item in items
        ]
        self.core.check_capacity([r for group in groups for r in group], param="prompt" if len(items) > 1 else "n")
        added = []
        try:
            for group in groups:
                for request in group:
                    self.core.add_request(request)
                    added.append(request.request_id)
        except Exception:
            self.core.abort_requests(added)
            raise
        return [self.output_processor.add_request(item.request_id, item.prompt, group)
                for item, group in zip(items, groups)]

    def abort_request(self, request_id: str) -> None:
        """Abort every choice of ``request_id`` (unknown ids are ignored)."""
        self.core.abort_requests(self.output_processor.child_ids(request_id))
        self.output_processor.remove(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.core.has_unfinished_requests()

    def step(self) -> list[RequestOutput]:
        """One engine step; returns the delta outputs of the requests that changed. Finished
        requests are dropped from the front end after their last delta."""
        result = self.core.step()
        self.last_step_stats = result.stats
        deltas, to_stop = self.output_processor.process_outputs(result.outputs)
        if to_stop:
            self.core.abort_requests(to_stop, RequestStatus.FINISHED_STOPPED)
        self.last_finished = []
        for delta in deltas:
            if delta.finished:
                self.last_finished.append(self.output_processor.requests[delta.request_id])
                self.output_processor.remove(delta.request_id)
        return deltas

    def describe(self) -> dict[str, Any]:
        return self.core.describe()
