"""Turns the engine core's per-step token outputs into per-request delta ``RequestOutput``s:
fans requests with ``n > 1`` out into child requests and back, detokenizes incrementally, and
finds stop strings (asking the core to finish the request, as vLLM's front end does)."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from kvserve.engine.detokenizer import IncrementalDetokenizer
from kvserve.engine.stop_strings import StopStringMatcher
from kvserve.metrics.stats import IterationStats
from kvserve.outputs import CompletionOutput, EngineCoreOutput, RequestOutput, TokenLogprobs
from kvserve.request import Request
from kvserve.sampling_params import SamplingParams


def child_request_id(request_id: str, index: int, n: int) -> str:
    """The engine-core id of choice ``index``; the request's own id when ``n == 1``."""
    return request_id if n == 1 else f"{index}_{request_id}"


def child_sampling_params(params: SamplingParams, index: int) -> SamplingParams:
    """Choice ``index`` of a seeded ``n > 1`` request draws from ``seed + index`` (as vLLM), so the
    choices differ while the request as a whole stays reproducible."""
    child = dataclasses.replace(params, n=1)
    if params.seed is not None and params.n > 1:
        child.seed = params.seed + index
    return child


@dataclass
class ChoiceState:
    """One choice's progress on the front end."""

    index: int
    detokenizer: IncrementalDetokenizer
    stop_matcher: StopStringMatcher | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_output_tokens: int = 0
    times: RequestTimes | None = None  # this choice's own times (set by ``add_request``)


@dataclass
class RequestTimes:
    """Timestamps (``time.time()``, seconds) of one request (or choice) as the front end saw
    them; ``first_scheduled`` comes from the scheduler through ``EngineCoreOutput``."""

    arrival: float
    first_token: float | None = None
    last_token: float | None = None
    finished: float | None = None
    first_scheduled: float | None = None


