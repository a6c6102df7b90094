"""The asynchronous engine front that the HTTP layer talks to (contract; implemented by the lead).

The engine core runs in its own thread; ``AsyncLLM`` hands it requests and turns its per-step
outputs into per-request async streams of *delta* ``RequestOutput`` objects.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable
from typing import Any

from kvserve.engine.llm_engine import GenerateRequest, LLMEngine
from kvserve.errors import RequestRejectedError
from kvserve.outputs import RequestOutput
from kvserve.sampling_params import SamplingParams
from kvserve.scheduler.stats import SchedulerStats

logger = logging.getLogger(__name__)


class EngineClient(ABC):
    """What the API layer may use. Attributes set by implementations:

    - ``model_name: str`` (served model name), ``max_model_len: int`` (tokens),
      ``vocab_size: int``, ``tokenizer`` (a Hugging Face tokenizer), ``eos_token_ids: set[int]``.
    """

    model_name: str
    max_model_len: int
    vocab_size: int
    tokenizer: Any

    @abstractmethod
    def generate(
        self,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        request_id: str,
        *,
        prompt: str | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        arrival_time: float | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Stream delta outputs of one request (all ``sampling_params.n`` choices).

        Each yielded ``RequestOutput`` carries only the choices that changed since the last one;
        a choice's ``CompletionOutput`` has the new text (detokenized incrementally, never a
        broken UTF-8 character, stop strings already cut), new token ids, new ``TokenLogprobs``
        (if asked), and ``finish_reason`` on its last delta. The first yielded output carries
        ``prompt_logprobs`` (if asked) and ``num_cached_tokens`` (prefix-cache hits, tokens). The
        iterator ends after every choice finished. Cancelling the consumer (client disconnect)
        aborts the request within one engine step.

        ``arrival_time`` (``time.time()`` seconds) is when the caller received the request; it
        starts the request's latency metrics (default: now).

        Raises (before the first yield):
            InvalidRequestError: prompt + max_tokens exceed ``max_model_len`` (message gives the
                numbers), or token ids outside the vocabulary.
            RequestRejectedError: the waiting queue is full (reason ``queue_full``) or the engine
                is shutting down (reason ``shutting_down``).
        """

    async def generate_many(self, requests: list[GenerateRequest]) -> list[AsyncIterator[RequestOutput]]:
        """Start several requests as one unit (the prompts of one API call) and return their
        streams, each as :meth:`generate`'s.

        Implementations that can should admit all or none: every request is validated and the
        waiting queue checked for all of them before any is queued, and the errors are raised
        here. This default starts nothing itself; each stream is admitted on its first
        ``__anext__`` (the caller must then abort the others when one fails).

        Raises:
            InvalidRequestError, RequestRejectedError: as :meth:`generate`, for any request.
        """
        return [self.generate(r.prompt_token_ids, r.sampling_params, r.request_id, prompt=r.prompt,
                              priority=r.priority, cache_salt=r.cache_salt, arrival_time=r.arrival_time)
                for r in requests]

    @abstractmethod
    async def abort(self, request_id: str) -> None:
        """Abort a request; its KV blocks are freed within one engine step."""

    @property
    @abstractmethod
    def is_ready(self) -> bool:
        """True once the model is loaded and the engine loop runs; False if it died."""


