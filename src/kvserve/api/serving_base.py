"""What the completion and chat handlers share: server state, model checks, admission (rate
limits, shutdown), usage, the admitted call (``GenerationCall``: SSE chunks or one body), and
waiting for a result while watching for disconnect. Request values are validated by the engine's
input processor, not here.
"""

from __future__ import annotations

import asyncio
import uuid
from contextlib import aclosing
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from fastapi import Request
from pydantic import BaseModel
from starlette.responses import JSONResponse, Response

from kvserve.api.chat_parsers import ChatParsers
from kvserve.api.errors import APIError, to_api_error
from kvserve.api.rate_limit import RateLimiter
from kvserve.api.responses import CompletionTokensDetails, PromptTokensDetails, UsageInfo
from kvserve.api.settings import ServerSettings
from kvserve.api.sse import SSE_DONE, SSEResponse, format_sse
from kvserve.api.tokenization import TokenText, make_token_text, token_id_text
from kvserve.beam_search import BeamSearchParams
from kvserve.engine.beam_search_stream import BeamSearchStream
from kvserve.engine.engine_request import EngineRequest
from kvserve.engine.request_stream import RequestStream
from kvserve.errors import InvalidRequestError
from kvserve.generation_config import SamplingDefaults
from kvserve.kv_transfer.params import check_kv_transfer_params
from kvserve.lora.request import LoRARequest
from kvserve.outputs import RequestOutput
from kvserve.slo.targets import SLOTarget

if TYPE_CHECKING:
    from kvserve.api.protocol import SamplingRequest
    from kvserve.engine.async_llm import EngineClient

T = TypeVar("T")


@dataclass
class ServingState:
    """Live state of one server: the engine, its settings, limits and in-flight accounting.

    ``accepting`` turns False on shutdown: new generation requests then get 503 while
    ``in_flight`` requests finish.
    """

    engine: EngineClient
    settings: ServerSettings
    limiter: RateLimiter
    accepting: bool = True
    in_flight: int = 0
    # Sampling values a request that omits them gets (the model's generation_config.json).
    sampling_defaults: SamplingDefaults = field(init=False)
    token_text: TokenText = field(init=False)
    # Tool-call and reasoning parsers of chat completions (--tool-call-parser, --reasoning-parser).
    chat_parsers: ChatParsers = field(init=False)
    _served_names: frozenset[str] = field(default=frozenset(), init=False)

    def __post_init__(self) -> None:
        """Raises ValueError: a parser flag that cannot work (``ChatParsers.from_settings``)."""
        # vLLM's --served-model-name a b: every name is accepted as `model` (the first is reported).
        self._served_names = frozenset({self.model_name, self.engine.model_name, *self.settings.served_model_names})
        self.token_text = make_token_text(self.engine.tokenizer)
        self.chat_parsers = ChatParsers.from_settings(self.settings, self.engine.tokenizer)
        self.sampling_defaults = getattr(self.engine, "sampling_defaults", None) or SamplingDefaults()

    def slo_target(self, request: SamplingRequest, raw_request: Request | None, api_key: str) -> SLOTarget | None:
        """The request's latency targets: its ``slo`` field over its ``X-SLO-*`` headers over its
        ``--slo-classes`` class (by API key, then priority); None without any.

        Raises:
            InvalidRequestError: a bad target (the field or header is named).
        """
        headers = raw_request.headers if raw_request is not None else {}
        return self.settings.slo_classes.resolve(request.slo or {}, headers, request.priority, api_key)

    def logprob_token_text(self, request: SamplingRequest) -> TokenText:
        """How the logprobs of ``request`` name tokens: their text, or ``token_id:<id>`` with
        ``return_tokens_as_token_ids``."""
        return token_id_text if request.return_tokens_as_token_ids else self.token_text

    @property
    def model_name(self) -> str:
        return self.settings.served_model_name or self.engine.model_name

    @property
    def served_names(self) -> frozenset[str]:
        """Every name of the base model clients may send as ``model``."""
        return self._served_names

    @property
    def lora_registry(self):
        """The engine's adapters (``kvserve.lora.registry.LoRARegistry``), None without LoRA."""
        return getattr(self.engine, "lora_registry", None)

    def check_model(self, model: str | None) -> LoRARequest | None:
        """The adapter ``model`` names (None for the base model or no ``model``).

        Raises:
            APIError: 404 ``model_not_found`` unless ``model`` is None, a served name or a
                loaded adapter's name.
        """
        if model is None or model in self._served_names:
            return None
        registry = self.lora_registry
        lora_request = registry.get(model) if registry is not None else None
        if lora_request is None:
            adapters = "" if registry is None else "".join(f", `{a.lora_name}`" for a in registry.list())
            raise APIError(404, f"The model `{model}` does not exist. This server serves "
                                f"`{self.model_name}`{adapters}.", code="model_not_found", param="model")
        return lora_request

    def response_model_name(self, lora_request: LoRARequest | None) -> str:
        """``model`` in responses: the adapter's name, else the served model's (vLLM)."""
        return lora_request.lora_name if lora_request is not None else self.model_name

    def check_ready(self) -> None:
        """A generation endpoint's first check: :meth:`check_serving`, then the model generates
        (a pooling model answers 400 naming ``model``: ``InputProcessor.check_generates``)."""
        self.check_serving()
        self.engine.input_processor.check_generates()

    def check_serving(self) -> None:
        """Raises APIError 503 while shutting down or while the engine is not ready."""
        if not self.accepting:
            raise APIError(503, "The server is shutting down and accepts no new requests.",
                           code="shutting_down", retry_after=5)
        if not self.engine.is_ready:
            raise APIError(503, "The engine is not ready.", code="engine_not_ready", retry_after=5)

    def admit(self, api_key: str, num_tokens: int) -> None:
        """Charge the rate limits and count the request in flight (undo with :meth:`finish`)."""
        self.limiter.acquire(api_key, num_tokens)
        self.in_flight += 1

    def finish(self, api_key: str) -> None:
        self.limiter.release(api_key)
        self.in_flight -= 1


