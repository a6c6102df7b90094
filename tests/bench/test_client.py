"""The streaming client against a scripted SSE server on loopback."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from bench_sse_server import PROMPT_TOKENS, UNICODE_WORDS, ScriptedServer

from kvserve.bench.client import RequestFuncInput, send_request
from kvserve.bench.stream import SSELineSplitter


@pytest.fixture(scope="module")
def server():
    with ScriptedServer() as s:
        yield s


def send(server, **kwargs) -> tuple:
    if kwargs.get("endpoint") == "/v1/chat/completions":
        kwargs["api"] = "chat"
    request = RequestFuncInput(**{"prompt": "hello", "prompt_len": 3, "output_len": 4, "model": "m", **kwargs})

    async def go():
        async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as client:
            return await send_request(client, request)

    n = len(server.received)
    out = asyncio.run(go())
    send.headers = server.headers[n:]
    return out, server.received[n:]


def test_completions_stream(server):
    out, bodies = send(server, ignore_eos=True, extra_body={"temperature": 0.5, "top_k": 3},
                       headers={"Authorization": "Bearer k1", "x-extra": "v"}, request_id="bench-ab-7")
    assert out.success, out.error
    assert out.generated_text == " w0 w1 w2 w3"
    assert (out.output_tokens, out.output_tokens_source, out.prompt_len) == (4, "usage", PROMPT_TOKENS)
    assert len(out.itl) == 3 and 0 < out.ttft <= out.latency
    assert out.end_time - out.start_time == out.latency
    # vLLM's completions payload (vllm/benchmarks/lib/endpoint_request_func.py), in its order
    assert [list(b.items()) for b in bodies] == [[
        ("model", "m"), ("prompt", "hello"), ("repetition_penalty", 1.0), ("max_tokens", 4), ("logprobs", None),
        ("stream", True), ("stream_options", {"include_usage": True}), ("ignore_eos", True),
        ("temperature", 0.5), ("top_k", 3)]]
    (headers,) = send.headers
    assert (headers["authorization"], headers["x-extra"], headers["x-request-id"]) == ("Bearer k1", "v", "bench-ab-7")


def test_chat_stream(server):
    out, bodies = send(server, endpoint="/v1/chat/completions", output_len=3)
    assert out.success, out.error
    assert out.generated_text == " w0 w1 w2"
    assert len(out.itl) == 2  # the role-only chunk is not a token
    assert out.output_tokens == 3
    assert bodies[0] == {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}],
                         "max_completion_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}
    assert "x-request-id" not in send.headers[0]


@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/chat/completions"])
def test_unicode_line_separators_inside_json(server, endpoint):
    # U+2028/U+0085 are line breaks for str.splitlines but not for SSE; CRLF framing; characters
    # split across network writes.
    out, _ = send(server, prompt="UNICODE", endpoint=endpoint)
    assert out.success, out.error
    assert out.generated_text == "".join(UNICODE_WORDS)
    assert len(out.itl) == len(UNICODE_WORDS) - 1 and out.output_tokens == len(UNICODE_WORDS)


def test_line_splitter_chunk_boundaries():
    splitter = SSELineSplitter()
    data = "data: x\u2028y\r\n\r\ndata: 🙂\n\ndata: z\r\rtail".encode()
    lines = []
    for i in range(len(data)):  # one byte at a time: every boundary, CRLF and UTF-8 splits included
        lines += splitter.feed(data[i:i + 1])
    assert lines + splitter.flush() == ["data: x\u2028y", "", "data: 🙂", "", "data: z", "", "tail"]


def test_missing_usage_leaves_tokens_unknown(server):
    out, _ = send(server, prompt="NOUSAGE please")
    assert out.success and out.output_tokens is None and out.prompt_len == 3


def test_failures_are_reported(server):
    out, _ = send(server, prompt="FAIL")
    assert not out.success and out.error.startswith("HTTP 500") and "scripted 500" in out.error
    out, _ = send(server, prompt="MIDERR")
    assert not out.success and "scripted failure mid-stream" in out.error


def test_unreachable_server():
    request = RequestFuncInput(prompt="x", prompt_len=1, output_len=1, model="m")

    async def go():
        async with httpx.AsyncClient(base_url="http://127.0.0.1:9", timeout=2) as client:
            return await send_request(client, request)

    out = asyncio.run(go())
    assert not out.success and "ConnectError" in out.error
