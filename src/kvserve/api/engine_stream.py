"""The engine streams of one API call, as the HTTP layer holds them: admitted together, always
aborted or finished.

    engine.process_inputs (worker thread) ─► EngineRequest ─┐
    engine.add_requests(all of the call's) ─► RequestStream per prompt ─► handler ─► close()
        │ raises InvalidRequestError / RequestRejectedError (→ 400 / 429 / 503) before any byte

:meth:`RequestStream.close` runs on every exit path (client gone, error, cancellation) and aborts
the engine request unless it finished, shielded from the cancellation that triggered it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import anyio

from kvserve.engine.engine_request import EngineRequest
from kvserve.errors import KVServeError
from kvserve.outputs import RequestOutput

if TYPE_CHECKING:
    from kvserve.engine.async_llm import EngineClient


class RequestStream:
    """One admitted engine request and its delta stream.

    Attributes:
        request: the validated request (prompt ids, resolved ``max_tokens``, ``n``).
        finished: its last delta was seen (nothing to abort).
    """

    def __init__(self, engine: EngineClient, request: EngineRequest, stream: AsyncIterator[RequestOutput]):
        self.engine = engine
        self.request = request
        self._stream = stream
        self.finished = False
        self._closed = False

    async def outputs(self) -> AsyncIterator[RequestOutput]:
        """The deltas as the engine yields them (``RequestFailedError`` if it failed)."""
        try:
            async for output in self._stream:
                self.finished = output.finished
                yield output
        except KVServeError:
            self.finished = True  # failed or shut down: the engine has dropped it already
            raise
        self.finished = True

    async def close(self) -> None:
        """Abort the engine request unless it finished, and close the generator. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            if not self.finished:
                await self.engine.abort(self.request.request_id)
            try:
                if hasattr(self._stream, "aclose"):
                    await self._stream.aclose()
            except RuntimeError:  # still being iterated by a task that is being cancelled
                pass


async def start_streams(engine: EngineClient, requests: list[EngineRequest]) -> list[RequestStream]:
    """Admit the requests of one call as one unit (the engine checks the waiting queue and the KV
    cache for all of them before queueing any).

    Raises:
        InvalidRequestError, RequestRejectedError: nothing was queued.
    """
    streams = await engine.add_requests(requests)
    return [RequestStream(engine, request, stream) for request, stream in zip(requests, streams)]


async def merge_outputs(streams: list[RequestStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Interleave the outputs of several streams as they arrive: ``(stream index, output)``.

    Errors from any stream propagate; the pumping tasks are cancelled when the consumer stops.
    """
    if len(streams) == 1:
        async for output in streams[0].outputs():
            yield 0, output
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(index: int, stream: RequestStream) -> None:
        try:
            async for output in stream.outputs():
                await queue.put((index, output))
            await queue.put((index, done))
        except Exception as exc:  # forwarded to the consumer
            await queue.put((index, exc))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
