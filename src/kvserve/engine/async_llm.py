"""The asynchronous engine front that the HTTP layer talks to.

The engine core runs in a thread of its own; the event loop talks to it only through typed
commands (``engine_messages``) on a thread-safe queue, and gets per-request async streams of
*delta* ``RequestOutput`` objects back::

    event loop                                   engine thread
    ──────────                                   ─────────────
    process_inputs ─► worker thread: tokenize + validate (InputProcessor) ─► EngineRequest
    add_requests   ──── AddRequests ───────────► LLMEngine.add_requests (capacity, KV fit)
                   ◄─── future resolved ────────
    stream         ◄─── deltas per step ─────── LLMEngine.step()
    abort          ──── AbortRequest ──────────► LLMEngine.abort_request

A request whose processing fails ends its stream with ``RequestFailedError``; the engine goes on.
A failure the engine cannot attribute (``EngineDeadError``, or any exception out of a step) ends
every stream with an error, marks the engine dead (``is_ready`` False, so ``/health`` says 503)
and calls ``on_dead`` (the server then exits non-zero so a supervisor restarts it). While idle, an
engine with tensor-parallel ranks is checked about once a second (``EngineCore.check_health``), so
a rank that dies between requests fails ``/health`` the same way.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable
from typing import Any

from kvserve.engine.engine_messages import AbortAll, AbortRequest, AddRequests, EngineCommand, Shutdown
from kvserve.engine.engine_request import EngineRequest
from kvserve.engine.input_processor import DEFAULT_FIELDS, FieldNames, InputProcessor, PromptInput
from kvserve.engine.llm_engine import EngineStep, LLMEngine, serving_facts
from kvserve.errors import InvalidRequestError, RequestFailedError, RequestRejectedError
from kvserve.generation_config import SamplingDefaults
from kvserve.outputs import RequestOutput
from kvserve.sampling_params import SamplingParams
from kvserve.scheduler.stats import SchedulerStats

logger = logging.getLogger(__name__)


class EngineClient(ABC):
    """What the API layer may use. Attributes set by implementations:

    - ``model_name: str`` (served model name), ``max_model_len: int`` (tokens),
      ``vocab_size: int``, ``tokenizer`` (a Hugging Face tokenizer), ``eos_token_ids``,
      ``input_processor: InputProcessor``, ``sampling_defaults`` (the model's default sampling
      values, ``kvserve.generation_config.SamplingDefaults``; optional), ``lora_registry``
      (``kvserve.lora.registry.LoRARegistry`` with ``--enable-lora``, else None; optional),
      ``quantization`` (the weights' quantization, ``QuantizationConfig.label``; optional),
      ``serving_facts`` (how the loaded engine holds and batches the model, for ``/version``:
      ``model`` folder, ``dtype``, ``kv_cache_dtype``, ``max_num_seqs``, ``device``; None while
      loading; optional).
    """

    model_name: str
    max_model_len: int
    vocab_size: int
    tokenizer: Any
    input_processor: InputProcessor

    async def process_inputs(self, request_id: str, prompt: PromptInput, params: SamplingParams, *,
                             priority: int = 0, cache_salt: str | None = None, arrival_time: float | None = None,
                             fields: FieldNames = DEFAULT_FIELDS, reasoning: Any = None,
                             lora_request: Any = None) -> EngineRequest:
        """Tokenize and validate one prompt's request on a worker thread (the event loop keeps
        serving meanwhile; tokenizers release the GIL; grammars compile there too). ``reasoning``:
        a reasoning parser when a structured-output constraint applies only after the model's
        reasoning (``InputProcessor.process``); ``lora_request``: the adapter, or None.

        Raises:
            InvalidRequestError: any invalid value (``InputProcessor.process``).
        """
        return await asyncio.to_thread(self.input_processor.process, request_id, prompt, params,
                                       priority=priority, cache_salt=cache_salt, arrival_time=arrival_time,
                                       fields=fields, reasoning=reasoning, lora_request=lora_request)

    @abstractmethod
    async def add_requests(self, requests: list[EngineRequest]) -> list[AsyncIterator[RequestOutput]]:
        """Queue the requests of one call, all or none, and return their delta streams.

        Each stream yields ``RequestOutput`` deltas: only the choices that changed, with the new
        text (detokenized incrementally, never a broken UTF-8 character, stop strings cut), new
        token ids and logprobs, and ``finish_reason`` on a choice's last delta. The first delta
        carries ``prompt_logprobs`` (if asked) and ``num_cached_tokens``. A stream ends after
        every choice finished; a failed request raises ``RequestFailedError``. Abandoning a
        stream (client gone) aborts its request within one engine step.

        Raises:
            InvalidRequestError: a request can never fit the KV cache or the queue.
            RequestRejectedError: the queue is full now, or the engine is shutting down / dead.
        """

    async def generate(self, prompt: PromptInput, params: SamplingParams, request_id: str, *,
                       priority: int = 0, cache_salt: str | None = None,
                       arrival_time: float | None = None) -> AsyncIterator[RequestOutput]:
        """``process_inputs`` then ``add_requests`` for one prompt, then its stream."""
        request = await self.process_inputs(request_id, prompt, params, priority=priority, cache_salt=cache_salt,
                                            arrival_time=arrival_time)
        [stream] = await self.add_requests([request])
        async for output in stream:
            yield output

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
    """The engine in a thread of its own beside the asyncio event loop (see the module docstring).

    The engine thread is the only one that touches the ``LLMEngine`` (scheduler, KV cache,
    model, detokenizers). When no request is unfinished it sleeps on the command queue.

    Args:
        engine: a constructed ``LLMEngine`` (model loaded).
        served_model_name: the name clients send as ``model``.
        stats_consumers: objects with the ``kvserve.metrics.StatsConsumer`` methods, called on the
            engine thread (metrics, logs, traces); they must be quick and must not raise.
        on_dead: called (on the engine thread) with the exception when the engine dies.
        kv_event_publisher: gets each step's prefix-cache events (``publish(events)``, quick, on
            the engine thread; ``kvserve.kv_events.publisher``), or None.

    ``metrics_registry`` (a ``prometheus_client.CollectorRegistry`` or None) is what
    ``GET /metrics`` serves; ``kvserve.metrics.wiring.install_metrics`` sets it and
    ``prometheus_metrics`` (where the HTTP layer counts refused requests).
    """

    def __init__(self, engine: LLMEngine, served_model_name: str, stats_consumers: list[Any] | None = None,
                 on_dead: Callable[[BaseException], None] | None = None, kv_event_publisher: Any = None):
        self._init_common(served_model_name, stats_consumers, on_dead)
        self.kv_event_publisher = kv_event_publisher
        self._attach(engine)

    @classmethod
    def deferred(
        cls,
        factory: Callable[[], LLMEngine],
        served_model_name: str,
        *,
        input_processor: InputProcessor,
        sampling_defaults: SamplingDefaults | None = None,
        stats_consumers: list[Any] | None = None,
        on_dead: Callable[[BaseException], None] | None = None,
        kv_event_publisher: Any = None,
        quantization: str | None = None,
    ) -> AsyncLLM:
        """An ``AsyncLLM`` whose engine is built by ``factory`` on the engine thread after
        ``start()``, so the HTTP server can answer (``/health`` 503) while the weights load. The
        input processor (tokenizer, vocabulary, context length) and the model's sampling
        defaults are given up front.
        ``wait_until_loaded()`` blocks until the engine is ready or failed."""
        self = cls.__new__(cls)
        self._init_common(served_model_name, stats_consumers, on_dead)
        self.kv_event_publisher = kv_event_publisher
        self._factory = factory
        self._set_facts(input_processor)
        self.sampling_defaults = sampling_defaults or SamplingDefaults()
        self.quantization = quantization
        return self

    def _init_common(self, served_model_name: str, stats_consumers: list[Any] | None,
                     on_dead: Callable[[BaseException], None] | None) -> None:
        self.engine: LLMEngine | None = None
        self._factory: Callable[[], LLMEngine] | None = None
        self.model_name = served_model_name
        self.quantization: str | None = None
        self.serving_facts: dict[str, Any] | None = None
        self.stats_consumers = list(stats_consumers or [])
        self.on_dead = on_dead
        self.metrics_registry: Any = None
        self.prometheus_metrics: Any = None
        self._commands: queue.SimpleQueue[EngineCommand] = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}
        self._thread: threading.Thread | None = None
        self._dead: BaseException | None = None
        self._loaded = threading.Event()
        self.snapshot: SchedulerStats = SchedulerStats()
        self.lora_registry: Any = None

    def _set_facts(self, input_processor: InputProcessor) -> None:
        self.input_processor = input_processor
        self.tokenizer = input_processor.tokenizer
        self.max_model_len = input_processor.max_model_len
        self.vocab_size = input_processor.vocab_size
        self.eos_token_ids = input_processor.eos_token_ids

    def _attach(self, engine: LLMEngine) -> None:
        self.engine = engine
        if self.lora_registry is None:  # the launcher gives its own (with --lora-modules) up front
            self.lora_registry = engine.lora_registry
        self._set_facts(engine.input_processor)
        self.sampling_defaults = engine.config.model.sampling_defaults
        self.quantization = engine.config.model.quantization.label
        self.serving_facts = serving_facts(engine)
        self.snapshot = engine.core.make_stats()
        self._loaded.set()

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="kvserve-engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        self._commands.put(Shutdown())
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def is_ready(self) -> bool:
        return (self._thread is not None and self._thread.is_alive() and self._dead is None
                and self.engine is not None)

    @property
    def dead_reason(self) -> BaseException | None:
        """Why the engine stopped (a load failure or an unattributable failure), else None."""
        return self._dead

    def wait_until_loaded(self, timeout: float | None = None) -> bool:
        """Block until the engine is built (True) or failed / timed out (False)."""
        self._loaded.wait(timeout)
        return self.engine is not None and self._dead is None

    @property
    def loading(self) -> bool:
        """Whether the engine is still being built (neither loaded nor failed)."""
        return not self._loaded.is_set()

    @property
    def num_unfinished_requests(self) -> int:
        return len(self._streams)

    def engine_stats(self) -> dict[str, float]:
        """The latest scheduler snapshot (updated after every step and command batch)."""
        s = self.snapshot
        return {"num_running": s.num_running, "num_waiting": s.num_waiting, "kv_cache_usage": s.kv_cache_usage}

    # -- the API side (event loop) -----------------------------------------------------------------

    async def add_requests(self, requests: list[EngineRequest]) -> list[AsyncIterator[RequestOutput]]:
        """All of ``requests`` are admitted by one engine-thread command (all or none)."""
        if not requests:
            return []
        if self._dead is not None:
            raise RequestRejectedError(f"the engine is not running: {self._dead}", reason="engine_dead")
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()
        streams = [_Stream(loop) for _ in requests]
        self._commands.put(AddRequests(requests, streams, done))
        await done  # raises the admission error, if any
        return [self._iterate(request.request_id, stream) for request, stream in zip(requests, streams)]

    async def _iterate(self, request_id: str, stream: _Stream) -> AsyncIterator[RequestOutput]:
        """The deltas of one admitted request; aborts it when the consumer stops early."""
        finished = False
        try:
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    finished = True  # the engine already dropped it
                    raise item
                if item.error is not None:  # a choice failed: the call fails (its other choices abort)
                    finished = item.finished
                    if item.client_error:
                        raise InvalidRequestError(item.error)
                    raise RequestFailedError(item.error, request_id)
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            if not finished:
                self._commands.put(AbortRequest(request_id))

    async def abort(self, request_id: str) -> None:
        self._commands.put(AbortRequest(request_id))

    def abort_all(self, message: str) -> None:
        """Abort every running request; each stream ends with ``RequestRejectedError(message)``
        (reason ``shutting_down``). Thread-safe."""
        self._commands.put(AbortAll(message))

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
        except BaseException as exc:  # unattributable: answer everyone, then let the server exit
            self._die(exc)
        finally:
            self.engine.shutdown()

    def _die(self, exc: BaseException) -> None:
        logger.exception("the engine failed and stops: %s", exc)
        self._dead = exc
        for request_id, stream in self._streams.items():
            stream.put(RequestFailedError(f"the engine failed and is restarting: {exc}", request_id))
        self._streams.clear()
        if self.on_dead is not None:
            self.on_dead(exc)

    def _drain_commands(self, block: bool) -> bool:
        """Apply queued commands; wait for one first when ``block``. False = stop the loop."""
        interval = self.engine.core.health_check_interval
        try:
            command = self._commands.get(timeout=interval) if block else self._commands.get_nowait()
        except queue.Empty:
            if block:  # idle for a whole interval: are the other ranks still there?
                self.engine.core.check_health()
            return True
        while True:
            if isinstance(command, Shutdown):
                return False
            self._apply(command)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return True

    def _apply(self, command: EngineCommand) -> None:
        if isinstance(command, AbortAll):
            for request_id, stream in list(self._streams.items()):
                self.engine.abort_request(request_id)
                stream.put(RequestRejectedError(command.message, reason="shutting_down"))
            self._streams.clear()
        elif isinstance(command, AbortRequest):
            if self._streams.pop(command.request_id, None) is not None:
                self.engine.abort_request(command.request_id)
                for consumer in self.stats_consumers:
                    consumer.on_request_aborted(command.request_id)
        elif isinstance(command, AddRequests):
            self._add(command)

    def _add(self, command: AddRequests) -> None:
        loop = command.streams[0].loop
        try:
            self.engine.add_requests(command.requests)
        except Exception as exc:  # noqa: BLE001 - an admission error goes back to the caller
            loop.call_soon_threadsafe(_set_exception, command.done, exc)
            for consumer in self.stats_consumers:
                consumer.on_request_rejected(exc)
            return
        for request, stream in zip(command.requests, command.streams):
            self._streams[request.request_id] = stream
        loop.call_soon_threadsafe(_set_result, command.done, None)

    def _step(self) -> None:
        step: EngineStep = self.engine.step()
        if step.stats is not None:
            self.snapshot = step.stats.scheduler
        for delta in step.outputs:
            stream = self._streams.get(delta.request_id)
            if stream is None:
                continue
            stream.put(delta)
            if delta.finished:
                del self._streams[delta.request_id]
        for consumer in self.stats_consumers:
            consumer.on_step(step.stats, step.finished, step.iteration)
        if step.kv_events and self.kv_event_publisher is not None:
            self.kv_event_publisher.publish(step.kv_events)


def _set_result(future: asyncio.Future, value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future: asyncio.Future, exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
