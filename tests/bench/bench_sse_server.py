"""A small scripted OpenAI-style SSE server on 127.0.0.1 (uvicorn in a thread), for the bench tests.

Completions stream one chunk per requested token, text ``" w0"``, ``" w1"``, ...; chat streams a
role-only chunk first, then the same words as ``delta.content``. Both end with a usage chunk when
``stream_options.include_usage`` is set, then ``[DONE]``. Control by prompt text:
``FAIL`` -> HTTP 500 ``{"error": ...}``; ``MIDERR`` -> an error event after one chunk;
``NOUSAGE`` anywhere -> no usage chunk (the client must count tokens itself); ``UNICODE`` -> the
words hold U+2028, U+0085, U+2029 and an emoji, sent unescaped (legal JSON) with CRLF line ends,
each event in two network writes cut inside a multi-byte character. The first content
chunk is sent as a multi-line SSE event with a comment line before it, which a correct parser
must join. Every received JSON body is kept in ``ScriptedServer.received``, its headers in
``ScriptedServer.headers``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

MODEL = "scripted-model"
VERSION = {"version": "scripted-1.0"}
PROMPT_TOKENS = 17  # what the scripted server claims in usage.prompt_tokens
UNICODE_WORDS = [" a\u2028b", " c\x85d", " \U0001F642", " e\u2029"]


def prompt_text(body: dict, chat: bool) -> str:
    """The prompt of a completions body, or the last message's text (a string or text parts)."""
    if not chat:
        return body["prompt"]
    content = body["messages"][-1]["content"]
    return content if isinstance(content, str) else "".join(part["text"] for part in content)


def _events(body: dict, chat: bool):
    words = [f" w{i}" for i in range(body.get("max_completion_tokens") or body.get("max_tokens") or 16)]
    text = prompt_text(body, chat)
    if "UNICODE" in text:
        words = UNICODE_WORDS
    if chat:
        yield {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    for i, word in enumerate(words):
        if "MIDERR" in text and i == 1:
            yield {"error": {"message": "scripted failure mid-stream", "type": "server_error"}}
            return
        choice = {"index": 0, "delta": {"content": word}} if chat else {"index": 0, "text": word}
        yield {"choices": [choice]}
    if (body.get("stream_options") or {}).get("include_usage") and "NOUSAGE" not in text:
        n = len(words)
        yield {"choices": [], "usage": {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": n,
                                        "total_tokens": PROMPT_TOKENS + n}}


def make_app(received: list[dict], headers: list[dict], with_version: bool = True, delay_s: float = 0.002) -> FastAPI:
    app = FastAPI()

    if with_version:
        @app.get("/version")
        async def version():
            return VERSION

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": MODEL, "object": "model"}]}

    async def stream(request: Request, chat: bool):
        body = await request.json()
        received.append(body)
        headers.append(dict(request.headers))
        prompt = prompt_text(body, chat)
        if "FAIL" in prompt:
            return JSONResponse({"error": {"message": "scripted 500", "type": "server_error"}}, status_code=500)

        if "UNICODE" in prompt:
            return StreamingResponse(_unicode_gen(body, chat, delay_s), media_type="text/event-stream")

        async def gen():
            for k, event in enumerate(_events(body, chat)):
                await asyncio.sleep(delay_s)
                data = json.dumps(event)
                if k == 0:
                    # A comment, then one event split over two data lines at a place where
                    # JSON allows the newline the parser puts between them.
                    cut = data.index(", ") + 1
                    head, tail = data[:cut], data[cut:]
                    yield f": keep-alive\n\ndata: {head}\ndata:{tail}\n\n"
                else:
                    yield f"data: {data}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(gen(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await stream(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await stream(request, chat=True)

    return app


async def _unicode_gen(body: dict, chat: bool, delay_s: float):
    for event in _events(body, chat):
        await asyncio.sleep(delay_s)
        raw = f"data: {json.dumps(event, ensure_ascii=False)}\r\n\r\n".encode()
        cut = next((i for i, b in enumerate(raw) if b >= 0x80), len(raw) // 2) + 1  # inside a character
        yield raw[:cut]
        await asyncio.sleep(delay_s)
        yield raw[cut:]
    yield b"data: [DONE]\r\n\r\n"


class ScriptedServer:
    """Context manager: ``with ScriptedServer() as s: s.base_url``. Startup and shutdown bounded
    by ``timeout_s``."""

    def __init__(self, with_version: bool = True, timeout_s: float = 10.0):
        self.received: list[dict] = []
        self.headers: list[dict] = []  # the headers of each received body, same order
        config = uvicorn.Config(make_app(self.received, self.headers, with_version), host="127.0.0.1", port=0,
                                log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.timeout_s = timeout_s
        self.base_url = ""

    def __enter__(self) -> ScriptedServer:
        self.thread.start()
        deadline = time.monotonic() + self.timeout_s
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("scripted SSE server did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(self.timeout_s)
