"""``RequestStream``: the deltas of one API call's engine requests, carried from the engine thread
to the event loop that awaits them. One object per call, admitted together, always finished or
aborted::

    engine thread                                   event loop
    OutputProcessor.process_outputs ─► sink(delta) ─► queue ─► RequestStream.outputs() ─► handler
                                                             RequestStream.close() ─► abort the rest

A call with several prompts (``/v1/completions`` with a list) has one engine request per prompt;
their deltas arrive in one queue, tagged with the prompt's index, in the order the engine made them.
A pooling call's requests each deliver one ``PoolingRequestOutput`` (the same ``finished``,
``error`` and ``client_error``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any
from kvserve.engine.engine_request import EngineRequest
from kvserve.errors import InvalidRequestError, RequestFailedError
from kvserve.outputs import PoolingRequestOutput, RequestOutput

Sink = Callable[[RequestOutput | PoolingRequestOutput | BaseException], None]


def call_in_loop(loop: asyncio.AbstractEventLoop, callback: Callable[..., Any], *args: Any) -> None:
    """Run ``callback(*args)`` on ``loop`` (from the engine thread). A closed loop means nobody
    listens any more (the server shut down, or the caller's ``asyncio.run`` ended): nothing runs."""
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:  # the event loop is closed
        pass


class RequestStream:
    """The engine requests of one call and their delta outputs.

    Args:
        requests: the call's validated requests, in prompt order.
        loop: the event loop that reads the stream.
        abort: asks the engine to abort a request id (thread-safe, never blocks).

    Attributes:
        requests: as given.
    """

    def __init__(self, requests: list[EngineRequest], loop: asyncio.AbstractEventLoop, abort: Callable[[str], None]):
        self.requests = requests
        self._loop = loop
        self._abort = abort
        self._queue: asyncio.Queue = asyncio.Queue()
        self._unfinished = set(range(len(requests)))

    def sink(self, index: int) -> Sink:
        """Where the engine thread puts the deltas of ``requests[index]`` (or the exception that
        ended it)."""
        def put(item: RequestOutput | PoolingRequestOutput | BaseException) -> None:
            call_in_loop(self._loop, self._queue.put_nowait, (index, item))

        return put

    async def outputs(self) -> AsyncIterator[tuple[int, RequestOutput | PoolingRequestOutput]]:
        """``(prompt index, delta)`` as the engine makes them, until every request finished.

        Raises:
            RequestFailedError: a request failed in the engine (its other choices are aborted).
            InvalidRequestError: a request failed through its own fault (e.g. its grammar).
            RequestRejectedError: the engine shut down or died under it.
        """
        while self._unfinished:
            index, item = await self._queue.get()
            if isinstance(item, BaseException):
                self._unfinished.discard(index)  # the engine already dropped it
                raise item
            if item.finished:
                self._unfinished.discard(index)
            if item.error is not None:
                if item.client_error:
                    raise InvalidRequestError(item.error)
                raise RequestFailedError(item.error, item.request_id)
            yield index, item

    def close(self) -> None:
        """Abort the requests that have not finished (client gone, error, cancellation). Idempotent."""
        for index in sorted(self._unfinished):
            self._abort(self.requests[index].request_id)
        self._unfinished.clear()

