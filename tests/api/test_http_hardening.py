"""HTTP behaviour around the API, on the real app over loopback: HEAD /health, Allow on 405,
X-Request-Id, docs behind the key, CORS, root_path, TLS, several served names, and the limits a
slow or greedy client meets (413 body size, 408 body and header deadlines, 431 header count)."""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import subprocess
import time

import httpx
import openai
import pytest
from starlette.requests import Request

from kvserve.api.middleware import request_id_of
from kvserve.api.settings import ServerSettings
from kvserve.testing.tokenizer_kinds import build_tokenizer
from loopback import LoopbackServer
from scripted_engine import ScriptedEngine
from test_server_errors import assert_error


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer("bpe")


def raw_exchange(base_url: str, chunks: list[bytes], pause: float = 0.0, wait: float = 5.0) -> bytes:
    """Send ``chunks`` over one raw TCP connection (``pause`` s apart), then read until the server
    closes it (at most ``wait`` s); returns what the server sent."""
    host, port = base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=wait) as sock:
        try:
            for chunk in chunks:
                sock.sendall(chunk)
                time.sleep(pause)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server closed the connection on us, as it should
        received = b""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                data = sock.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not data:
                break
            received += data
        return received


def test_head_health_and_allow_on_405(tokenizer):
    with LoopbackServer(ScriptedEngine(tokenizer)) as srv, httpx.Client(base_url=srv.base_url) as http:
        head = http.head("/health")
        assert head.status_code == 200 and head.content == b""
        refused = http.post("/health")
        assert_error(refused, 405, type="invalid_request_error")
        assert {m.strip() for m in refused.headers["allow"].split(",")} == {"GET", "HEAD"}
        assert "accepts" in refused.json()["error"]["message"]
        put = http.put("/v1/completions", json={})
        assert put.status_code == 405 and put.headers["allow"] == "POST"


def test_request_id_is_echoed_created_and_exposed(tokenizer):
    server = LoopbackServer(ScriptedEngine(tokenizer), ServerSettings(api_keys=("k",)))
    seen = []

    @server.server.config.app.get("/test-request-id")
    async def echo(request: Request):
        seen.append(request_id_of(request))
        return {"request_id": request_id_of(request)}

    with server as srv, httpx.Client(base_url=srv.base_url) as http:
        key = {"Authorization": "Bearer k"}
        assert http.get("/test-request-id", headers={"X-Request-Id": "trace-42", **key}).headers["x-request-id"] == \
            "trace-42"
        generated = http.get("/test-request-id", headers=key).headers["x-request-id"]
        assert len(generated) == 32 and int(generated, 16) >= 0 and seen == ["trace-42", generated]
        denied = http.get("/v1/models", headers={"X-Request-Id": "on-a-401"})
        assert denied.status_code == 401 and denied.headers["x-request-id"] == "on-a-401"
        long_id = assert_error(http.get("/health", headers={"X-Request-Id": "x" * 257}), 400, param="X-Request-Id")
        assert "at most 256" in long_id["message"]
        client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="k", max_retries=0)
        raw = client.completions.with_raw_response.create(model="scripted-model", prompt="x", max_tokens=2,
                                                          extra_headers={"X-Request-Id": "sdk-1"})
        assert raw.headers["x-request-id"] == "sdk-1"


def test_docs_need_the_key_or_are_off(tokenizer):
    with LoopbackServer(ScriptedEngine(tokenizer), ServerSettings(api_keys=("k",))) as srv, \
            httpx.Client(base_url=srv.base_url) as http:
        for path in ("/docs", "/redoc", "/openapi.json"):
            assert_error(http.get(path), 401, code="invalid_api_key")
            assert http.get(path, headers={"Authorization": "Bearer k"}).status_code == 200
        schema = http.get("/openapi.json", headers={"Authorization": "Bearer k"}).json()
        assert "/v1/chat/completions" in schema["paths"] and "/docs" not in schema["paths"]
    with LoopbackServer(ScriptedEngine(tokenizer)) as srv, httpx.Client(base_url=srv.base_url) as http:
        assert http.get("/docs").status_code == 200 and "/openapi.json" in http.get("/docs").text
    with LoopbackServer(ScriptedEngine(tokenizer), ServerSettings(disable_fastapi_docs=True)) as srv, \
            httpx.Client(base_url=srv.base_url) as http:
        for path in ("/docs", "/redoc", "/openapi.json"):
            assert_error(http.get(path), 404)


def test_cors_as_vllm(tokenizer):
    preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization,content-type"}
    with LoopbackServer(ScriptedEngine(tokenizer)) as srv, httpx.Client(base_url=srv.base_url) as http:
        answer = http.options("/v1/chat/completions", headers=preflight)
        assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == "*"
        assert http.get("/health", headers={"Origin": "https://x.example"}).headers["access-control-allow-origin"] == "*"
    settings = ServerSettings(allowed_origins=("https://app.example",), allow_credentials=True)
    with LoopbackServer(ScriptedEngine(tokenizer), settings) as srv, httpx.Client(base_url=srv.base_url) as http:
        answer = http.options("/v1/chat/completions", headers=preflight)
        assert answer.headers["access-control-allow-origin"] == "https://app.example"
        assert answer.headers["access-control-allow-credentials"] == "true"
        other = http.options("/v1/chat/completions", headers={**preflight, "Origin": "https://evil.example"})
        assert other.status_code == 400 and "access-control-allow-origin" not in other.headers


