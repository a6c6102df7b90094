"""HTTP side of the online benchmark: one streamed request to an OpenAI-compatible server.

Payloads follow the OpenAI API: ``/v1/completions`` gets ``prompt`` and ``max_tokens``,
``/v1/chat/completions`` gets one user message and ``max_completion_tokens``; both ask for
``stream: true`` and ``stream_options.include_usage`` so the server reports exact token counts.
``ignore_eos`` is the vLLM extension that keeps generating to ``max_tokens``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from kvserve.bench.stream import RequestFuncOutput, SSELineSplitter, SSEParser, StreamAccumulator

Endpoint = Literal["/v1/completions", "/v1/chat/completions"]
ENDPOINTS: tuple[str, ...] = ("/v1/completions", "/v1/chat/completions")


@dataclass(frozen=True)
class RequestFuncInput:
    """One request to send.

    Attributes:
        prompt: prompt text (the user message for chat).
        prompt_len: its length in tokens by the benchmark's tokenizer.
        output_len: ``max_tokens`` to ask for.
        model: the ``model`` field.
        endpoint: ``/v1/completions`` or ``/v1/chat/completions``.
        ignore_eos: send vLLM's ``ignore_eos`` so exactly ``output_len`` tokens are generated.
        temperature: sampling temperature (0 = greedy).
        extra_body: more JSON fields merged into the payload last (they win).
    """

    prompt: str
    prompt_len: int
    output_len: int
    model: str
    endpoint: str = "/v1/completions"
    ignore_eos: bool = False
    temperature: float = 0.0
    extra_body: dict[str, Any] = field(default_factory=dict)


def build_payload(request: RequestFuncInput) -> dict[str, Any]:
    """The JSON body for ``request.endpoint``."""
    payload: dict[str, Any] = {
        "model": request.model,
        "temperature": request.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.endpoint == "/v1/chat/completions":
        payload["messages"] = [{"role": "user", "content": request.prompt}]
        payload["max_completion_tokens"] = request.output_len
    else:
        payload["prompt"] = request.prompt
        payload["max_tokens"] = request.output_len
    if request.ignore_eos:
        payload["ignore_eos"] = True
    payload.update(request.extra_body)
    return payload


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
        async with client.stream("POST", request.endpoint, json=build_payload(request)) as response:
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
