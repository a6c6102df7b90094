"""``POST /v1/completions``: prompts in, text choices out (streamed as SSE or aggregated).

Each prompt is one engine request with ``n`` choices; the response numbers choices
``prompt_index * n + choice_index``, as the OpenAI API does for a list of prompts. All prompts
of a call are admitted together (``AsyncLLM.add_requests``): a list too long for the waiting queue is
refused whole (429, or 400 when it could never fit), with nothing queued.

``echo`` with ``max_tokens=0`` scores the prompt without generating (lm-eval-harness's
``loglikelihood``): the text is the prompt, ``logprobs`` (if set) cover its tokens,
``finish_reason`` is ``length`` and ``completion_tokens`` 0.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator

from fastapi import Request
from starlette.responses import Response

from kvserve.api.logprobs import (CompletionLogprobsBuilder, merge_completion_logprobs,
                                  prompt_logprobs_json)
from kvserve.api.protocol import CompletionRequest
from kvserve.api.responses import (CompletionChoice, CompletionLogProbs, CompletionResponse,
                                   CompletionStreamResponse, UsageInfo)
from kvserve.api.serving_base import GenerationCall, ServingState, make_usage, new_request_id, answer, start_call
from kvserve.engine.engine_request import EngineRequest
from kvserve.engine.request_stream import RequestStream
from kvserve.outputs import CompletionOutput, RequestOutput


@dataclasses.dataclass
class _Choice:
    """Per-choice streaming state (and the aggregate for non-streamed responses)."""

    index: int
    logprobs: CompletionLogprobsBuilder | None
    text: str = ""
    num_tokens: int = 0
    logprob_parts: list[CompletionLogProbs] = dataclasses.field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    echoed: bool = False
    token_ids: list[int] = dataclasses.field(default_factory=list)  # with return_token_ids
    sent_prompt_ids: bool = False


def _prompt_inputs(request: CompletionRequest) -> list[str | list[int]]:
    """The call's prompts: one string, strings, one list of token ids, or lists of them."""
    raw = request.prompt
    if isinstance(raw, str) or not raw or isinstance(raw[0], int):
        return [raw]  # [] is one empty prompt: the input processor refuses it
    return list(raw)


class CompletionServing:
    """Handles ``/v1/completions`` against the engine in ``state``."""

    def __init__(self, state: ServingState):
        self.state = state

    async def create(self, request: CompletionRequest, raw_request: Request, api_key: str) -> Response:
        """Check, validate (the engine's input processor, on a worker thread), admit, start the
        engine requests, and answer (JSON or SSE).

        Raises:
            InvalidRequestError, APIError, RequestRejectedError: mapped to 4xx/503 by the app.
        """
        self.state.check_ready()
        lora_request = self.state.check_model(request.model)
        request.check_http_fields()
        beam = request.beam_search_params(request.max_tokens, self.state.sampling_defaults)
        if beam is not None:
            params = beam.whole_params()
        else:
            params = request.to_sampling_params(max_tokens=request.max_tokens, logprobs=request.logprobs,
                                                defaults=self.state.sampling_defaults)
        if request.echo and request.logprobs is not None:
            params = dataclasses.replace(params, prompt_logprobs=max(request.logprobs, request.prompt_logprobs or 0))
        request_id = new_request_id("cmpl", raw_request)
        prompts = [{"prompt": p, "add_special_tokens": request.add_special_tokens} if isinstance(p, str)
                   else {"prompt_token_ids": p} for p in _prompt_inputs(request)]
        process = self.state.engine.input_processor.process
        slo = self.state.slo_target(request, raw_request, api_key)

        def prepare() -> list[EngineRequest]:  # the input stage, on a worker thread (tokenizers can be slow)
            return [process(f"{request_id}-{i}", prompt, params, priority=request.priority,
                            cache_salt=request.cache_salt, lora_request=lora_request, slo=slo)
                    for i, prompt in enumerate(prompts)]

        engine_requests = await asyncio.to_thread(prepare)
        call = await start_call(self.state, api_key, engine_requests,
                                lambda stream: _Call(self.state, request, request_id, stream),
                                beam_search=beam, logprobs=request.logprobs,
                                kv_transfer_params=request.kv_transfer_params)
        return await answer(call, api_key, request.stream, raw_request)


