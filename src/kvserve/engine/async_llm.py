"""The asynchronous engine that the HTTP layer talks to.

The engine core runs in a thread of its own; the event loop talks to it only through typed
commands (``engine_messages``) on a thread-safe queue, and gets one ``RequestStream`` per API call
back. The engine thread drives the ``EngineCore`` and the ``OutputProcessor`` directly::

    event loop                                   engine thread
    ──────────                                   ─────────────
    (worker thread: InputProcessor.process ─► EngineRequest; see the API handlers)
    add_requests   ──── AddRequests ───────────► EngineCore.add_requests (capacity, KV fit)
                   ◄─── future resolved ────────
    RequestStream  ◄─── sink(delta) ─────────── EngineCore.step ─► OutputProcessor.process_outputs
    stream.close() ──── AbortRequest ──────────► EngineCore.finish_requests

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

from kvserve.engine.core import EngineCore
from kvserve.engine.engine_messages import AbortAll, AbortRequest, AddRequests, EngineCommand, Shutdown
from kvserve.engine.engine_request import EngineRequest
from kvserve.engine.input_processor import InputProcessor, PromptInput
from kvserve.engine.output_processor import OutputProcessor
from kvserve.engine.request_stream import RequestStream, call_in_loop
from kvserve.errors import RequestFailedError, RequestRejectedError
from kvserve.generation_config import SamplingDefaults
from kvserve.outputs import RequestOutput
from kvserve.request import RequestStatus
from kvserve.sampling_params import SamplingParams
from kvserve.scheduler.stats import SchedulerStats

logger = logging.getLogger(__name__)


class EngineClient(ABC):
    """What the API layer may use. Attributes set by implementations:

    - ``model_name: str`` (served model name), ``max_model_len: int`` (tokens),
      ``vocab_size: int``, ``tokenizer`` (a Hugging Face tokenizer), ``eos_token_ids``,
      ``input_processor: InputProcessor`` (the API's handlers call its ``process`` on a worker
      thread), ``sampling_defaults`` (the model's default sampling values,
      ``kvserve.generation_config.SamplingDefaults``; optional), ``lora_registry``
      (``kvserve.lora.registry.LoRARegistry`` with ``--enable-lora``, else None; optional),
      ``quantization`` (the weights' quantization, ``QuantizationConfig.label``; optional),
      ``serving_facts`` (how the loaded engine holds and batches the model, for ``/version``:
      ``EngineCore.serving_facts``; None while loading; optional).
    """

    model_name: str
    max_model_len: int
    vocab_size: int
    tokenizer: Any
    input_processor: InputProcessor

    @abstractmethod
    async def add_requests(self, requests: list[EngineRequest]) -> RequestStream:
        """Queue the requests of one call, all or none, and return their stream.

        The stream yields ``(prompt index, RequestOutput)`` deltas: only the choices that
        changed, with the new text (detokenized incrementally, never a broken UTF-8 character,
        stop strings cut), new token ids and logprobs, and ``finish_reason`` on a choice's last
        delta. A request's first delta carries ``prompt_logprobs`` (if asked) and
        ``num_cached_tokens``. The stream ends after every choice finished; a failed request
        raises ``RequestFailedError``. ``RequestStream.close()`` aborts what has not finished.

        Raises:
            InvalidRequestError: a request can never fit the KV cache or the queue.
            RequestRejectedError: the queue is full now, or the engine is shutting down / dead.
        """

    async def generate(self, prompt: PromptInput, params: SamplingParams, request_id: str, *,
                       priority: int = 0, cache_salt: str | None = None,
                       arrival_time: float | None = None) -> AsyncIterator[RequestOutput]:
        """One prompt's deltas: validated on a worker thread (``InputProcessor.process``),
        queued, streamed; aborted if the consumer stops early."""
        request = await asyncio.to_thread(self.input_processor.process, request_id, prompt, params,
                                          priority=priority, cache_salt=cache_salt, arrival_time=arrival_time)
        stream = await self.add_requests([request])
        try:
            async for _, output in stream.outputs():
                yield output
        finally:
            stream.close()

    @property
    @abstractmethod
    def is_ready(self) -> bool:
        """True once the model is loaded and the engine loop runs; False if it died."""


class AsyncLLM(EngineClient):
    """The engine in a thread of its own beside the asyncio event loop (see the module docstring).

    The engine thread is the only one that touches the ``EngineCore`` (scheduler, KV cache,
    model) and the ``OutputProcessor`` (detokenizers). When no request is unfinished it sleeps on
    the command queue.

    Args:
        core: a constructed ``EngineCore`` (model loaded).
        input_processor: the model's input processor (tokenizer, vocabulary, context length).
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

    def __init__(self, core: EngineCore, input_processor: InputProcessor, served_model_name: str,
                 stats_consumers: list[Any] | None = None,
                 on_dead: Callable[[BaseException], None] | None = None, kv_event_publisher: Any = None):
        self._init_common(input_processor, served_model_name, stats_consumers, on_dead, kv_event_publisher)
        self._attach(core)

    @classmethod
    def deferred(
        cls,
        factory: Callable[[], EngineCore],
        served_model_name: str,
        *,
        input_processor: InputProcessor,
        sampling_defaults: SamplingDefaults | None = None,
        stats_consumers: list[Any] | None = None,
        on_dead: Callable[[BaseException], None] | None = None,
        kv_event_publisher: Any = None,
        quantization: str | None = None,
    ) -> AsyncLLM:
        """An ``AsyncLLM`` whose engine core is built by ``factory`` on the engine thread after
        ``start()``, so the HTTP server can answer (``/health`` 503) while the weights load. The
        input processor (tokenizer, vocabulary, context length) and the model's sampling
        defaults are given up front.
        ``wait_until_loaded()`` blocks until the engine is ready or failed."""
        self = cls.__new__(cls)
        self._init_common(input_processor, served_model_name, stats_consumers, on_dead, kv_event_publisher)
        self._factory = factory
        self.sampling_defaults = sampling_defaults or SamplingDefaults()
        self.quantization = quantization
        return self

    def _init_common(self, input_processor: InputProcessor, served_model_name: str,
                     stats_consumers: list[Any] | None, on_dead: Callable[[BaseException], None] | None,
                     kv_event_publisher: Any) -> None:
        self.core: EngineCore | None = None
        self._factory: Callable[[], EngineCore] | None = None
        self.model_name = served_model_name
        self.input_processor = input_processor
        self.tokenizer = input_processor.tokenizer
        self.max_model_len = input_processor.max_model_len
        self.vocab_size = input_processor.vocab_size
        self.eos_token_ids = input_processor.eos_token_ids
        self.output_processor = OutputProcessor(self.tokenizer)
        self.quantization: str | None = None
        self.serving_facts: dict[str, Any] | None = None
        self.stats_consumers = list(stats_consumers or [])
        self.on_dead = on_dead
        self.kv_event_publisher = kv_event_publisher
        self.metrics_registry: Any = None
        self.prometheus_metrics: Any = None
        self._commands: queue.SimpleQueue[EngineCommand] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._dead: BaseException | None = None
        self._loaded = threading.Event()
        self.snapshot: SchedulerStats = SchedulerStats()
        self.lora_registry: Any = None

    def _attach(self, core: EngineCore) -> None:
        self.core = core
        if self.lora_registry is None:  # the launcher gives its own (with --lora-modules) up front
            self.lora_registry = core.lora_registry()
        self.sampling_defaults = core.config.model.sampling_defaults
        self.quantization = core.config.model.quantization.label
        self.serving_facts = core.serving_facts()
        self.snapshot = core.make_stats()
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
                and self.core is not None)

    @property
    def dead_reason(self) -> BaseException | None:
        """Why the engine stopped (a load failure or an unattributable failure), else None."""
        return self._dead

    def wait_until_loaded(self, timeout: float | None = None) -> bool:
        """Block until the engine is built (True) or failed / timed out (False)."""
        self._loaded.wait(timeout)
        return self.core is not None and self._dead is None

    @property
    def loading(self) -> bool:
        """Whether the engine is still being built (neither loaded nor failed)."""
        return not self._loaded.is_set()

    @property
    def num_unfinished_requests(self) -> int:
        return len(self.output_processor.requests)

    def engine_stats(self) -> dict[str, float]:
        """The latest scheduler snapshot (updated after every step and command batch)."""
        s = self.snapshot
        return {"num_running": s.num_running, "num_waiting": s.num_waiting, "kv_cache_usage": s.kv_cache_usage}

    # -- the API side (event loop) -----------------------------------------------------------------

    async def add_requests(self, requests: list[EngineRequest]) -> RequestStream:
        """All of ``requests`` are admitted by one engine-thread command (all or none)."""
        if self._dead is not None:
            raise RequestRejectedError(f"the engine is not running: {self._dead}", reason="engine_dead")
        loop = asyncio.get_running_loop()
        stream = RequestStream(requests, loop, self._abort_soon)
        if requests:
            done: asyncio.Future = loop.create_future()
            self._commands.put(AddRequests(stream, done))
            try:
                await done  # raises the admission error, if any
            except asyncio.CancelledError:  # the caller went away before it got the stream
                stream.close()  # the abort follows the add on the command queue
                raise
        return stream

    def _abort_soon(self, request_id: str) -> None:
        self._commands.put(AbortRequest(request_id))

    async def abort(self, request_id: str) -> None:
        """Abort a request (vLLM's ``AsyncLLM.abort``); its KV blocks are freed within one step."""
        self._abort_soon(request_id)

    def abort_all(self, message: str) -> None:
        """Abort every running request; each stream ends with ``RequestRejectedError(message)``
        (reason ``shutting_down``). Thread-safe."""
        self._commands.put(AbortAll(message))

    # -- the engine thread -----------------------------------------------------------------------

    def _run(self) -> None:
        if self.core is None:
            try:
                self._attach(self._factory())
            except BaseException as exc:
                logger.exception("loading the engine failed")
                self._dead = exc
                self._loaded.set()
                return
        try:
            while True:
                block = not self.core.has_unfinished_requests()
                if not self._drain_commands(block):
                    return
                if self.core.has_unfinished_requests():
                    self._step()
                else:
                    self.snapshot = self.core.make_stats()
        except BaseException as exc:  # unattributable: answer everyone, then let the server exit
            self._die(exc)
        finally:
            self.core.shutdown()

    def _end_all(self, error: Callable[[str], BaseException], core_alive: bool = True) -> None:
        """End every request: its stream gets ``error(request_id)``; a live core drops it."""
        for request_id, state in list(self.output_processor.requests.items()):
            child_ids = self.output_processor.remove(request_id)
            if core_alive:
                self.core.finish_requests(child_ids, RequestStatus.FINISHED_ABORTED)
            if state.sink is not None:
                state.sink(error(request_id))

    def _die(self, exc: BaseException) -> None:
        logger.exception("the engine failed and stops: %s", exc)
        self._dead = exc
        self._end_all(lambda request_id: RequestFailedError(f"the engine failed and is restarting: {exc}",
                                                            request_id), core_alive=False)
        if self.on_dead is not None:
            self.on_dead(exc)

    def _drain_commands(self, block: bool) -> bool:
        """Apply queued commands; wait for one first when ``block``. False = stop the loop."""
        interval = self.core.health_check_interval
        try:
            command = self._commands.get(timeout=interval) if block else self._commands.get_nowait()
        except queue.Empty:
            if block:  # idle for a whole interval: are the other ranks still there?
                self.core.check_health()
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
            self._end_all(lambda _: RequestRejectedError(command.message, reason="shutting_down"))
        elif isinstance(command, AbortRequest):
            child_ids = self.output_processor.remove(command.request_id)
            if child_ids:
                self.core.finish_requests(child_ids, RequestStatus.FINISHED_ABORTED)
                for consumer in self.stats_consumers:
                    consumer.on_request_aborted(command.request_id)
        elif isinstance(command, AddRequests):
            self._add(command)

    def _add(self, command: AddRequests) -> None:
        requests = command.stream.requests
        try:
            self.output_processor.check_new(requests)
            self.core.add_requests(requests)
        except Exception as exc:  # noqa: BLE001 - an admission error goes back to the caller
            call_in_loop(command.done.get_loop(), _set_exception, command.done, exc)
            for consumer in self.stats_consumers:
                consumer.on_request_rejected(exc)
            return
        for index, request in enumerate(requests):
            self.output_processor.add_request(request, command.stream.sink(index))
        call_in_loop(command.done.get_loop(), _set_result, command.done, None)  # the caller may be gone

    def _step(self) -> None:
        result = self.core.step()
        processed = self.output_processor.process_outputs(result.outputs)  # the deltas go to the streams
        processed.finish_in(self.core)
        if result.stats is not None:
            self.snapshot = result.stats.scheduler
        for consumer in self.stats_consumers:
            consumer.on_step(result.stats, processed.finished, processed.iteration)
        if result.kv_events and self.kv_event_publisher is not None:
            self.kv_event_publisher.publish(result.kv_events)


def _set_result(future: asyncio.Future, value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future: asyncio.Future, exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
