"""``POST /v1/chat/completions``: messages rendered with the chat template, one engine request
with ``n`` choices, answered as one JSON object or as SSE chunks. Tool calls and reasoning are
read out of each choice's text by the request's :class:`kvserve.api.chat_parsers.ChatPlan`.

Stream shape per choice (OpenAI's; ``reasoning``/``reasoning_content`` are vLLM's)::

    {"delta": {"role": "assistant", "content": ""}, "finish_reason": null}   first
    {"delta": {"reasoning": "Hm", "reasoning_content": "Hm"}}                with --reasoning-parser
    {"delta": {"content": "Hel"},                    "finish_reason": null}   ...
    {"delta": {"tool_calls": [{"index": 0, "id": "chatcmpl-tool-..", "type": "function",
               "function": {"name": "f", "arguments": "{\"a"}}]}}          a call: name first,
    {"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "\": 1}"}}]}}  then pieces
    {"delta": {"content": "lo"},                     "finish_reason": "stop"} last ("tool_calls")
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator

from fastapi import Request
from starlette.responses import Response

from kvserve.api.chat_output import ChoiceOutput, MessageDelta
from kvserve.api.chat_parsers import ChatPlan
from kvserve.api.logprobs import chat_logprobs, prompt_logprobs_json
from kvserve.api.chat_protocol import ChatCompletionRequest
from kvserve.api.protocol import tools_for_template
from kvserve.api.responses import (ChatChoiceLogprobs, ChatCompletionChoice, ChatCompletionResponse,
                                   ChatCompletionStreamChoice, ChatCompletionStreamResponse,
                                   ChatLogprobToken, ChatResponseMessage, DeltaMessage, UsageInfo)
from kvserve.api.serving_base import GenerationCall, ServingState, make_usage, new_request_id, answer, start_call
from kvserve.api.tokenization import render_chat
from kvserve.beam_search import BeamSearchParams
from kvserve.engine.engine_request import EngineRequest
from kvserve.errors import InvalidRequestError
from kvserve.engine.input_processor import FieldNames
from kvserve.engine.request_stream import RequestStream
from kvserve.lora.request import LoRARequest
from kvserve.outputs import CompletionOutput, RequestOutput
from kvserve.slo.targets import SLOTarget


@dataclasses.dataclass
class _Choice:
    index: int
    output: ChoiceOutput
    text: str = ""
    num_tokens: int = 0
    token_ids: list[int] = dataclasses.field(default_factory=list)  # to count reasoning tokens, return_token_ids
    logprobs: list[ChatLogprobToken] = dataclasses.field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None


def render_messages(state: ServingState, request, plan: ChatPlan | None = None) -> list[int]:
    """Prompt token ids for ``request.messages`` with the chat template of the server or
    tokenizer; the tools and template variables are the plan's (without one: the request's
    ``tools`` and ``chat_template_kwargs`` over ``--default-chat-template-kwargs``).

    Raises:
        InvalidRequestError: a non-text content part, a malformed earlier tool call, or the
            template failed.
    """
    messages = [message.to_template_dict(i) for i, message in enumerate(request.messages)]
    if plan is not None:
        tools, template_kwargs = plan.template_tools, dict(plan.template_kwargs)
    else:
        tools, template_kwargs = tools_for_template(request.tools), state.chat_parsers.template_kwargs(request)
    if getattr(request, "documents", None) is not None:
        template_kwargs["documents"] = request.documents
    return render_chat(state.engine.tokenizer, messages,
                       add_generation_prompt=request.add_generation_prompt,
                       continue_final_message=request.continue_final_message,
                       chat_template=state.settings.chat_template, tools=tools,
                       chat_template_kwargs=template_kwargs or None,
                       add_special_tokens=bool(request.add_special_tokens))


class ChatServing:
    """Handles ``/v1/chat/completions`` against the engine in ``state``."""

    def __init__(self, state: ServingState):
        self.state = state

    async def create(self, request: ChatCompletionRequest, raw_request: Request, api_key: str) -> Response:
        """Validate, render, admit, start the engine request, and answer (JSON or SSE).

        Raises:
            InvalidRequestError, APIError, RequestRejectedError: mapped to 4xx/503 by the app.
        """
        call = await self.start(request, raw_request, api_key)
        return await answer(call, api_key, request.stream, raw_request)

    async def start(self, request: ChatCompletionRequest, raw_request: Request | None, api_key: str,
                    request_id: str | None = None) -> GenerationCall:
        """Validate, render, admit and start the call; the caller ends it (``GenerationCall``'s
        ``stream``, ``chunks`` or ``aggregate``, whose body is a ``ChatCompletionResponse``).
        Endpoints that translate another API to chat (``/v1/responses``, ``/v1/messages``) call
        this with their own ``request_id``.

        Raises:
            InvalidRequestError, APIError, RequestRejectedError: nothing was started.
        """
        state = self.state
        state.check_ready()
        lora_request = state.check_model(request.model)
        request.check_http_fields()
        plan = state.chat_parsers.plan(request)
        beam = self._beam_search(request, plan)
        request_id = request_id or new_request_id("chatcmpl", raw_request)
        slo = state.slo_target(request, raw_request, api_key)
        engine_request = await asyncio.to_thread(self._prepare, request, plan, request_id, lora_request, beam, slo)
        return await start_call(state, api_key, [engine_request],
                                lambda stream: _ChatCall(state, request, plan, request_id, stream),
                                beam_search=beam, logprobs=request.num_logprobs,
                                kv_transfer_params=request.kv_transfer_params)

    def _beam_search(self, request: ChatCompletionRequest, plan: ChatPlan) -> BeamSearchParams | None:
        """The request's beam search (``use_beam_search``), decoded as the plan's parsers need.

        Raises:
            InvalidRequestError: see ``SamplingRequest.beam_search_params``; a forced tool call.
        """
        beam = request.beam_search_params(request.requested_max_tokens, self.state.sampling_defaults)
        if beam is None:
            return None
        if plan.forced:
            raise InvalidRequestError("tool_choice 'required' or a named function is not supported with "
                                      "use_beam_search: forcing a call needs a grammar, which beam search "
                                      "does not apply", param="tool_choice")
        return dataclasses.replace(beam, skip_special_tokens=False) if plan.keeps_special_tokens else beam

    def _prepare(self, request: ChatCompletionRequest, plan: ChatPlan, request_id: str,
                 lora_request: LoRARequest | None, beam: BeamSearchParams | None,
                 slo: SLOTarget | None) -> EngineRequest:
        """The input stage, on a worker thread (templates, tokenizers and grammars can be slow):
        render the messages, then validate (``InputProcessor.process``)."""
        state = self.state
        prompt_ids = render_messages(state, request, plan)
        if beam is not None:
            params = beam.whole_params()
        else:
            params = plan.sampling_params(request.to_sampling_params(
                max_tokens=request.requested_max_tokens, logprobs=request.num_logprobs,
                defaults=state.sampling_defaults))
        # vLLM: echo asks for the prompt's logprobs too (a beam search computes none)
        if request.echo and params.prompt_logprobs is None and beam is None:
            params = dataclasses.replace(params, prompt_logprobs=request.top_logprobs or 0)
        fields = FieldNames(prompt="messages", logprobs="top_logprobs",
                            max_tokens="max_completion_tokens" if request.max_completion_tokens is not None
                            else "max_tokens")
        return state.engine.input_processor.process(
            request_id, {"prompt_token_ids": prompt_ids}, params, priority=request.priority,
            cache_salt=request.cache_salt, fields=fields, reasoning=plan.grammar_reasoning(params),
            lora_request=lora_request, slo=slo)


class _ChatCall(GenerationCall):
    """One admitted chat call: turns engine deltas into choices and chunks."""

    def __init__(self, state: ServingState, request: ChatCompletionRequest, plan: ChatPlan, request_id: str,
                 stream: RequestStream):
        super().__init__(state, request, request_id, stream)
        self.plan = plan
        self.engine_request = stream.requests[0]
        self.sent_roles = False
        self.choices = [_Choice(i, plan.choice_output(self.engine_request.sampling_params))
                        for i in range(request.n)]
        self.cached_tokens = 0
        self.prompt_logprobs = None
        self.reasoning_counter = plan.reasoning_counter(self.engine_request.sampling_params)
        # vLLM: with the reasoning left out, logprobs and token ids (which would show it) are left out too.
        hidden = plan.parsers.reasoning_parser is not None and not plan.include_reasoning
        self.logprobs = request.logprobs and not hidden
        self.token_ids = bool(request.return_token_ids) and not hidden
        self.echo = self._echo_text()

    def _note_prompt(self, output: RequestOutput) -> None:
        """The first delta carries the prefix-cache hits and the prompt logprobs."""
        self.cached_tokens = max(self.cached_tokens, output.num_cached_tokens)
        if output.prompt_logprobs is not None:
            self.prompt_logprobs = output.prompt_logprobs

    def _apply(self, output: CompletionOutput) -> tuple[_Choice, ChatChoiceLogprobs | None, str | None]:
        """Add one choice delta to its choice; returns it, the delta's logprobs and the engine's
        finish reason when this delta finished the choice."""
        choice = self.choices[output.index]
        logprobs = None
        if self.logprobs:
            entries = chat_logprobs(self.state.logprob_token_text(self.request), list(output.logprobs or []),
                                    self.request.top_logprobs or 0)
            choice.logprobs += entries
            logprobs = ChatChoiceLogprobs(content=entries) if entries else None
        choice.text += output.text
        choice.num_tokens += len(output.token_ids)
        if self.reasoning_counter is not None or self.token_ids:
            choice.token_ids += output.token_ids
        finish = None
        if choice.finish_reason is None and output.finish_reason is not None:
            choice.finish_reason, choice.stop_reason = output.finish_reason, output.stop_reason
            finish = output.finish_reason
        return choice, logprobs, finish

    def _delta(self, output: CompletionOutput) -> ChatCompletionStreamChoice | None:
        """Apply one choice delta; return the chunk choice (None when nothing to send)."""
        choice, logprobs, finish = self._apply(output)
        parsed = choice.output.feed(output.text, final=finish is not None)
        if not choice.output.parses:
            delta = DeltaMessage(content=output.text)  # as before parsers: the text, "" included
        else:
            delta = _delta_message(parsed)
        if not (parsed or finish or logprobs or self.token_ids):  # vLLM: every token id reaches the client
            return None
        finish_reason = self.plan.finish_reason(finish, choice.output.tools_called) if finish else None
        return ChatCompletionStreamChoice(index=choice.index, delta=delta, logprobs=logprobs,
                                          finish_reason=finish_reason,
                                          stop_reason=output.stop_reason if finish else None,
                                          token_ids=list(output.token_ids) if self.token_ids else None)

    def _message(self, choice: _Choice) -> tuple[ChatResponseMessage, str | None]:
        """A whole choice's message and finish reason."""
        if not choice.output.parses:
            return ChatResponseMessage(role=self._role(), content=choice.text), choice.finish_reason
        parsed = choice.output.parse(choice.text)
        message = ChatResponseMessage(role=self._role(), content=parsed.content,
                                      tool_calls=[c.to_dict() for c in parsed.tool_calls],
                                      reasoning=parsed.reasoning, reasoning_content=parsed.reasoning,
                                      show_reasoning=self.plan.reports_reasoning)
        return message, self.plan.finish_reason(choice.finish_reason, bool(parsed.tool_calls))

    def _echo_text(self) -> str:
        """What ``echo`` puts before each reply (vLLM's rule): the last message's text when its role
        is the reply's (a prefilled assistant turn, or the message being continued), else ""."""
        last = self.request.messages[-1] if self.request.echo else None
        if last is None or last.role != self._role():
            return ""
        return last.to_template_dict(len(self.request.messages) - 1)["content"]

    def _role(self) -> str:
        """The reply's role (vLLM's rule): ``--response-role`` after a generation prompt, else the
        role of the message being continued."""
        if self.request.add_generation_prompt:
            return self.state.settings.response_role
        return self.request.messages[-1].role

    def _token_usage(self):
        reasoning = None
        if self.reasoning_counter is not None:
            reasoning = sum(self.reasoning_counter(c.token_ids) for c in self.choices)
        return make_usage(len(self.engine_request.prompt_token_ids),
                          sum(c.num_tokens for c in self.choices), self.cached_tokens, reasoning)

    def _chunk(self, choices: list[ChatCompletionStreamChoice], usage: UsageInfo | None
               ) -> ChatCompletionStreamResponse:
        first = bool(choices) and choices[0].delta.role is not None  # a role chunk: vLLM's place for the prompt
        prompt_ids = list(self.engine_request.prompt_token_ids) if first and self.request.return_token_ids else None
        return ChatCompletionStreamResponse(id=self.request_id, model=self.model_name, choices=choices, usage=usage,
                                            prompt_token_ids=prompt_ids, kv_transfer_params=self.kv_transfer_params)

    def _stream_choices(self, index: int, output: RequestOutput) -> Iterator[ChatCompletionStreamChoice]:
        """A role delta per choice first (sent with the first engine output, as vLLM, so they
        carry its prefix-cache hits; 0 completion tokens in a running usage), then the content
        deltas."""
        self._note_prompt(output)
        if not self.sent_roles:
            self.sent_roles = True
            for choice in self.choices:
                yield ChatCompletionStreamChoice(index=choice.index, delta=DeltaMessage(role=self._role(), content=""))
            if self.echo:
                for choice in self.choices:
                    yield ChatCompletionStreamChoice(index=choice.index, delta=DeltaMessage(content=self.echo))
        for delta in output.outputs:
            choice = self._delta(delta)
            if choice is not None:
                yield choice

    def _absorb(self, index: int, output: RequestOutput) -> None:
        self._note_prompt(output)
        for delta in output.outputs:
            self._apply(delta)

    def _response(self) -> ChatCompletionResponse:
        choices = []
        for c in self.choices:
            message, finish_reason = self._message(c)
            if self.request.echo:
                message.content = self.echo + (message.content or "")
            choices.append(ChatCompletionChoice(
                index=c.index, message=message,
                logprobs=ChatChoiceLogprobs(content=c.logprobs) if self.logprobs else None,
                finish_reason=finish_reason, stop_reason=c.stop_reason,
                token_ids=c.token_ids if self.token_ids else None))
        prompt_logprobs = None
        if self.engine_request.sampling_params.prompt_logprobs is not None:
            prompt_logprobs = prompt_logprobs_json(self.state.token_text,
                                                   self.engine_request.prompt_token_ids,
                                                   self.prompt_logprobs)
        prompt_ids = list(self.engine_request.prompt_token_ids) if self.request.return_token_ids else None
        return ChatCompletionResponse(id=self.request_id, model=self.model_name, choices=choices,
                                      usage=self._usage(), prompt_logprobs=prompt_logprobs,
                                      prompt_token_ids=prompt_ids, kv_transfer_params=self.kv_transfer_params)


def _delta_message(delta: MessageDelta | None) -> DeltaMessage:
    if delta is None:
        return DeltaMessage()
    calls = [call.to_dict() for call in delta.tool_calls] or None
    return DeltaMessage(content=delta.content, reasoning=delta.reasoning, reasoning_content=delta.reasoning,
                        tool_calls=calls)