def new_request_id(prefix: str, raw_request: Request | None = None) -> str:
    """``<prefix>-<X-Request-Id header>-<8 hex>`` when the client sent one (vLLM names requests by
    it; the random tail keeps two requests with the same header apart), else a random id."""
    given = raw_request.headers.get("x-request-id") if raw_request is not None else None
    if given:
        return f"{prefix}-{given}-{uuid.uuid4().hex[:8]}"
    return f"{prefix}-{uuid.uuid4().hex}"


def check_token_ids(token_ids: list[int], vocab_size: int, param: str = "prompt") -> None:
    """Raises InvalidRequestError when an id is outside ``[0, vocab_size)``."""
    bad = [t for t in token_ids if not 0 <= t < vocab_size]
    if bad:
        raise InvalidRequestError(f"token id {bad[0]} is out of the vocabulary (token ids are "
                                  f"0..{vocab_size - 1})", param=param)


def make_usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int,
               reasoning_tokens: int | None = None) -> UsageInfo:
    details = None if reasoning_tokens is None else CompletionTokensDetails(reasoning_tokens=reasoning_tokens)
    return UsageInfo(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                     total_tokens=prompt_tokens + completion_tokens,
                     prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
                     completion_tokens_details=details)


async def until_disconnect(request: Request, work: Awaitable[T]) -> tuple[bool, T | None]:
    """Await ``work`` unless the client disconnects first; then ``work`` is cancelled.

    Returns:
        ``(True, result)`` when the work finished, ``(False, None)`` when the client left.
    Raises:
        whatever ``work`` raises.
    """
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
        await asyncio.gather(task, watcher, return_exceptions=True)
    if task.cancelled():
        return False, None
    return True, task.result()


