"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens``: Anthropic's Messages API, run as
the chat completion it translates to (vLLM 0.32's ``AnthropicServingMessages``, which subclasses
its chat server the same way).

    AnthropicMessagesRequest ──► anthropic_request.to_chat_request ──► ChatServing.start
         (validated by FastAPI)      (refusals by name)                 (admission, the input
                                                                          processor's checks)
    GenerationCall ──► aggregate() ──► anthropic_output.to_message ──► JSON
                  └──► chunks()    ──► anthropic_output.MessageStream ──► SSE events

Errors leave in Anthropic's shape (``kvserve.api.anthropic_errors``); a chat field named in an
error of the chat call is renamed to the Anthropic request's (``stop`` -> ``stop_sequences``, ...). An error after
the stream began is an ``error`` event, and the stream ends there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from typing import get_args

from fastapi import Depends, FastAPI, Request
from pydantic import BaseModel
from starlette.responses import JSONResponse, Response

from kvserve.api.anthropic_errors import from_api_error
from kvserve.api.anthropic_output import MessageStream, to_message
from kvserve.api.anthropic_protocol import (AnthropicCountTokensRequest, AnthropicCountTokensResponse,
                                            AnthropicErrorResponse, AnthropicMessage, AnthropicMessagesRequest,
                                            AnthropicPromptRequest, ContextManagement, Effort, ErrorEvent,
                                            ThinkingDisabled)
from kvserve.api.anthropic_request import TemplateFacts, anthropic_param, to_chat_request
from kvserve.api.auth import api_key_of
from kvserve.api.chat_protocol import ChatCompletionRequest
from kvserve.api.errors import APIError, to_api_error
from kvserve.api.serving_base import GenerationCall, ServingState, new_request_id, until_disconnect
from kvserve.api.serving_chat import ChatServing, render_messages
from kvserve.api.sse import SSEResponse
from kvserve.api.tokenization import render_chat
from kvserve.errors import InvalidRequestError

logger = logging.getLogger(__name__)


_ANTHROPIC_ERRORS = {status: {"model": AnthropicErrorResponse} for status in (400, 401, 404, 429, 500, 503)}


def register(app: FastAPI, state: ServingState) -> None:
    """Add ``/v1/messages`` and ``/v1/messages/count_tokens`` to ``app`` (errors in Anthropic's
    shape: ``AnthropicErrorMiddleware``, installed by ``build_app``)."""
    messages = MessagesServing(state, ChatServing(state))

    @app.post("/v1/messages", responses={200: {"model": AnthropicMessage, "content": {"text/event-stream": {}}},
                                         **_ANTHROPIC_ERRORS})
    async def create_message(body: AnthropicMessagesRequest, request: Request,
                             key: str = Depends(api_key_of)) -> Response:
        return await messages.create(body, request, key)

    @app.post("/v1/messages/count_tokens", responses=_ANTHROPIC_ERRORS)
    async def count_message_tokens(body: AnthropicCountTokensRequest) -> AnthropicCountTokensResponse:
        return await messages.count_tokens(body)


class MessagesServing:
    """Handles the Anthropic routes against the engine in ``state`` (through ``chat``)."""

    def __init__(self, state: ServingState, chat: ChatServing):
        self.state = state
        self.chat = chat
        self._facts: TemplateFacts | None = None

    async def create(self, request: AnthropicMessagesRequest, raw_request: Request, api_key: str) -> Response:
        """Translate, start the chat call, and answer: one message (JSON) or the event stream.

        Raises:
            InvalidRequestError, APIError, RequestRejectedError: nothing was started.
        """
        chat_request = to_chat_request(request, await self._template_facts(request))
        request_id = "msg_" + new_request_id("msg", raw_request)[len("msg-"):]
        with _anthropic_names():
            call = await self.chat.start(chat_request, raw_request, api_key, request_id=request_id)
        if request.stream:
            return SSEResponse(message_events(call, api_key))
        finished, response = await until_disconnect(raw_request, call.aggregate(api_key))
        if not finished:
            return Response(status_code=499)
        return JSONResponse(to_message(response).model_dump(mode="json"))

    async def count_tokens(self, request: AnthropicCountTokensRequest) -> AnthropicCountTokensResponse:
        """The prompt's token count: the conversation and tools rendered as ``create`` renders
        them (so a request ``create`` refuses is refused here too).

        Raises:
            InvalidRequestError, APIError: as ``create`` before anything is started.
        """
        self.state.check_model(request.model)
        chat_request = to_chat_request(request, await self._template_facts(request))
        with _anthropic_names():
            chat_request.check_http_fields()
            plan = self.state.chat_parsers.plan(chat_request)
            prompt_ids = await asyncio.to_thread(render_messages, self.state, chat_request, plan)
        count = len(prompt_ids)
        return AnthropicCountTokensResponse(input_tokens=count,
                                            context_management=ContextManagement(original_input_tokens=count))

    async def _template_facts(self, request: AnthropicPromptRequest) -> TemplateFacts:
        """The template's facts (probed once, on a worker thread, by the first request that
        needs them: one with a system turn in ``messages`` or ``thinking`` disabled)."""
        if self._facts is None and (isinstance(request.thinking, ThinkingDisabled)
                                    or any(m.role == "system" for m in request.messages)):
            self._facts = await asyncio.to_thread(probe_template, self.state)
        return self._facts or TemplateFacts()


async def message_events(call: GenerationCall, api_key: str) -> AsyncIterator[str]:
    """The SSE events of a started chat call (``anthropic_output.MessageStream``); an error is
    reported in-band as an ``error`` event, after which the stream ends."""
    stream = MessageStream()
    try:
        async with aclosing(call.chunks(api_key, include_usage=True)) as chunks:
            async for chunk in chunks:
                for event in stream.events(chunk):
                    yield sse_event(event)
        for event in stream.finish():
            yield sse_event(event)
    except Exception as exc:  # noqa: BLE001 - the headers are sent: report in-band
        yield sse_event(ErrorEvent(error=from_api_error(to_api_error(exc)).error))


def sse_event(event: BaseModel) -> str:
    """``event: <type>`` and ``data: <compact JSON>`` (Anthropic's clients skip unnamed events)."""
    return f"event: {event.type}\ndata: {event.model_dump_json()}\n\n"


@contextlib.contextmanager
def _anthropic_names() -> Iterator[None]:
    """Re-raise a 400 or other API error with its field named as the Anthropic request names it."""
    try:
        yield
    except InvalidRequestError as exc:
        raise InvalidRequestError(exc.message, param=anthropic_param(exc.param)) from None
    except APIError as exc:
        exc.param = anthropic_param(exc.param)
        raise


def probe_template(state: ServingState) -> TemplateFacts:
    """vLLM's probes of the chat template: does it refuse a system message after the first turn
    (``[system, user, system, user]`` fails to render: then inline system turns are merged), and
    does ``reasoning_effort: "none"`` render a prompt of its own (else thinking ``disabled``
    sends ``"low"``)."""
    conversation = [{"role": "system", "content": "t"}, {"role": "user", "content": "t"}] * 2
    try:
        render_chat(state.engine.tokenizer, conversation, add_generation_prompt=False, continue_final_message=False,
                    chat_template=state.settings.chat_template)
        merge = False
    except InvalidRequestError:
        merge = True

    def prompt(effort: str) -> list[int] | None:
        request = ChatCompletionRequest(messages=[{"role": "user", "content": "Hi"}], reasoning_effort=effort)
        try:
            return render_messages(state, request)
        except InvalidRequestError:
            return None

    unthinking = prompt("none")
    same = unthinking is None or any(prompt(effort) == unthinking for effort in get_args(Effort))
    facts = TemplateFacts(merge_inline_system=merge, disabled_thinking_effort="low" if same else "none")
    logger.info("/v1/messages: inline system turns %s; thinking disabled sends reasoning_effort=%r",
                "merged into the system prompt" if merge else "kept in place", facts.disabled_thinking_effort)
    return facts
