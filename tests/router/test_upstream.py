"""The router's worker-hop client (``kvserve.router.upstream``) against scripted HTTP/1.1 servers
on loopback written byte by byte: bodies arrive whole and in order (chunked and sized), connections
are kept and reused, a stale kept connection is replaced without a failure, and refused, silent or
broken workers fail with UpstreamError."""

from __future__ import annotations

import asyncio

import pytest

from kvserve.free_port import free_port
from kvserve.router.upstream import UpstreamClient, UpstreamError, UpstreamPool

CHUNKS = [b'data: {"text":"a\\u00e9"}\n\n', b'data: {"text":" b"}\n\n', b"data: [DONE]\n\n"]


def _chunked(parts: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


class ScriptedServer:
    """Answers each request with ``answer(n, request_bytes)`` (n: requests so far on the
    connection): bytes, or a list of bytes, pauses (float seconds) and None (close the
    connection there); None alone closes it without an answer."""

    def __init__(self, answer):
        self.answer = answer
        self.requests: list[bytes] = []
        self.connections = 0

    async def __aenter__(self) -> ScriptedServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        n = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length"))
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                answer = self.answer(n, request)
                n += 1
                if answer is None:
                    break
                for piece in answer if isinstance(answer, list) else [answer]:
                    if piece is None:  # close here
                        writer.close()
                        return
                    if isinstance(piece, float):
                        await asyncio.sleep(piece)
                    else:
                        writer.write(piece)
                        await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()


def _ok_stream(n, request):
    return [b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
            _chunked(CHUNKS[:1]).removesuffix(b"0\r\n\r\n"), 0.02, _chunked(CHUNKS[1:])]


def _ok_json(n, request):
    body = b'{"n": %d}' % n
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


def run(coroutine):
    return asyncio.run(coroutine)


def test_a_stream_arrives_whole_in_order_and_the_connection_is_reused():
    async def main():
        async with ScriptedServer(_ok_stream) as server:
            pool = UpstreamPool(server.url)
            for i in range(3):
                response = await pool.request(b"POST", "/v1/completions", [(b"x-request-id", b"r%d" % i)],
                                              b'{"prompt": "x"}', timeout=5)
                assert response.status == 200 and (b"content-type", b"text/event-stream") in response.headers
                pieces = [piece async for piece in response.body_chunks()]
                response.release()
                assert b"".join(pieces) == b"".join(CHUNKS) and all(pieces)
            assert server.connections == 1
            first = server.requests[0]
            assert first.startswith(b"POST /v1/completions HTTP/1.1\r\n") and first.endswith(b'{"prompt": "x"}')
            assert b"x-request-id: r0\r\n" in first and b"content-length: 15\r\n" in first
            pool.close()
    run(main())


def test_a_url_prefix_and_sized_bodies():
    async def main():
        async with ScriptedServer(_ok_json) as server:
            client = UpstreamClient()
            pool = client.pool(server.url + "/base/")
            assert client.pool(server.url + "/base/") is pool
            bodies = []
            for _ in range(2):
                response = await pool.request(b"POST", "/tokenize", [], b"{}", timeout=5)
                bodies.append(await response.read())
                response.release()
            assert bodies == [b'{"n": 0}', b'{"n": 1}'] and server.connections == 1
            assert server.requests[0].startswith(b"POST /base/tokenize HTTP/1.1\r\n")
            client.close()
    run(main())


def test_a_kept_connection_the_worker_closed_is_replaced_without_a_failure():
    # the second request on a connection is dropped unanswered (an idle timeout racing the request)
    async def main():
        async with ScriptedServer(lambda n, r: _ok_json(n, r) if n == 0 else None) as server:
            pool = UpstreamPool(server.url)
            answers = []
            for _ in range(3):
                response = await pool.request(b"POST", "/v1/completions", [], b"{}", timeout=5)
                answers.append(await response.read())
                response.release()
            assert answers == [b'{"n": 0}'] * 3
            assert server.connections == 3 and len(server.requests) == 5  # 2 dropped, each tried again
    run(main())


def test_refused_silent_and_broken_workers_raise():
    async def main():
        with socket_port() as port:
            with pytest.raises(UpstreamError) as refused:
                await UpstreamPool(f"http://127.0.0.1:{port}").request(b"POST", "/", [], b"", timeout=5)
            assert refused.value.connect
        async with ScriptedServer(lambda n, r: [5.0]) as silent:
            with pytest.raises(UpstreamError, match="within 0.2 s") as timed_out:
                await UpstreamPool(silent.url).request(b"POST", "/", [], b"", timeout=0.2)
            assert not timed_out.value.connect
        cut = [b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n", _chunked(CHUNKS[:1])[:-5], 0.05, None]
        async with ScriptedServer(lambda n, r: cut if n == 0 else None) as broken:
            pool = UpstreamPool(broken.url)
            response = await pool.request(b"POST", "/", [], b"", timeout=5)
            pieces = []
            with pytest.raises(UpstreamError):
                async for piece in response.body_chunks():
                    pieces.append(piece)
            response.release()
            assert pieces == [CHUNKS[0]]
            assert not pool._idle  # a broken connection is not kept
    run(main())


class socket_port:
    """A port nothing listens on."""

    def __enter__(self) -> int:
        return free_port()

    def __exit__(self, *exc) -> None:
        pass