class GenerationCall(ABC):
    """One admitted call of a generation endpoint: its ``RequestStream``'s deltas become the
    endpoint's SSE chunks (:meth:`stream`) or one response body (:meth:`aggregate`). Both end the
    call (abort what is unfinished, release the admission) on every exit path.

    Subclasses say what a delta adds (``_stream_choices``, ``_absorb``) and how their chunks,
    usage and body look (``_chunk``, ``_usage``, ``_response``).
    """

    def __init__(self, state: ServingState, request: Any, request_id: str, stream: RequestStream):
        self.state = state
        self.request = request
        self.request_id = request_id
        self.request_stream = stream
        self.model_name = state.response_model_name(stream.requests[0].lora_request)  # every prompt's adapter
        self.slo_missed: bool | None = None  # any finished choice missed its latency targets
        self.kv_transfer_params: dict | None = None  # a P/D producer's answer (``start_call``)

    @abstractmethod
    def _stream_choices(self, index: int, output: RequestOutput) -> Iterator[BaseModel]:
        """Apply prompt ``index``'s delta; the chunk choices it sends (each in a chunk of its own)."""

    @abstractmethod
    def _absorb(self, index: int, output: RequestOutput) -> None:
        """Apply prompt ``index``'s delta to the whole response."""

    @abstractmethod
    def _chunk(self, choices: list[BaseModel], usage: UsageInfo | None) -> BaseModel:
        """A stream chunk."""

    @abstractmethod
    def _token_usage(self) -> UsageInfo:
        """The call's token counts so far."""

    def _usage(self) -> UsageInfo:
        """The call's usage so far: the token counts, and ``slo_missed`` once a choice of a request
        with latency targets finished."""
        usage = self._token_usage()
        usage.slo_missed = self.slo_missed
        return usage

    def _note_slo(self, output: RequestOutput) -> None:
        for choice in output.outputs:
            if choice.slo_missed is not None:
                self.slo_missed = bool(self.slo_missed) or choice.slo_missed

    @abstractmethod
    def _response(self) -> BaseModel:
        """The non-streamed body, after every delta was absorbed."""

    def _close(self, api_key: str) -> None:
        self.request_stream.close()
        self.state.finish(api_key)

    async def chunks(self, api_key: str, include_usage: bool) -> AsyncIterator[BaseModel]:
        """The stream's chunk objects: one per choice delta (with ``continuous_usage_stats`` each
        carries the running usage), then the usage chunk when ``include_usage``. Ends the call on
        every exit path (close it with ``contextlib.aclosing``). Other endpoints that speak
        another format (``/v1/responses``, ``/v1/messages``) translate these.

        Raises:
            whatever ``RequestStream.outputs`` raises.
        """
        try:
            async for index, output in self.request_stream.outputs():
                self._note_slo(output)
                for choice in self._stream_choices(index, output):
                    usage = self._usage() if self.request.continuous_usage else None
                    yield self._chunk([choice], usage)
            if include_usage:
                yield self._chunk([], self._usage())
        finally:
            self._close(api_key)

    async def stream(self, api_key: str) -> AsyncIterator[str]:
        """SSE events: the :meth:`chunks`, then ``[DONE]``. An error after the headers went out
        is reported in-band, as vLLM does."""
        exclude = None if self.request.include_usage else {"usage"}
        try:
            async with aclosing(self.chunks(api_key, bool(self.request.include_usage))) as chunks:
                async for chunk in chunks:
                    yield format_sse(chunk.model_dump(mode="json", exclude=exclude))
        except Exception as exc:  # noqa: BLE001 - headers are sent: report in-band
            yield format_sse(to_api_error(exc).body())
        yield SSE_DONE

    async def aggregate(self, api_key: str) -> BaseModel:
        """The non-streamed response: all deltas joined."""
        try:
            async for index, output in self.request_stream.outputs():
                self._note_slo(output)
                self._absorb(index, output)
        finally:
            self._close(api_key)
        return self._response()


async def start_call(state: ServingState, api_key: str, requests: list[EngineRequest],
                     make_call: Callable[[RequestStream], GenerationCall],
                     beam_search: BeamSearchParams | None = None, logprobs: int | None = None,
                     kv_transfer_params: dict | None = None) -> GenerationCall:
    """Admit a call (rate limits charged its prompt tokens plus ``n * max_tokens`` per prompt,
    ``n`` = the beam width for a beam search) and queue its engine requests (all or none) or
    start its beam searches (``beam_search``; ``logprobs``: top logprobs per token of its output).
    The caller must end the call: :meth:`GenerationCall.stream`, ``chunks`` or ``aggregate``.

    ``make_call(stream)`` builds the endpoint's ``GenerationCall`` from the call's ``RequestStream``.
    ``kv_transfer_params`` (disaggregated prefill/decode, ``kvserve.kv_transfer.params``): on a
    decode instance the prompts' blocks are fetched from the prefill instance first; on a prefill
    instance the response says where to fetch them.

    Raises:
        InvalidRequestError, RequestRejectedError: nothing was queued (``add_requests``).
    """
    transfer = getattr(getattr(state.engine, "core", None), "kv_transfer", None)
    role = check_kv_transfer_params(kv_transfer_params, transfer)
    if role is not None and beam_search is not None:
        raise InvalidRequestError("kv_transfer_params: disaggregated prefill/decode does not apply to beam search",
                                  param="kv_transfer_params")
    width = beam_search.beam_width if beam_search is not None else None
    state.admit(api_key, sum(len(r.prompt_token_ids) + (width or r.n) * r.max_tokens for r in requests))
    try:
        if beam_search is not None:
            request_stream = BeamSearchStream(state.engine, requests, beam_search, logprobs)
        else:
            if role == "consumer":  # the prompts' blocks, fetched together
                await asyncio.gather(*(transfer.consumer.prefetch(r, kv_transfer_params) for r in requests))
            request_stream = await state.engine.add_requests(requests)
    except BaseException:
        state.finish(api_key)
        raise
    call = make_call(request_stream)
    if role == "producer":
        call.kv_transfer_params = transfer.kv_transfer_params()
    return call


async def answer(call: GenerationCall, api_key: str, stream: bool, raw_request: Request) -> Response:
    """An admitted call's answer: an SSE stream or, non-streamed, one JSON body (499 if the
    client left first)."""
    if stream:
        return SSEResponse(call.stream(api_key))
    finished, body = await until_disconnect(raw_request, call.aggregate(api_key))
    if not finished:
        return Response(status_code=499)
    return JSONResponse(body.model_dump(mode="json"))
