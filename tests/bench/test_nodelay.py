"""The benchmark client's and the router's connections send each write at once (TCP_NODELAY)."""

from __future__ import annotations

import asyncio
import socket

import httpx

from kvserve.net import nodelay_transport


async def _one_request() -> int:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    transport = nodelay_transport(httpx.Limits(max_connections=None))
    try:
        async with httpx.AsyncClient(transport=transport) as client:
            response = await client.get(f"http://127.0.0.1:{port}/")
            assert response.text == "ok"
            stream = response.extensions["network_stream"]
            return stream.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        server.close()
        await server.wait_closed()


def test_nodelay_transport_sets_tcp_nodelay_on_its_connections():
    assert asyncio.run(_one_request()) != 0
