"""The engine's view of one request (one choice: a request with ``n > 1`` becomes n of these)."""

from __future__ import annotations

import dataclasses
import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvserve.sampling_params import SamplingParams
from kvserve.slo.targets import UNTARGETED_AFTER_S

if TYPE_CHECKING:
    from kvserve.engine.engine_request import EngineRequest
    from kvserve.lora.request import LoRARequest
    from kvserve.slo.scheduling import RequestSLO
    from kvserve.structured_output.grammar_request import GrammarRequest


class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    # Everything after this point is finished.
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()
    FINISHED_ERROR = enum.auto()

    @property
    def is_finished(self) -> bool:
        return self > RequestStatus.PREEMPTED

    @property
    def finish_reason(self) -> str | None:
        """OpenAI's ``finish_reason`` for a finished status."""
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_IGNORED: "length",
    # Processing this request failed (an exception attributed to it); the others went on. The API
    # answers 500 (or an in-band error event) naming the request id, as vLLM's "error".
    RequestStatus.FINISHED_ERROR: "error",
}


@dataclass(eq=False)
class Request:
    """A request as the scheduler and KV-cache manager see it: the input processor's frozen
    ``spec`` of one choice (referenced, never copied: prompt, sampling parameters, EOS, bad words,
    grammar, adapter, priority, salt, arrival) and the state scheduling changes.

    A request has only ``num_computed_tokens`` against its known tokens (prompt + output); there is
    no separate prefill or decode state: a step computes tokens ``[num_computed_tokens,
    num_computed_tokens + num_new_tokens)`` and samples one when it reaches ``num_tokens``.

    Attributes:
        spec: what the input processor made of this choice (``EngineRequest``; a choice of an
            ``n > 1`` request has its own id and seed, see ``EngineRequest.choices``).
        num_cached_tokens: prompt tokens found in the prefix cache when first scheduled (-1 until),
            including those the KV connector loaded (``num_external_tokens`` of them).
        first_scheduled_time: seconds (``time.time()``) when the scheduler first admitted the
            request to running (its queue time ends); None until then. Kept across preemption.
        error: why the request failed (status FINISHED_ERROR), else None.
        spec_token_ids: draft tokens proposed by the runner after the last step (speculative
            decoding), to be verified in the next step it is scheduled in; never part of
            ``all_token_ids``, dropped on preemption (vLLM's ``Request.spec_token_ids``).
        block_hashes: hashes of its full blocks, filled incrementally by the KV-cache manager.
        slo_state: the scheduling state of a request with latency targets (``spec.slo``; set at
            admission by ``kvserve.slo.scheduling``), else None.
    """

    spec: EngineRequest
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    all_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = -1
    num_external_tokens: int = 0
    num_preemptions: int = 0
    first_scheduled_time: float | None = None
    stop_reason: int | str | None = None
    error: str | None = None
    spec_token_ids: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)
    slo_state: RequestSLO | None = None

    def __post_init__(self) -> None:
        if not self.all_token_ids:
            self.all_token_ids = list(self.spec.prompt_token_ids)

    @classmethod
    def of(cls, request_id: str, prompt_token_ids: list[int], sampling_params: SamplingParams, *,
           eos_token_ids: frozenset[int] = frozenset(), max_tokens: int = 16, arrival_time: float | None = None,
           priority: int = 0, cache_salt: str | None = None, bad_words_token_ids: list[list[int]] = (),
           grammar: GrammarRequest | None = None, lora_request: LoRARequest | None = None) -> Request:
        """A request from its values, its spec built here (tests, benchmarks and the offline
        ``generate`` driver; the engine's come from ``EngineRequest.make_requests``)."""
        from kvserve.engine.engine_request import EngineRequest

        spec = EngineRequest(request_id, None, list(prompt_token_ids),
                             dataclasses.replace(sampling_params, max_tokens=max_tokens), frozenset(eos_token_ids),
                             [list(b) for b in bad_words_token_ids], priority, cache_salt,
                             time.time() if arrival_time is None else arrival_time, grammar, lora_request)
        return cls(spec)

    # The spec's values, read-only.
    request_id = property(lambda self: self.spec.request_id)
    prompt_token_ids = property(lambda self: self.spec.prompt_token_ids)
    sampling_params = property(lambda self: self.spec.sampling_params)
    eos_token_ids = property(lambda self: self.spec.eos_token_ids)
    max_tokens = property(lambda self: self.spec.max_tokens)
    arrival_time = property(lambda self: self.spec.arrival_time)
    priority = property(lambda self: self.spec.priority)
    cache_salt = property(lambda self: self.spec.cache_salt)
    bad_words_token_ids = property(lambda self: self.spec.bad_words_token_ids)
    grammar = property(lambda self: self.spec.grammar)
    lora_request = property(lambda self: self.spec.lora_request)

    @property
    def queue_key(self) -> float:
        """When its prompt should start (``time.time()`` seconds), the waiting queues' order: a
        TTFT target's start-by time, else ``arrival_time + UNTARGETED_AFTER_S``
        (``kvserve.slo.scheduling``)."""
        if self.slo_state is not None and self.slo_state.start_by is not None:
            return self.slo_state.start_by
        return self.spec.arrival_time + UNTARGETED_AFTER_S

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.spec.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def append_output_token_ids(self, token_ids: list[int]) -> None:
        self.output_token_ids.extend(token_ids)
        self.all_token_ids.extend(token_ids)
