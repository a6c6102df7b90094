"""A scripted OpenAI-shaped worker on 127.0.0.1 (uvicorn in a thread) for proxy tests: it can
answer, fail with a status, stream given bytes, cut a stream after its first chunk, hold a
request until released, or stream without end until its client leaves (``stream_ended``)."""

from __future__ import annotations

import asyncio
import threading
import time

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from fleet_helpers import free_port

STREAM_CHUNKS = [b'data: {"id":"x","choices":[{"index":0,"text":"a\\u00e9"}]}\n\n',
                 b'data: {"id":"x","choices":[{"index":0,"text":" b","finish_reason":"length"}]}\n\n',
                 b"data: [DONE]\n\n"]


class FakeWorker:
    def __init__(self, name: str, model: str = "m", status: int = 200, mode: str = "ok"):
        self.name, self.model, self.status, self.mode = name, model, status, mode
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.seen: list[dict] = []
        self.release = threading.Event()
        self.stream_ended: str | None = None  # "done" or "client_left"
        app = FastAPI()

        @app.get("/health")
        async def health():
            return Response(status_code=200)

        @app.get("/metrics")
        async def metrics():
            return Response("kvserve:num_requests_running{model_name=\"m\",engine=\"0\"} 0\n", media_type="text/plain")

        @app.get("/v1/models")
        async def models():
            return {"object": "list", "data": [{"id": self.model, "object": "model"}]}

        @app.post("/v1/completions")
        async def completions(request: Request):
            body = await request.json()
            self.seen.append({"x-request-id": request.headers.get("x-request-id"), "body": body,
                              "client_port": request.client.port})
            if self.mode == "hold":
                while not self.release.is_set():
                    await asyncio.sleep(0.01)
            if self.status != 200:
                return JSONResponse({"error": {"message": f"{self.name} failed", "type": "server_error",
                                               "param": None, "code": None}}, status_code=self.status)
            if body.get("stream"):
                return StreamingResponse(self._stream(), media_type="text/event-stream")
            return {"worker": self.name, "model": body.get("model")}

        @app.post("/v1/messages")
        async def messages(request: Request):  # Anthropic's route: the headers the router passed on
            body = await request.json()
            self.seen.append({"x-request-id": request.headers.get("x-request-id"), "body": body,
                              "headers": dict(request.headers), "client_port": request.client.port})
            return {"worker": self.name, "model": body.get("model")}

        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    async def _stream(self):
        if self.mode == "endless":
            try:
                while True:
                    yield STREAM_CHUNKS[0]
                    await asyncio.sleep(0.01)
            except (asyncio.CancelledError, GeneratorExit):
                self.stream_ended = "client_left"
                raise
        for i, chunk in enumerate(STREAM_CHUNKS):
            if self.mode == "break" and i == 1:
                raise RuntimeError("worker died mid-stream")  # uvicorn drops the connection
            yield chunk
            await asyncio.sleep(0.01)

    def __enter__(self) -> FakeWorker:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.server.should_exit = True
        self.thread.join(10)
