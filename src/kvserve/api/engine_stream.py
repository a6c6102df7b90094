"""One engine request seen from the HTTP layer: started eagerly, always aborted or finished.

``generate()`` raises its request errors before the first yield, so :meth:`EngineRequest.start`
pulls the first output *before* any response is sent: a bad request still gets a 400, never a
200 stream that breaks. :meth:`EngineRequest.close` runs on every exit path (client gone,
error, cancellation) and aborts the engine request unless it finished, shielded from the
cancellation that triggered it.

    start() ─► first RequestOutput ─► handler builds response ─► iterate rest ─► close()
        │ raises InvalidRequestError / RequestRejectedError (→ 400 / 429 / 503)
"""

from __future__ import annotations

import time

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import anyio

from kvserve.engine.llm_engine import GenerateRequest
from kvserve.outputs import RequestOutput
from kvserve.sampling_params import SamplingParams

if TYPE_CHECKING:
    from kvserve.engine.async_llm import EngineClient


class EngineRequest:
    """A started ``engine.generate`` stream with guaranteed clean-up.

    Args:
        engine: the engine client.
        request_id: unique id, also used for ``engine.abort``.
        prompt_token_ids: prompt, token ids.
        sampling_params: how to sample.
        prompt: prompt text (for ``RequestOutput.prompt``), or None.
        priority, cache_salt: passed to ``generate``.
    """

    def __init__(self, engine: EngineClient, request_id: str, prompt_token_ids: list[int],
                 sampling_params: SamplingParams, *, prompt: str | None = None, priority: int = 0,
                 cache_salt: str | None = None):
        self.engine = engine
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.sampling_params = sampling_params
        # Arrival for the metrics: when the API layer made the request, not when the engine
        # thread got to it (the GIL and queued commands delay the latter under load).
        self._generate_kwargs = {"prompt": prompt, "priority": priority, "cache_salt": cache_salt,
                                 "arrival_time": time.time()}
        self._stream: AsyncIterator[RequestOutput] | None = None  # created by start() or start_all()
        self._first: RequestOutput | None = None
        self.finished = False
        self._closed = False

    def as_generate_request(self) -> GenerateRequest:
        return GenerateRequest(self.request_id, self.prompt_token_ids, self.sampling_params,
                               **self._generate_kwargs)

    async def start(self) -> RequestOutput | None:
        """Wait for the first output (None if the stream ended without one).

        Raises:
            InvalidRequestError, RequestRejectedError: from the engine, before anything is sent.
        """
        if self._stream is None:
            self._stream = self.engine.generate(self.prompt_token_ids, self.sampling_params,
                                                self.request_id, **self._generate_kwargs)
        try:
            self._first = await self._stream.__anext__()
        except StopAsyncIteration:
            self.finished = True
            return None
        except Exception:
            self.finished = True  # rejected before the first yield: nothing to abort
            raise
        self.finished = self._first.finished
        return self._first

    async def outputs(self) -> AsyncIterator[RequestOutput]:
        """The first output (from :meth:`start`) and then the rest, as the engine yields them."""
        if self._first is not None:
            first, self._first = self._first, None
            yield first
        if self.finished:
            return
        async for output in self._stream:
            self.finished = output.finished
            yield output
        self.finished = True

    async def close(self) -> None:
        """Abort the engine request unless it finished, and close the generator. Idempotent."""
        if self._closed or self._stream is None:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            if not self.finished:
                await self.engine.abort(self.request_id)
            try:
                if hasattr(self._stream, "aclose"):
                    await self._stream.aclose()
            except RuntimeError:  # still being iterated by a task that is being cancelled
                pass


async def start_all(requests: list[EngineRequest]) -> list[RequestOutput | None]:
    """Start every request; if one fails, close them all and re-raise its error.

    Several requests (the prompts of one call) are admitted together by
    ``EngineClient.generate_many``: the engine checks the waiting queue for all of them before
    queueing any, so a call too large for the queue is refused whole, never partly queued.
    """
    if len(requests) > 1:
        streams = await requests[0].engine.generate_many([r.as_generate_request() for r in requests])
        for request, stream in zip(requests, streams):
            request._stream = stream
    try:
        return list(await asyncio.gather(*(request.start() for request in requests)))
    except BaseException:
        for request in requests:
            await request.close()
        raise


async def merge_outputs(requests: list[EngineRequest]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Interleave the outputs of several requests as they arrive: ``(request index, output)``.

    Errors from any stream propagate; the pumping tasks are cancelled when the consumer stops.
    """
    if len(requests) == 1:
        async for output in requests[0].outputs():
            yield 0, output
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(index: int, request: EngineRequest) -> None:
        try:
            async for output in request.outputs():
                await queue.put((index, output))
            await queue.put((index, done))
        except Exception as exc:  # forwarded to the consumer
            await queue.put((index, exc))

    tasks = [asyncio.ensure_future(pump(i, r)) for i, r in enumerate(requests)]
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
