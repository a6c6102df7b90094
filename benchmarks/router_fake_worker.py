"""A zero-work OpenAI-shaped streaming worker for measuring the router's own cost: it answers
/health, /metrics, /v1/models, and streams 16 one-token chunks at once for /v1/completions.

    python benchmarks/router_fake_worker.py PORT
"""

from __future__ import annotations

import json
import sys

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

app = FastAPI()
MODEL = "kvserve-builtin-austen-5m"


@app.get("/health")
async def health():
    return Response(status_code=200)


@app.get("/metrics")
async def metrics():
    return Response("", media_type="text/plain")


@app.get("/v1/models")
async def models():
    return {"object": "list", "data": [{"id": MODEL, "object": "model"}]}


@app.post("/v1/completions")
async def completions(request: Request):
    body = await request.json()
    n = int(body.get("max_tokens") or 16)

    async def stream():
        for i in range(n):
            chunk = {"id": "c", "object": "text_completion", "model": MODEL,
                     "choices": [{"index": 0, "text": " x", "finish_reason": "length" if i == n - 1 else None}]}
            yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"

    if body.get("stream"):
        return StreamingResponse(stream(), media_type="text/event-stream")
    return {"id": "c", "object": "text_completion", "model": MODEL,
            "choices": [{"index": 0, "text": " x" * n, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}}


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