class _Stream:
    """Where one request's deltas go: an asyncio queue living on the server's event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()

    def put(self, item: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the event loop is closed (server shut down): nobody is listening
            pass


class AsyncLLM(EngineClient):
    """The engine in a thread of its own beside the asyncio event loop.

    The engine thread is the only one that touches the ``LLMEngine`` (scheduler, KV cache,
    model, detokenizers). The event loop sends it commands (add, abort) through a thread-safe
    queue; the engine applies them between steps and pushes each step's deltas to the requests'
    asyncio queues. When no request is unfinished the thread sleeps on the command queue.

    Args:
        engine: a constructed ``LLMEngine`` (model loaded).
        served_model_name: the name clients send as ``model``.
        stats_consumers: objects with the ``kvserve.metrics.StatsConsumer`` methods, called on the
            engine thread (metrics, logs, traces); they must be quick and must not raise.

    ``metrics_registry`` (a ``prometheus_client.CollectorRegistry`` or None) is what
    ``GET /metrics`` serves; ``kvserve.metrics.wiring.install_metrics`` sets it and
    ``prometheus_metrics`` (where the HTTP layer counts refused requests).
    """

    def __init__(self, engine: LLMEngine, served_model_name: str, stats_consumers: list[Any] | None = None):
        self._init_common(served_model_name, stats_consumers)
        self._attach(engine)

    @classmethod
    def deferred(
        cls,
        factory: Callable[[], LLMEngine],
        served_model_name: str,
        *,
        tokenizer: Any,
        max_model_len: int,
        vocab_size: int,
        eos_token_ids: frozenset[int] = frozenset(),
        stats_consumers: list[Any] | None = None,
    ) -> AsyncLLM:
        """An ``AsyncLLM`` whose engine is built by ``factory`` on the engine thread after
        ``start()``, so the HTTP server can answer (``/health`` 503) while the weights load. The
        facts the API layer needs before that are given up front. ``wait_until_loaded()`` blocks
        until the engine is ready or failed."""
        self = cls.__new__(cls)
        self._init_common(served_model_name, stats_consumers)
        self._factory = factory
        self.max_model_len, self.vocab_size = max_model_len, vocab_size
        self.tokenizer, self.eos_token_ids = tokenizer, eos_token_ids
        return self

    def _init_common(self, served_model_name: str, stats_consumers: list[Any] | None) -> None:
        self.engine: LLMEngine | None = None
        self._factory: Callable[[], LLMEngine] | None = None
        self.model_name = served_model_name
        self.stats_consumers = list(stats_consumers or [])
        self.metrics_registry: Any = None
        self.prometheus_metrics: Any = None
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}
        self._thread: threading.Thread | None = None
        self._dead: BaseException | None = None
        self._stopping = False
        self._loaded = threading.Event()
        self.snapshot: SchedulerStats = SchedulerStats()

    def _attach(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.max_model_len = engine.max_model_len
        self.vocab_size = engine.vocab_size
        self.tokenizer = engine.tokenizer
        self.eos_token_ids = engine.eos_token_ids
        self.snapshot = engine.core.make_stats()
        self._loaded.set()

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="kvserve-engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        self._commands.put(("stop",))
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def is_ready(self) -> bool:
        return (self._thread is not None and self._thread.is_alive() and self._dead is None
                and self.engine is not None)

    def wait_until_loaded(self, timeout: float | None = None) -> bool:
        """Block until the engine is built (True) or failed / timed out (False)."""
        self._loaded.wait(timeout)
        return self.engine is not None and self._dead is None

    @property
    def num_unfinished_requests(self) -> int:
        return len(self._streams)

    def engine_stats(self) -> dict[str, float]:
        """The latest scheduler snapshot (updated after every step and command batch)."""
        s = self.snapshot
        return {"num_running": s.num_running, "num_waiting": s.num_waiting, "kv_cache_usage": s.kv_cache_usage}

    # -- the API side (event loop) ---------------------------------------------------------------

    async def generate(
        self,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        request_id: str,
        *,
        prompt: str | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        arrival_time: float | None = None,
    ) -> AsyncIterator[RequestOutput]:
        item = GenerateRequest(request_id, prompt_token_ids, sampling_params, prompt, priority, cache_salt,
                               arrival_time or time.time())
        [stream] = await self._add([item])
        async for output in self._iterate(request_id, stream):
            yield output

    async def generate_many(self, requests: list[GenerateRequest]) -> list[AsyncIterator[RequestOutput]]:
        """All of ``requests`` are admitted by one engine-thread command (all or none)."""
        now = time.time()
        items = [r if r.arrival_time else dataclasses.replace(r, arrival_time=now) for r in requests]
        streams = await self._add(items)
        return [self._iterate(item.request_id, stream) for item, stream in zip(items, streams)]

    async def _add(self, items: list[GenerateRequest]) -> list[_Stream]:
        """Hand ``items`` to the engine thread as one command; raises its admission error."""
        if not items:
            return []
        if self._dead is not None:
            raise RequestRejectedError(f"the engine is not running: {self._dead}", reason="engine_dead")
        if self._stopping:
            raise RequestRejectedError("the server is shutting down", reason="shutting_down")
        loop = asyncio.get_running_loop()
        added: asyncio.Future = loop.create_future()
        streams = [_Stream(loop) for _ in items]
        # Arrival is when the API handed the request over, not when the engine thread gets to it.
        self._commands.put(("add", items, streams, added))
        await added  # raises the admission error, if any
        return streams

    async def _iterate(self, request_id: str, stream: _Stream) -> AsyncIterator[RequestOutput]:
        """The deltas of one admitted request; aborts it when the consumer stops early."""
        finished = False
        try:
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            if not finished:
                self._commands.put(("abort", request_id))

    async def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))

    def abort_all(self, message: str) -> None:
        """Abort every running request; each stream ends with ``RequestRejectedError(message)``
        (reason ``shutting_down``). Thread-safe."""
        self._commands.put(("abort_all", message))

    def stop_admission(self) -> None:
        self._stopping = True

    # -- the engine thread -----------------------------------------------------------------------

    def _run(self) -> None:
        if self.engine is None:
            try:
                self._attach(self._factory())
            except BaseException as exc:
                logger.exception("loading the engine failed")
                self._dead = exc
                self._loaded.set()
                return
        try:
            while True:
                block = not self.engine.has_unfinished_requests()
                if not self._drain_commands(block):
                    return
                if self.engine.has_unfinished_requests():
                    self._step()
                else:
                    self.snapshot = self.engine.core.make_stats()
        except BaseException as exc:  # the engine died: tell every waiting client
            logger.exception("engine loop died")
            self._dead = exc
            for stream in self._streams.values():
                stream.put(RuntimeError(f"the engine failed: {exc}"))
            self._streams.clear()

    def _drain_commands(self, block: bool) -> bool:
        """Apply queued commands; wait for one first when ``block``. False = stop the loop."""
        try:
            command = self._commands.get() if block else self._commands.get_nowait()
        except queue.Empty:
            return True
        while True:
            if command[0] == "stop":
                return False
            self._apply(command)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return True

    def _apply(self, command: tuple) -> None:
        if command[0] == "abort_all":
            for request_id, stream in list(self._streams.items()):
                self.engine.abort_request(request_id)
                stream.put(RequestRejectedError(command[1], reason="shutting_down"))
            self._streams.clear()
            return
        if command[0] == "abort":
            request_id = command[1]
            if self._streams.pop(request_id, None) is not None:
                self.engine.abort_request(request_id)
                for consumer in self.stats_consumers:
                    consumer.on_request_aborted(request_id)
            return
        _, items, streams, added = command
        loop = streams[0].loop
        try:
            states = self.engine.add_requests(items)
        except Exception as exc:
            loop.call_soon_threadsafe(_set_exception, added, exc)
            for consumer in self.stats_consumers:
                consumer.on_request_rejected(exc)
            return
        for item, stream in zip(items, streams):
            self._streams[item.request_id] = stream
        loop.call_soon_threadsafe(_set_result, added, states)

    def _step(self) -> None:
        deltas = self.engine.step()
        stats = self.engine.last_step_stats
        if stats is not None:
            self.snapshot = stats.scheduler
        for delta in deltas:
            stream = self._streams.get(delta.request_id)
            if stream is None:
                continue
            stream.put(delta)
            if delta.finished:
                del self._streams[delta.request_id]
        for consumer in self.stats_consumers:
            consumer.on_step(stats, self.engine.last_finished, self.engine.output_processor.last_iteration)


def _set_result(future: asyncio.Future, value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future: asyncio.Future, exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
