"""What the completion and chat handlers share: server state, model and context checks,
admission (rate limits, shutdown), usage, and waiting for a result while watching for disconnect.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from fastapi import Request
from starlette.responses import JSONResponse, Response

from kvserve.api.engine_stream import EngineRequest, start_all
from kvserve.api.errors import APIError
from kvserve.api.rate_limit import RateLimiter
from kvserve.api.responses import PromptTokensDetails, UsageInfo
from kvserve.api.settings import ServerSettings
from kvserve.api.sse import SSEResponse
from kvserve.api.tokenization import TokenText, make_token_text, token_id_text
from kvserve.errors import InvalidRequestError

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
    token_text: TokenText = field(init=False)
    _served_names: frozenset[str] = field(default=frozenset(), init=False)

    def __post_init__(self) -> None:
        self._served_names = frozenset({self.model_name, self.engine.model_name})
        self.token_text = make_token_text(self.engine.tokenizer)

    def logprob_token_text(self, request: SamplingRequest) -> TokenText:
        """How the logprobs of ``request`` name tokens: their text, or ``token_id:<id>`` with
        ``return_tokens_as_token_ids``."""
        return token_id_text if request.return_tokens_as_token_ids else self.token_text

    @property
    def model_name(self) -> str:
        return self.settings.served_model_name or self.engine.model_name

    def check_model(self, model: str | None) -> None:
        """Raises APIError 404 ``model_not_found`` unless ``model`` is None or served here."""
        if model is not None and model not in self._served_names:
            raise APIError(404, f"The model `{model}` does not exist. This server serves "
                                f"`{self.model_name}`.", code="model_not_found", param="model")

    def check_ready(self) -> None:
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


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def resolve_max_tokens(num_prompt_tokens: int, max_tokens: int | None, max_model_len: int,
                       param: str = "max_tokens", allow_zero: bool = False) -> int:
    """The output cap in tokens: ``max_tokens`` or what is left of the context.

    Args:
        allow_zero: accept ``max_tokens=0`` (completions with ``echo``: the prompt is only
            scored, so it may fill the whole context).

    Raises:
        InvalidRequestError: ``max_tokens`` below 1 (below 0 with ``allow_zero``), the prompt
            fills the context, or prompt + max_tokens exceed it (the message gives the numbers).
    """
    least = 0 if allow_zero else 1
    if max_tokens is not None and max_tokens < least:
        raise InvalidRequestError(f"{param} must be >= {least}, got {max_tokens}", param=param)
    prompt_param = "prompt" if param == "max_tokens" else "messages"
    if max_tokens == 0:
        if num_prompt_tokens > max_model_len:
            raise InvalidRequestError(
                f"This model's maximum context length is {max_model_len} tokens. However, your prompt has "
                f"{num_prompt_tokens} tokens. Please shorten the prompt.", param=prompt_param)
        return 0
    if num_prompt_tokens >= max_model_len:
        raise InvalidRequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt has "
            f"{num_prompt_tokens} tokens, which leaves no room for output. Please shorten the prompt.",
            param=prompt_param)
    if max_tokens is None:
        return max_model_len - num_prompt_tokens
    if num_prompt_tokens + max_tokens > max_model_len:
        raise InvalidRequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in the prompt, {max_tokens} "
            f"for the completion). Please reduce the prompt or {param}.", param=param)
    return max_tokens


def check_token_ids(token_ids: list[int], vocab_size: int, param: str = "prompt") -> None:
    """Raises InvalidRequestError when an id is outside ``[0, vocab_size)``."""
    bad = [t for t in token_ids if not 0 <= t < vocab_size]
    if bad:
        raise InvalidRequestError(f"token id {bad[0]} is out of the vocabulary (token ids are "
                                  f"0..{vocab_size - 1})", param=param)


def make_usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> UsageInfo:
    return UsageInfo(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                     total_tokens=prompt_tokens + completion_tokens,
                     prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens))


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


async def respond(state: ServingState, api_key: str, charge: int, engine_requests: list[EngineRequest],
                  make_call: Callable, stream: bool, raw_request: Request) -> Response:
    """Admit a call (rate limits charged ``charge`` tokens), start its engine requests, and
    answer with an SSE stream or, non-streamed, one JSON body (499 if the client left first).

    ``make_call(firsts)`` builds the endpoint's call object from each request's first output; it
    has ``stream(api_key)`` and ``aggregate(api_key)``, which release the admission when done.
    """
    state.admit(api_key, charge)
    try:
        firsts = await start_all(engine_requests)
    except BaseException:
        state.finish(api_key)
        raise
    call = make_call(firsts)
    if stream:
        return SSEResponse(call.stream(api_key))
    finished, body = await until_disconnect(raw_request, call.aggregate(api_key))
    if not finished:
        return Response(status_code=499)
    return JSONResponse(body.model_dump(mode="json"))

