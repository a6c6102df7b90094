"""HTTP side of the online benchmark: one streamed request to an OpenAI-compatible server.

Payloads are those of vLLM's ``vllm bench serve`` (``vllm/benchmarks/lib/endpoint_request_func.py``)
so a server sees the same requests from either tool: ``/v1/completions`` gets ``prompt``,
``max_tokens``, ``repetition_penalty: 1.0`` and ``logprobs``; ``/v1/chat/completions`` gets one user
message with one text part and ``max_completion_tokens``; both ask for ``stream: true`` and
``stream_options.include_usage`` (exact token counts), then ``ignore_eos`` when asked and the extra
body (sampling flags, ``--extra-body``) last. Headers: the caller's (API key, ``--header``), then
``x-request-id``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from kvserve.bench.stream import RequestFuncOutput, SSELineSplitter, SSEParser, StreamAccumulator

Api = Literal["completions", "chat"]
ENDPOINTS: tuple[str, ...] = ("/v1/completions", "/v1/chat/completions")


@dataclass(frozen=True)
class RequestFuncInput:
    """One request to send.

    Attributes:
        prompt: prompt text (the user message for chat).
        prompt_len: its length in tokens by the benchmark's tokenizer.
        output_len: ``max_tokens`` to ask for.
        model: the ``model`` field.
        endpoint: the path posted to (``/v1/completions``, ``/v1/chat/completions``, ...).
        api: ``completions`` or ``chat``: the payload's shape.
        ignore_eos: send vLLM's ``ignore_eos`` so exactly ``output_len`` tokens are generated.
        logprobs: completions' ``logprobs`` (None is sent as null, as vLLM).
        extra_body: more JSON fields merged into the payload last (they win).
        headers: HTTP headers of this request (``x-request-id`` added from ``request_id``).
        request_id: sent as ``x-request-id`` when set.
    """

    prompt: str
    prompt_len: int
    output_len: int
    model: str
    endpoint: str = "/v1/completions"
    api: Api = "completions"
    ignore_eos: bool = False
    logprobs: int | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    request_id: str | None = None


def build_payload(request: RequestFuncInput) -> dict[str, Any]:
    """The JSON body for ``request.api``."""
    payload: dict[str, Any] = {"model": request.model}
    if request.api == "chat":
        payload["messages"] = [{"role": "user", "content": [{"type": "text", "text": request.prompt}]}]
        payload["max_completion_tokens"] = request.output_len
    else:
        payload.update(prompt=request.prompt, repetition_penalty=1.0, max_tokens=request.output_len,
                       logprobs=request.logprobs)
    payload.update(stream=True, stream_options={"include_usage": True})
    if request.ignore_eos:
        payload["ignore_eos"] = True
    payload.update(request.extra_body)
    return payload


def build_headers(request: RequestFuncInput) -> dict[str, str]:
    headers = dict(request.headers)
    if request.request_id:
        headers["x-request-id"] = request.request_id
    return headers


async def send_request(client: httpx.AsyncClient, request: RequestFuncInput) -> RequestFuncOutput:
    """POST ``request`` to ``client.base_url + request.endpoint`` and time its stream.

    Never raises for server or network trouble: a non-200 status, a transport error or an error
    event inside the stream gives ``success=False`` with the reason in ``error``.
    """
    start = time.perf_counter()
    acc = StreamAccumulator(start, request.prompt_len)
    lines, parser = SSELineSplitter(), SSEParser()

    def consume(new_lines: list[str]) -> None:
        now = time.perf_counter()
        for line in new_lines:
            data = parser.feed_line(line)
            if data is not None:
                acc.on_data(data, now)

    try:
        async with client.stream("POST", request.endpoint, json=build_payload(request),
                                 headers=build_headers(request)) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode("utf-8", "replace")
                return acc.finish(time.perf_counter(), f"HTTP {response.status_code}: {body[:500]}")
            async for chunk in response.aiter_bytes():
                consume(lines.feed(chunk))
            consume(lines.flush())
            data = parser.flush()
            if data is not None:
                acc.on_data(data, time.perf_counter())
    except httpx.HTTPError as exc:
        return acc.finish(time.perf_counter(), f"{type(exc).__name__}: {exc}")
    return acc.finish(time.perf_counter())


async def get_json(client: httpx.AsyncClient, path: str) -> tuple[Any, str]:
    """GET ``path``; return ``(json, "")`` or ``(None, reason)`` without raising."""
    try:
        response = await client.get(path)
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc}"
    if response.status_code != 200:
        return None, f"HTTP {response.status_code}: {response.text[:300]}"
    try:
        return response.json(), ""
    except ValueError:
        return None, f"not JSON: {response.text[:300]!r}"
