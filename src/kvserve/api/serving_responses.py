"""``/v1/responses``: OpenAI's Responses API as vLLM 0.32 serves it, on top of chat completions.

    POST   /v1/responses               create (JSON, SSE events, or background)
    GET    /v1/responses/{id}          a stored response (``?stream=true&starting_after=N``: the
                                       events of a streamed background response, replayed)
    DELETE /v1/responses/{id}          forget it (a running background response is cancelled)
    POST   /v1/responses/{id}/cancel   cancel a queued or in-progress background response

A request is translated to the chat completion it stands for (``responses_input``), started with
``ChatServing.start`` (validation, rendering, admission and rate limits as chat's), and its
answer translated back: whole (``responses_output``) or as stream events (``responses_events``).
So a Response's text, tool calls, reasoning, logprobs and usage are the chat answer's.

``store`` (default true) keeps the finished response (``responses_store``); a follow-up with
``previous_response_id`` continues its conversation: the stored messages, its output, then the
new input (its ``instructions`` are not carried over). ``background`` (needs ``store``) answers
at once with status ``queued`` and generates in a task; ``/cancel`` aborts the engine request
and leaves status ``cancelled``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

from fastapi import Depends, FastAPI, Request
from starlette.responses import JSONResponse, Response

from kvserve.api.auth import api_key_of
from kvserve.api.errors import APIError, to_api_error
from kvserve.api.responses import ChatCompletionResponse
from kvserve.api.responses_events import ResponseEventStream
from kvserve.api.responses_input import chat_request, input_messages, output_messages, renamed
from kvserve.api.responses_objects import ResponseDeleted, ResponseError, ResponseEvent, ResponsesResponse, \
    new_item_id, sse_event
from kvserve.api.responses_output import finished_response, output_items, response_skeleton
from kvserve.api.responses_protocol import ResponsesRequest
from kvserve.api.responses_store import EventLog, ResponsesStore, StoredResponse
from kvserve.api.serving_base import GenerationCall, ServingState, until_disconnect
from kvserve.api.serving_chat import ChatServing
from kvserve.api.sse import SSEResponse
from kvserve.errors import InvalidRequestError


@dataclass
class _Run:
    """One admitted response: its chat call and what the response echoes and stores."""

    call: GenerationCall
    api_key: str
    skeleton: ResponsesResponse
    messages: list[dict]  # the conversation without instructions (stored for follow-ups)
    store: bool

    def whole_response(self, body: ChatCompletionResponse) -> ResponsesResponse:
        choice = body.choices[0]
        logprobs = choice.logprobs.content if choice.logprobs is not None else None
        finish = choice.finish_reason
        return finished_response(self.skeleton, output_items(choice.message, finish, logprobs), finish, body.usage)


def register(app: FastAPI, state: ServingState) -> None:
    """Add ``POST /v1/responses``, ``GET``/``DELETE /v1/responses/{id}`` and
    ``POST /v1/responses/{id}/cancel`` to ``app``."""
    responses = ResponsesServing(state, ChatServing(state))
    answers = {200: {"model": ResponsesResponse, "content": {"text/event-stream": {}}}}

    @app.post("/v1/responses", responses=answers)
    async def create_response(body: ResponsesRequest, request: Request, key: str = Depends(api_key_of)) -> Response:
        return await responses.create(body, request, key)

    @app.get("/v1/responses/{response_id}", responses=answers)
    async def retrieve_response(response_id: str, stream: bool = False, starting_after: int | None = None,
                                key: str = Depends(api_key_of)) -> Response:
        return await responses.retrieve(response_id, key, stream, starting_after)

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str, key: str = Depends(api_key_of)) -> ResponseDeleted:
        return await responses.delete(response_id, key)

    @app.post("/v1/responses/{response_id}/cancel")
    async def cancel_response(response_id: str, key: str = Depends(api_key_of)) -> ResponsesResponse:
        return await responses.cancel(response_id, key)


class ResponsesServing:
    """Handles the ``/v1/responses`` routes against the chat endpoint in ``chat``."""

    def __init__(self, state: ServingState, chat: ChatServing):
        self.state = state
        self.chat = chat
        self.store = ResponsesStore(state.settings.responses_store_max)

    async def create(self, request: ResponsesRequest, raw_request: Request, api_key: str) -> Response:
        """Validate, translate, start, and answer (JSON, SSE, or ``queued`` for background).

        Raises:
            InvalidRequestError, APIError, RequestRejectedError: nothing was started (a 404 for
                an unknown ``previous_response_id``).
        """
        request.check_fields()
        store = request.store is not False and self.store.enabled
        if request.background and not store:
            raise InvalidRequestError("background needs a response store: this server keeps none "
                                      "(--responses-store-max 0)", param="background")
        messages = self._history(request, api_key) + input_messages(request.input)
        response_id = new_item_id("resp")
        try:
            call = await self.chat.start(chat_request(request, messages), raw_request, api_key, request_id=response_id)
        except InvalidRequestError as exc:
            raise renamed(exc) from None
        params = call.request_stream.requests[0].sampling_params
        run = _Run(call, api_key, response_skeleton(request, response_id, call.model_name, params, store),
                   messages, store)
        if request.background:
            return await self._background(run, bool(request.stream))
        if request.stream:
            return SSEResponse(self._stream(run))
        finished, body = await until_disconnect(raw_request, call.aggregate(api_key))
        if not finished:
            return Response(status_code=499)
        response = run.whole_response(body)
        self._keep(run, response)
        return JSONResponse(response.model_dump(mode="json"))

    def _history(self, request: ResponsesRequest, api_key: str) -> list[dict]:
        """The conversation ``previous_response_id`` continues: its messages and its output.

        Raises:
            APIError: 404 ``previous_response_not_found``; 400 while it is still generating.
        """
        if request.previous_response_id is None:
            return []
        entry = self.store.get(request.previous_response_id, api_key)
        if entry is None:
            raise APIError(404, f"Previous response with id '{request.previous_response_id}' not found.",
                           param="previous_response_id", code="previous_response_not_found")
        if not entry.response.finished:
            raise InvalidRequestError(f"Previous response '{entry.response.id}' is still {entry.response.status}; "
                                      "wait for it to finish", param="previous_response_id")
        return entry.messages + output_messages([item.model_dump() for item in entry.response.output])

    def _keep(self, run: _Run, response: ResponsesResponse) -> None:
        if run.store:
            self.store.put(StoredResponse(response, run.messages, run.api_key))

    async def _stream(self, run: _Run) -> AsyncIterator[str]:
        """SSE events of a foreground stream; the finished response is stored (a client that
        leaves early ends the call, and nothing is stored)."""
        events = ResponseEventStream(run.skeleton)
        yield sse_event(events.lifecycle("created"))
        yield sse_event(events.lifecycle("in_progress"))
        async with aclosing(self._generate(run, events)) as generated:
            async for event in generated:
                yield sse_event(event)
        self._keep(run, events.response)

    @staticmethod
    async def _generate(run: _Run, events: ResponseEventStream) -> AsyncIterator[ResponseEvent]:
        """The call's events after the start; a failure becomes ``error`` + ``response.failed``."""
        try:
            async with aclosing(run.call.chunks(run.api_key, include_usage=True)) as chunks:
                async for chunk in chunks:
                    for event in events.feed(chunk):
                        yield event
        except Exception as exc:  # noqa: BLE001 - the stream has started: reported in-band
            for event in events.fail(to_api_error(exc)):
                yield event
            return
        for event in events.finish():
            yield event

    async def _background(self, run: _Run, stream: bool) -> Response:
        """Answer at once (``queued``; streamed: the event log from the start) and generate in a
        task. The task has begun (its ``finally`` will end the call) before anyone can find it
        to cancel it: it is stored only after its first step."""
        queued = run.skeleton.model_copy(update={"status": "queued"})
        entry = StoredResponse(queued, run.messages, run.api_key, events=EventLog() if stream else None)
        entry.task = asyncio.create_task(self._run_background(run, entry))
        await asyncio.sleep(0)
        self.store.put(entry)
        if stream:
            return SSEResponse(self._follow(entry.events, None))
        return JSONResponse(queued.model_dump(mode="json"))

    async def _run_background(self, run: _Run, entry: StoredResponse) -> None:
        events = ResponseEventStream(entry.response)
        try:
            if entry.events is not None:
                entry.events.append(events.lifecycle("created"))
            entry.response = entry.response.model_copy(update={"status": "in_progress"})
            if entry.events is None:
                entry.response = run.whole_response(await run.call.aggregate(run.api_key))
                return
            entry.events.append(events.lifecycle("in_progress", "in_progress"))
            async with aclosing(self._generate(run, events)) as generated:
                async for event in generated:
                    entry.events.append(event)
            entry.response = events.response
        except asyncio.CancelledError:  # the items streamed so far stay
            entry.response = entry.response.model_copy(update={"status": "cancelled", "output": list(events.items)})
            raise
        except Exception as exc:  # noqa: BLE001 - a failed background response says why
            error = to_api_error(exc)
            entry.response = entry.response.model_copy(update={
                "status": "failed", "error": ResponseError(code="server_error", message=error.message)})
        finally:
            if entry.events is not None:
                entry.events.close()

    @staticmethod
    async def _follow(log: EventLog, starting_after: int | None) -> AsyncIterator[str]:
        async for event in log.follow(starting_after):
            yield sse_event(event)

    def _entry(self, response_id: str, api_key: str) -> StoredResponse:
        entry = self.store.get(response_id, api_key)
        if entry is None:
            raise APIError(404, f"Response with id '{response_id}' not found.", param="response_id")
        return entry

    async def retrieve(self, response_id: str, api_key: str, stream: bool = False,
                       starting_after: int | None = None) -> Response:
        """A stored response, or (``stream``) its events from ``starting_after`` on.

        Raises:
            APIError: 404 unknown (or dropped, or another key's); 400 ``stream`` for a
                response that was not created with ``background`` and ``stream``, 400
                ``starting_after`` below -1 (sequence numbers count from 0).
        """
        if starting_after is not None and starting_after < -1:
            raise InvalidRequestError(f"starting_after must be a sequence number (>= 0, or -1 for every event), "
                                      f"got {starting_after}", param="starting_after")
        entry = self._entry(response_id, api_key)
        if not stream:
            return JSONResponse(entry.response.model_dump(mode="json"))
        if entry.events is None:
            raise InvalidRequestError("stream=true replays the events of a response created with background "
                                      "and stream; this one was not", param="stream")
        return SSEResponse(self._follow(entry.events, starting_after))

    async def delete(self, response_id: str, api_key: str) -> ResponseDeleted:
        """Forget a stored response (a running background one is cancelled first)."""
        entry = self.store.pop(response_id, api_key)
        if entry is None:
            raise APIError(404, f"Response with id '{response_id}' not found.", param="response_id")
        await _ended(entry)
        return ResponseDeleted(id=response_id)

    async def cancel(self, response_id: str, api_key: str) -> ResponsesResponse:
        """Cancel a queued or in-progress background response (its engine request is aborted
        before this returns); cancelling a cancelled one returns it again.

        Raises:
            APIError: 404 unknown; 400 not a background response, or already finished.
        """
        entry = self._entry(response_id, api_key)
        status = entry.response.status
        if not entry.response.background:
            raise InvalidRequestError("Cannot cancel a synchronous response.", param="response_id")  # vLLM's words
        if entry.response.finished and status != "cancelled":
            raise InvalidRequestError(f"Cannot cancel a response that is already {status}.", param="response_id")
        await _ended(entry)
        return entry.response


async def _ended(entry: StoredResponse) -> None:
    """Cancel ``entry``'s background task if it runs, and wait until it has ended its call."""
    entry.end_task()
    if entry.task is not None:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(entry.task, return_exceptions=True)
