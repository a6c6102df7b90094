"""Turns the engine core's per-step token outputs into per-request delta ``RequestOutput``s:
merges the choices of ``n > 1`` requests, detokenizes incrementally, and finds stop strings
(asking the core to finish the request, as vLLM's front end does). A choice whose
detokenization fails finishes with ``error`` alone (the core is asked to finish it too).

It is the one loop over a step's outputs: each request's delta goes to its sink (the server's
``RequestStream``) in the same pass, and a finished request is dropped after its last delta.
A pooling request (``EngineRequest.pooling_params``) has no text: its one output is a
``PoolingRequestOutput`` carrying the vector, when it finishes.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from kvserve.engine.detokenizer import IncrementalDetokenizer
from kvserve.engine.engine_request import EngineRequest
from kvserve.engine.stop_strings import StopStringMatcher
from kvserve.faults import FaultInjector
from kvserve.metrics.stats import IterationStats
from kvserve.outputs import (CompletionOutput, EngineCoreOutput, PoolingOutput, PoolingRequestOutput, RequestOutput,
                             TokenLogprobs)
from kvserve.request import RequestStatus
from kvserve.sampling_params import SamplingParams
from kvserve.slo.targets import SLOTarget

logger = logging.getLogger(__name__)


class ProcessedOutputs(NamedTuple):
    """One step through the front end.

    Attributes:
        request_outputs: one delta per request that changed.
        to_stop: child ids that hit a stop string: the core must finish them (``stop``).
        to_fail: child ids whose front-end processing failed: the core must finish them (``error``).
        iteration: what the step delivered to clients (metrics).
        finished: the state of each request that finished in this step (all its choices); they
            are no longer in ``OutputProcessor.requests``.
    """

    request_outputs: list[RequestOutput]
    to_stop: list[str]
    to_fail: list[str]
    iteration: IterationStats
    finished: list[RequestState]

    def finish_in(self, core: Any) -> None:
        """Ask the engine core to finish what the front end stopped or failed."""
        if self.to_stop:
            core.finish_requests(self.to_stop, RequestStatus.FINISHED_STOPPED)
        if self.to_fail:
            core.finish_requests(self.to_fail, RequestStatus.FINISHED_ERROR)


@dataclass
class ChoiceState:
    """One choice's progress on the front end."""

    index: int
    detokenizer: IncrementalDetokenizer | None  # None for a pooling request (no text)
    stop_matcher: StopStringMatcher | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_output_tokens: int = 0
    times: RequestTimes | None = None  # this choice's own times (set by ``add_request``)
    num_preemptions: int = 0  # times the engine preempted it (known when it finished)
    slo_missed: bool | None = None  # a finished choice of a request with latency targets: missed them

    def latencies(self) -> tuple[float, float]:
        """(TTFT, TPOT) of a finished choice in seconds, as the metrics define them (TPOT = decode
        time / (tokens - 1), 0 with fewer than 2 tokens)."""
        times = self.times
        first = times.first_token or times.finished
        tpot = (times.finished - first) / (self.num_output_tokens - 1) if self.num_output_tokens > 1 else 0.0
        return first - times.arrival, tpot


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
    error: str | None = None
    client_error: bool = False  # the error is the request's own fault (HTTP 400)
    lora_name: str | None = None  # the adapter it runs with (metrics and logs), None: the base model
    sink: Callable[[RequestOutput | PoolingRequestOutput], None] | None = None  # where its deltas go
    pooling: bool = False  # a pooling request: its output is a PoolingRequestOutput
    slo: SLOTarget | None = None  # its latency targets (usage's slo_missed, the SLO metrics)

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
        self.faults = FaultInjector()

    def check_new(self, requests: list[EngineRequest]) -> None:
        """Raises ValueError: a request id already in use or given twice."""
        ids = [r.request_id for r in requests]
        if len(set(ids)) != len(ids) or any(i in self.requests for i in ids):
            raise ValueError(f"request ids must be new and distinct, got {ids}")

    def add_request(self, request: EngineRequest, sink: Callable[[RequestOutput], None] | None = None
                    ) -> RequestState:
        """Register ``request`` and its choices (``request.child_ids``, in index order); its
        deltas go to ``sink`` as well as into ``process_outputs``' result."""
        params = request.sampling_params
        pooling = request.pooling_params is not None
        choices = {}
        for index, child_id in enumerate(request.child_ids):
            matcher = StopStringMatcher(params.stop, params.include_stop_str_in_output) if params.stop else None
            detok = None if pooling else IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids,
                                                                 params.skip_special_tokens)
            choices[child_id] = ChoiceState(index, detok, matcher, times=RequestTimes(request.arrival_time))
            self._parent_of[child_id] = request.request_id
        state = RequestState(request.request_id, request.prompt, request.prompt_token_ids, params, choices,
                             RequestTimes(request.arrival_time), sink=sink, pooling=pooling)
        if request.lora_request is not None:
            state.lora_name = request.lora_request.lora_name
        state.slo = request.slo
        if params.prompt_logprobs is not None:
            state.prompt_logprobs = [None]
        self.requests[request.request_id] = state
        return state

    def remove(self, request_id: str) -> list[str]:
        """Forget ``request_id``; returns its choices' ids (the core's), [] if unknown."""
        state = self.requests.pop(request_id, None)
        if state is None:
            return []
        for child_id in state.choices:
            self._parent_of.pop(child_id, None)
        return list(state.choices)

    def process_outputs(self, outputs: list[EngineCoreOutput]) -> ProcessedOutputs:
        """Apply one step's outputs (see :class:`ProcessedOutputs`)."""
        now = time.time()
        deltas: dict[str, RequestOutput | PoolingRequestOutput] = {}
        to_stop: list[str] = []
        to_fail: list[str] = []
        iteration = IterationStats()
        for out in outputs:
            parent_id = self._parent_of.get(out.request_id)
            if parent_id is None:
                continue  # aborted on the front end already
            state = self.requests[parent_id]
            choice = state.choices[out.request_id]
            if choice.finish_reason is not None:
                continue
            if state.pooling:
                deltas[parent_id] = self._pooling_output(state, choice, out, now, iteration)
                continue
            try:
                self.faults.check("detokenize", [out.request_id])
                completion = self._process_choice(state, choice, out, to_stop)
            except Exception as exc:  # noqa: BLE001 - this choice's failure, not the step's
                logger.exception("detokenizing request %s failed; the others go on", out.request_id)
                completion = self._fail_choice(state, choice, f"{type(exc).__name__}: {exc}")
                if out.finish_reason is None:
                    to_fail.append(out.request_id)
            if state.lora_name is None:
                _record_choice_times(choice, out, len(state.prompt_token_ids), now, iteration)
            else:
                before = (iteration.num_prompt_tokens, iteration.num_generation_tokens)
                _record_choice_times(choice, out, len(state.prompt_token_ids), now, iteration)
                iteration.add_lora_tokens(state.lora_name, iteration.num_prompt_tokens - before[0],
                                          iteration.num_generation_tokens - before[1])
            if completion is not None and completion.finish_reason is not None and state.slo is not None:
                choice.slo_missed = completion.slo_missed = not state.slo.met(*choice.latencies())
            delta = deltas.get(parent_id)
            if delta is None:
                delta = deltas[parent_id] = self._new_delta(state, out)
            if completion is not None:
                delta.outputs.append(completion)
        finished = []
        for parent_id, delta in deltas.items():
            state = self.requests[parent_id]
            delta.finished = state.finished
            delta.error, delta.client_error = state.error, state.client_error
            if state.sink is not None:
                state.sink(delta)
            if delta.finished:
                state.times.finished = now
                finished.append(state)
                self.remove(parent_id)
        return ProcessedOutputs(list(deltas.values()), to_stop, to_fail, iteration, finished)

    @staticmethod
    def _pooling_output(state: RequestState, choice: ChoiceState, out: EngineCoreOutput, now: float,
                        iteration: IterationStats) -> PoolingRequestOutput:
        """A pooling request's output: its vector when it finished, or why it failed (a finished
        request without a vector is a failure too)."""
        choice.finish_reason = out.finish_reason
        choice.times.first_scheduled = choice.times.first_scheduled or out.first_scheduled_time
        error = out.error
        if error is None and out.finished and out.pooling_output is None:
            error = "the request finished without a pooled output"
        if error is not None and state.error is None:
            state.error, state.client_error = error, out.client_error
        if out.finished:
            choice.times.finished = now
            iteration.num_prompt_tokens += len(state.prompt_token_ids)
        outputs = None if error is not None or out.pooling_output is None else PoolingOutput(out.pooling_output)
        return PoolingRequestOutput(state.request_id, outputs, state.prompt_token_ids, out.num_cached_tokens,
                                    finished=False, prompt=state.prompt)

    @staticmethod
    def _fail_choice(state: RequestState, choice: ChoiceState, error: str,
                     client_error: bool = False) -> CompletionOutput:
        choice.finish_reason, choice.stop_reason = "error", None
        if state.error is None:
            state.error, state.client_error = error, client_error
        return CompletionOutput(index=choice.index, text="", token_ids=[], finish_reason="error")

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
        if out.error is not None:
            return self._fail_choice(state, choice, out.error, out.client_error)
        if not out.new_token_ids and not out.finished:
            return None
        if choice.stop_matcher is not None and len(out.new_token_ids) > 1:
            return self._process_tokens_one_by_one(state, choice, out, to_stop)
        unchecked, checked = self._new_text(state.params, choice, out)
        finish_reason, stop_reason = out.finish_reason, out.stop_reason
        if choice.stop_matcher is None:
            text = unchecked + checked
        else:
            text = choice.stop_matcher.add(unchecked, check=False).text
            match = choice.stop_matcher.add(checked)
            text += match.text
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

    def _process_tokens_one_by_one(self, state: RequestState, choice: ChoiceState, out: EngineCoreOutput,
                                   to_stop: list[str]) -> CompletionOutput:
        """Several tokens in one step (speculative decoding) with stop strings: each token is
        checked on its own, so the output ends at the token that completes a stop string, as it
        would have without speculation (the engine's later tokens are dropped)."""
        merged: CompletionOutput | None = None
        last = len(out.new_token_ids) - 1
        for i, token_id in enumerate(out.new_token_ids):
            piece = dataclasses.replace(
                out, new_token_ids=[token_id], new_logprobs=out.new_logprobs[i : i + 1],
                finish_reason=out.finish_reason if i == last else None,
                stop_reason=out.stop_reason if i == last else None)
            completion = self._process_choice(state, choice, piece, to_stop)
            if merged is None:
                merged = completion
            else:
                merged.text += completion.text
                merged.token_ids += completion.token_ids
                if merged.logprobs is not None:
                    merged.logprobs += completion.logprobs or []
                merged.finish_reason, merged.stop_reason = completion.finish_reason, completion.stop_reason
            if completion.finish_reason is not None:
                break
        return merged

    @staticmethod
    def _new_text(params: SamplingParams, choice: ChoiceState, out: EngineCoreOutput) -> tuple[str, str]:
        """Detokenize the step's new tokens as vLLM v1 does; return (text of tokens up to
        ``min_tokens``, text of the later ones): only the latter may complete a stop string.

        A request the core finished with ``stop`` (EOS or a ``stop_token_ids`` id) ends in that
        token; its text is left out unless ``include_stop_str_in_output`` (whatever
        ``skip_special_tokens`` says). Its id stays in ``token_ids`` and its logprob in
        ``logprobs`` (vLLM's ``BaseIncrementalDetokenizer.update``)."""
        token_ids = out.new_token_ids
        before = choice.num_output_tokens
        choice.num_output_tokens += len(token_ids)
        if out.finish_reason == "stop" and token_ids and not params.include_stop_str_in_output:
            token_ids = token_ids[:-1]
        num_unchecked = min(len(token_ids), max(0, params.min_tokens - before))
        detokenizer = choice.detokenizer
        unchecked = detokenizer.add_tokens(token_ids[:num_unchecked]) if num_unchecked else ""
        checked = detokenizer.add_tokens(token_ids[num_unchecked:]) if len(token_ids) > num_unchecked else ""
        if out.finish_reason is not None:
            if choice.num_output_tokens > params.min_tokens:
                checked += detokenizer.flush()
            else:
                unchecked += detokenizer.flush()
        return unchecked, checked


def _record_choice_times(
    choice: ChoiceState, out: EngineCoreOutput, num_prompt_tokens: int, now: float, iteration: IterationStats
) -> None:
    """Update the choice's times and this step's TTFT / inter-token gaps / token counts."""
    times = choice.times
    times.first_scheduled = times.first_scheduled or out.first_scheduled_time
    choice.num_preemptions = max(choice.num_preemptions, out.num_preemptions)
    if out.new_token_ids:
        if times.first_token is None:
            times.first_token = now
            iteration.num_prompt_tokens += num_prompt_tokens
            iteration.num_cached_prompt_tokens += min(out.num_cached_tokens, num_prompt_tokens)
            iteration.num_external_prompt_tokens += min(out.num_external_tokens, num_prompt_tokens)
            iteration.time_to_first_tokens.append(now - times.arrival)
        else:
            iteration.inter_token_latencies.append(now - times.last_token)
        times.last_token = now
        iteration.num_generation_tokens += len(out.new_token_ids)
    if choice.finish_reason is not None and times.finished is None:
        times.finished = now
