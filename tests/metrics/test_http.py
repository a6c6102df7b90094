"""RejectionCounterMiddleware: which error responses count as refusals, and with what reason."""

from __future__ import annotations

import json

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from kvserve.metrics.http import RejectionCounterMiddleware, rejection_reason_from_response
from kvserve.metrics.prometheus import PrometheusStatsLogger
from metrics_helpers import sample


def _body(code=None) -> bytes:
    return json.dumps({"error": {"message": "m", "type": "t", "param": None, "code": code}}).encode()


@pytest.mark.parametrize("status, body, reason", [
    (429, _body("queue_full"), "queue_full"),
    (503, _body("shutting_down"), "shutting_down"),
    (400, _body(), "invalid_request"),
    (429, _body(), "rate_limited"),
    (401, _body("invalid_api_key"), "invalid_api_key"),
    (400, b"not json", "invalid_request"),
    (500, _body(), None),
    (200, b"{}", None),
])
def test_reason_from_response(status, body, reason):
    assert rejection_reason_from_response(status, body) == reason


def test_middleware_counts_only_refused_generation_requests():
    app = FastAPI()

    @app.post("/v1/completions")
    async def completions(status: int, code: str | None = None) -> JSONResponse:
        return JSONResponse({"error": {"code": code}} if status >= 400 else {"ok": 1}, status_code=status)

    @app.post("/tokenize")
    async def tokenize() -> JSONResponse:
        return JSONResponse({"error": {"code": "x"}}, status_code=400)

    @app.post("/v1/embeddings")  # the pooling routes count too
    async def embeddings() -> JSONResponse:
        return JSONResponse({"error": {"code": "y"}}, status_code=400)

    registry = CollectorRegistry()
    metrics = PrometheusStatsLogger("m", 16, registry)
    app.add_middleware(RejectionCounterMiddleware, metrics=metrics)
    client = TestClient(app)
    client.post("/v1/completions?status=429&code=queue_full")
    client.post("/v1/completions?status=429&code=queue_full")
    client.post("/v1/completions?status=400")
    client.post("/v1/completions?status=200")
    client.post("/v1/completions?status=500")
    client.post("/tokenize")
    client.post("/v1/embeddings")
    assert sample(registry, "kvserve:request_rejected_total", model_name="m", engine="0", reason="queue_full") == 2
    assert sample(registry, "kvserve:request_rejected_total", model_name="m", engine="0", reason="invalid_request") == 1
    assert sample(registry, "kvserve:request_rejected_total", model_name="m", engine="0", reason="x") == 0
    assert sample(registry, "kvserve:request_rejected_total", model_name="m", engine="0", reason="y") == 1
    assert sample(registry, "kvserve:request_rejected_total", model_name="m", engine="0", reason="500") == 0