@dataclass
class RequestState:
    """A request (all its choices) on the front end."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    choices: dict[str, ChoiceState]
    times: RequestTimes
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    num_cached_tokens: int = 0
    sent_first: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return all(c.finish_reason is not None for c in self.choices.values())


class OutputProcessor:
    """Front-end state of every live request.

    Args:
        tokenizer: the model's Hugging Face tokenizer (for detokenization).
    """

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.requests: dict[str, RequestState] = {}
        self._parent_of: dict[str, str] = {}
        # What the latest ``process_outputs`` delivered, for metrics and logs.
        self.last_iteration = IterationStats()

    def add_request(self, request_id: str, prompt: str | None, requests: list[Request]) -> RequestState:
        """Register the child ``requests`` (one per choice, in index order) of ``request_id``."""
        params = requests[0].sampling_params
        choices = {}
        for index, child in enumerate(requests):
            matcher = None
            if child.sampling_params.stop:
                matcher = StopStringMatcher(child.sampling_params.stop, child.sampling_params.include_stop_str_in_output)
            detok = IncrementalDetokenizer(self.tokenizer, child.prompt_token_ids, child.sampling_params.skip_special_tokens)
            choices[child.request_id] = ChoiceState(index, detok, matcher, times=RequestTimes(child.arrival_time))
            self._parent_of[child.request_id] = request_id
        first = requests[0]
        state = RequestState(
            request_id, prompt, first.prompt_token_ids, params, choices, RequestTimes(first.arrival_time)
        )
        if params.prompt_logprobs is not None:
            state.prompt_logprobs = [None]
        self.requests[request_id] = state
        return state

    def child_ids(self, request_id: str) -> list[str]:
        state = self.requests.get(request_id)
        return list(state.choices) if state else []

    def remove(self, request_id: str) -> None:
        state = self.requests.pop(request_id, None)
        if state:
            for child_id in state.choices:
                self._parent_of.pop(child_id, None)

    def process_outputs(self, outputs: list[EngineCoreOutput]) -> tuple[list[RequestOutput], list[str]]:
        """Apply one step's outputs.

        Returns:
            (delta outputs, one per request that changed; child ids that hit a stop string and
            must be finished in the engine core).
        """
        now = time.time()
        deltas: dict[str, RequestOutput] = {}
        to_stop: list[str] = []
        self.last_iteration = iteration = IterationStats()
        for out in outputs:
            parent_id = self._parent_of.get(out.request_id)
            if parent_id is None:
                continue  # aborted on the front end already
            state = self.requests[parent_id]
            choice = state.choices[out.request_id]
            if choice.finish_reason is not None:
                continue
            completion = self._process_choice(state, choice, out, to_stop)
            _record_choice_times(choice, out, len(state.prompt_token_ids), now, iteration)
            delta = deltas.get(parent_id)
            if delta is None:
                delta = deltas[parent_id] = self._new_delta(state, out)
            if completion is not None:
                delta.outputs.append(completion)
        for parent_id, delta in deltas.items():
            state = self.requests[parent_id]
            delta.finished = state.finished
            if delta.finished:
                state.times.finished = now
        return list(deltas.values()), to_stop

    def _new_delta(self, state: RequestState, out: EngineCoreOutput) -> RequestOutput:
        state.num_cached_tokens = max(state.num_cached_tokens, out.num_cached_tokens)
        prompt_logprobs = None
        if out.prompt_logprobs and state.prompt_logprobs is not None:
            state.prompt_logprobs.extend(out.prompt_logprobs)
        if not state.sent_first and (state.prompt_logprobs is None or len(state.prompt_logprobs) >= len(state.prompt_token_ids)):
            prompt_logprobs = state.prompt_logprobs
            state.sent_first = True
        return RequestOutput(
            request_id=state.request_id, prompt=state.prompt, prompt_token_ids=state.prompt_token_ids,
            prompt_logprobs=prompt_logprobs, outputs=[], finished=False, num_cached_tokens=state.num_cached_tokens,
        )

    def _process_choice(
        self, state: RequestState, choice: ChoiceState, out: EngineCoreOutput, to_stop: list[str]
    ) -> CompletionOutput | None:
        if not out.new_token_ids and not out.finished:
            return None
        choice.num_output_tokens += len(out.new_token_ids)
        text = choice.detokenizer.add_tokens(out.new_token_ids)
        finish_reason, stop_reason = out.finish_reason, out.stop_reason
        if finish_reason is not None:
            text += choice.detokenizer.flush()
        if choice.stop_matcher is not None:
            match = choice.stop_matcher.add(text)
            text = match.text
            if match.stop is not None:
                finish_reason, stop_reason = "stop", match.stop
                if out.finish_reason is None:
                    to_stop.append(out.request_id)
            elif finish_reason is not None:
                text += choice.stop_matcher.flush().text
        choice.finish_reason, choice.stop_reason = finish_reason, stop_reason
        return CompletionOutput(
            index=choice.index, text=text, token_ids=list(out.new_token_ids),
            logprobs=list(out.new_logprobs) if state.params.logprobs is not None else None,
            finish_reason=finish_reason, stop_reason=stop_reason,
        )


def _record_choice_times(
    choice: ChoiceState, out: EngineCoreOutput, num_prompt_tokens: int, now: float, iteration: IterationStats
) -> None:
    """Update the choice's times and this step's TTFT / inter-token gaps / token counts."""
    times = choice.times
    times.first_scheduled = times.first_scheduled or out.first_scheduled_time
    if out.new_token_ids:
        if times.first_token is None:
            times.first_token = now
            iteration.num_prompt_tokens += num_prompt_tokens
            iteration.time_to_first_tokens.append(now - times.arrival)
        else:
            iteration.inter_token_latencies.append(now - times.last_token)
        times.last_token = now
        iteration.num_generation_tokens += len(out.new_token_ids)
    if choice.finish_reason is not None and times.finished is None:
        times.finished = now
