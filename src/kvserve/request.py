"""The engine's view of one request (one choice: a request with ``n > 1`` becomes n of these)."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvserve.sampling_params import SamplingParams

if TYPE_CHECKING:
    from kvserve.lora.request import LoRARequest
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
    """A request as the scheduler and KV-cache manager see it.

    A request has only ``num_computed_tokens`` against its known tokens (prompt + output); there is
    no separate prefill or decode state: a step computes tokens ``[num_computed_tokens,
    num_computed_tokens + num_new_tokens)`` and samples one when it reaches ``num_tokens``.

    Attributes:
        request_id: unique id.
        prompt_token_ids: the prompt, token ids.
        sampling_params: how to choose tokens.
        eos_token_ids: ids that end generation unless ``ignore_eos``.
        max_tokens: resolved output cap in tokens (``sampling_params.max_tokens`` or what is left
            of the context).
        arrival_time: seconds (``time.time()``) when the engine received the request.
        priority: lower value = served first under the ``priority`` policy (vLLM's convention).
        cache_salt: extra key for prefix-cache hashes (isolates tenants).
        num_cached_tokens: prompt tokens found in the prefix cache when first scheduled (-1 until).
        first_scheduled_time: seconds (``time.time()``) when the scheduler first admitted the
            request to running (its queue time ends); None until then. Kept across preemption.
        bad_words_token_ids: ``sampling_params.bad_words`` as token-id sequences (filled by the
            input processor, which has the tokenizer; see ``kvserve.sample.bad_words``).
        error: why the request failed (status FINISHED_ERROR), else None.
        grammar: its structured-output constraint, compiled by the input processor (the
            scheduler only carries it to the runner), or None.
        spec_token_ids: draft tokens proposed by the runner after the last step (speculative
            decoding), to be verified in the next step it is scheduled in; never part of
            ``all_token_ids``, dropped on preemption (vLLM's ``Request.spec_token_ids``).
        lora_request: the adapter it runs with, or None for the base model.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: frozenset[int] = frozenset()
    max_tokens: int = 16
    arrival_time: float = field(default_factory=time.time)
    priority: int = 0
    cache_salt: str | None = None
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    all_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = -1
    num_preemptions: int = 0
    first_scheduled_time: float | None = None
    stop_reason: int | str | None = None
    bad_words_token_ids: list[list[int]] = field(default_factory=list)
    error: str | None = None
    grammar: GrammarRequest | None = None
    spec_token_ids: list[int] = field(default_factory=list)
    lora_request: LoRARequest | None = None
    # Hashes of the request's full blocks, filled incrementally by the KV-cache manager.
    block_hashes: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.all_token_ids:
            self.all_token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

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