def test_root_path_behind_a_proxy(tokenizer):
    with LoopbackServer(ScriptedEngine(tokenizer), ServerSettings(root_path="/llm")) as srv, \
            httpx.Client(base_url=srv.base_url) as http:
        assert http.get("/v1/models").json()["data"][0]["id"] == "scripted-model"  # proxy stripped the prefix
        assert http.get("/llm/v1/models").status_code == 200  # or not
        assert "'/llm/openapi.json'" in http.get("/docs").text or '"/llm/openapi.json"' in http.get("/docs").text
        assert http.get("/openapi.json").json()["servers"] == [{"url": "/llm"}]


def test_several_served_names(tokenizer):
    settings = ServerSettings(served_model_name="main-name", served_model_aliases=("alias-1", "alias-2"))
    with LoopbackServer(ScriptedEngine(tokenizer), settings) as srv:
        api = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0)
        assert [m.id for m in api.models.list().data] == ["main-name", "alias-1", "alias-2"]
        for name in ("main-name", "alias-2"):
            assert api.completions.create(model=name, prompt="x", max_tokens=2).model == "main-name"
        assert api.models.retrieve("alias-1").id == "alias-1"
        with pytest.raises(openai.NotFoundError):
            api.completions.create(model="alias-3", prompt="x", max_tokens=2)


def test_body_too_large_is_413(tokenizer):
    settings = ServerSettings(max_request_body_bytes=2000)
    with LoopbackServer(ScriptedEngine(tokenizer), settings) as srv, httpx.Client(base_url=srv.base_url) as http:
        big = {"model": "scripted-model", "prompt": "x" * 3000, "max_tokens": 1}
        error = assert_error(http.post("/v1/completions", json=big), 413, code="request_too_large")
        assert "at most 2000 bytes" in error["message"] and "--max-request-body-bytes" in error["message"]

        def chunks():  # no Content-Length: the limit applies to what arrives
            for _ in range(5):
                yield b" " * 600

        assert_error(http.post("/v1/completions", content=chunks(), headers={"Content-Type": "application/json"}),
                     413, code="request_too_large")
        small = http.post("/v1/completions", json={"model": "scripted-model", "prompt": "x", "max_tokens": 2})
        assert small.status_code == 200 and srv.state.in_flight == 0


def test_slow_body_is_408(tokenizer):
    settings = ServerSettings(body_read_timeout=0.5)
    with LoopbackServer(ScriptedEngine(tokenizer), settings) as srv:
        head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100\r\n\r\n")
        answer = raw_exchange(srv.base_url, [head, b'{"prompt": '], pause=0.0, wait=5)
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        error = json.loads(answer.partition(b"\r\n\r\n")[2])["error"]
        assert error["code"] == "request_timeout" and "within 0.5 s" in error["message"]


def test_slowloris_headers_are_cut_off(tokenizer):
    settings = ServerSettings(header_read_timeout=1.0)
    with LoopbackServer(ScriptedEngine(tokenizer), settings) as srv:
        start = time.monotonic()
        trickle = [b"GET /health HTTP/1.1\r\n"] + [f"X-Pad-{i}: y\r\n".encode() for i in range(40)]
        answer = raw_exchange(srv.base_url, trickle, pause=0.1, wait=10)
        elapsed = time.monotonic() - start
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert b"headers did not arrive within 1 s" in answer and elapsed < 4.0  # not the 4 s of trickling
        idle = raw_exchange(srv.base_url, [], wait=10)  # connects and says nothing: closed quietly
        assert idle == b""
        with httpx.Client(base_url=srv.base_url) as http:  # keep-alive requests are not affected
            assert [http.get("/health").status_code for _ in range(3)] == [200, 200, 200]


def test_too_many_headers_is_431_and_garbage_is_400(tokenizer):
    settings = ServerSettings(h11_max_header_count=20)
    with LoopbackServer(ScriptedEngine(tokenizer), settings) as srv, httpx.Client(base_url=srv.base_url) as http:
        headers = {f"X-Extra-{i}": "1" for i in range(30)}
        assert_error(http.get("/health", headers=headers), 431)
        garbage = raw_exchange(srv.base_url, [b"NOT HTTP AT ALL\r\n\r\n"])
        assert garbage.startswith(b"HTTP/1.1 400 ")
        assert json.loads(garbage.partition(b"\r\n\r\n")[2])["error"]["type"] == "invalid_request_error"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_tls(tokenizer, tmp_path):
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    settings = ServerSettings(ssl_keyfile=str(key), ssl_certfile=str(cert))
    with LoopbackServer(ScriptedEngine(tokenizer), settings) as srv:
        https = srv.base_url.replace("http://", "https://")
        trusted = ssl.create_default_context(cafile=str(cert))
        assert httpx.get(https + "/health", verify=trusted).status_code == 200
        with pytest.raises(httpx.HTTPError):
            httpx.get(srv.base_url + "/health", timeout=3)  # plain HTTP is not spoken there