class _Call(GenerationCall):
    """One admitted completions call: turns engine deltas into choices and chunks."""

    def __init__(self, state: ServingState, request: CompletionRequest, request_id: str, stream: RequestStream):
        super().__init__(state, request, request_id, stream)
        self.prompts: list[EngineRequest] = stream.requests
        n = request.n
        self.choices = [_Choice(i, None if request.logprobs is None else
                                CompletionLogprobsBuilder(state.logprob_token_text(request), request.logprobs))
                        for i in range(len(self.prompts) * n)]
        self.cached_tokens = [0] * len(self.prompts)
        self.prompt_logprobs: list[list | None] = [None] * len(self.prompts)

    def _note_prompt(self, prompt_index: int, output: RequestOutput) -> None:
        """The first delta of a prompt carries its prefix-cache hits and prompt logprobs."""
        self.cached_tokens[prompt_index] = max(self.cached_tokens[prompt_index], output.num_cached_tokens)
        if output.prompt_logprobs is not None:
            self.prompt_logprobs[prompt_index] = output.prompt_logprobs

    def _delta(self, prompt_index: int, output: CompletionOutput) -> CompletionChoice | None:
        """Apply one choice delta; return the chunk choice (None when nothing to send)."""
        choice = self.choices[prompt_index * self.request.n + output.index]
        text, logprobs = output.text, None
        if choice.logprobs is not None:
            parts = []
            if self.request.echo and not choice.echoed:
                prompt = self.prompts[prompt_index]
                parts.append(choice.logprobs.prompt(prompt.prompt_token_ids, self.prompt_logprobs[prompt_index]))
            parts.append(choice.logprobs.generated(list(output.logprobs or [])))
            logprobs = merge_completion_logprobs(parts)
            choice.logprob_parts.append(logprobs)
        if self.request.echo and not choice.echoed:
            text = self._prompt_text(prompt_index) + text
        choice.echoed = True
        choice.text += text
        choice.num_tokens += len(output.token_ids)
        token_ids = prompt_ids = None
        if self.request.return_token_ids:  # vLLM: the prompt's ids on a choice's first chunk, new ids on each
            token_ids = list(output.token_ids)
            choice.token_ids += token_ids
            if not choice.sent_prompt_ids:
                prompt_ids, choice.sent_prompt_ids = list(self.prompts[prompt_index].prompt_token_ids), True
        if choice.finish_reason is None and output.finish_reason is not None:
            choice.finish_reason, choice.stop_reason = output.finish_reason, output.stop_reason
            finish = output.finish_reason
        else:
            finish = None
        if not text and finish is None and not (logprobs and logprobs.tokens) and not token_ids and not prompt_ids:
            return None
        return CompletionChoice(index=choice.index, text=text, logprobs=logprobs,
                                finish_reason=finish, stop_reason=output.stop_reason if finish else None,
                                prompt_token_ids=prompt_ids, token_ids=token_ids)

    def _prompt_text(self, prompt_index: int) -> str:
        """What echo shows: the prompt text, or its decoded ids (token-id and truncated prompts)."""
        prompt = self.prompts[prompt_index]
        if prompt.prompt is not None:
            return prompt.prompt
        return self.state.engine.tokenizer.decode(prompt.prompt_token_ids)

    def _token_usage(self):
        prompt_tokens = sum(len(p.prompt_token_ids) for p in self.prompts)
        return make_usage(prompt_tokens, sum(c.num_tokens for c in self.choices), sum(self.cached_tokens))

    def _chunk(self, choices: list[CompletionChoice], usage: UsageInfo | None) -> CompletionStreamResponse:
        return CompletionStreamResponse(id=self.request_id, model=self.model_name, choices=choices, usage=usage)

    def _stream_choices(self, index: int, output: RequestOutput) -> Iterator[CompletionChoice]:
        self._note_prompt(index, output)
        for delta in output.outputs:
            choice = self._delta(index, delta)
            if choice is not None:
                yield choice

    def _absorb(self, index: int, output: RequestOutput) -> None:
        self._note_prompt(index, output)
        for delta in output.outputs:
            self._delta(index, delta)

    def _response(self) -> CompletionResponse:
        choices = []
        for choice in self.choices:
            logprobs = merge_completion_logprobs(choice.logprob_parts) if choice.logprobs else None
            prompt_index = choice.index // self.request.n
            prompt_logprobs = None
            if self.request.prompt_logprobs is not None:
                prompt_logprobs = prompt_logprobs_json(self.state.token_text,
                                                       self.prompts[prompt_index].prompt_token_ids,
                                                       self.prompt_logprobs[prompt_index])
            ids = self.request.return_token_ids
            choices.append(CompletionChoice(index=choice.index, text=choice.text, logprobs=logprobs,
                                            finish_reason=choice.finish_reason,
                                            stop_reason=choice.stop_reason,
                                            prompt_logprobs=prompt_logprobs,
                                            prompt_token_ids=list(self.prompts[prompt_index].prompt_token_ids)
                                            if ids else None,
                                            token_ids=choice.token_ids if ids else None))
        return CompletionResponse(id=self.request_id, model=self.model_name, choices=choices,
                                  usage=self._usage(), kv_transfer_params=self.kv_transfer_params)
