"""``bind_socket``: connections the server accepts from it have Nagle's algorithm off, so a
response's small writes (headers, then each SSE event) leave at once instead of waiting for the
client's delayed ACK."""

from __future__ import annotations

import asyncio
import socket

from kvserve.api.launcher import bind_socket


def test_accepted_connections_have_tcp_nodelay():
    async def main() -> int:
        sock = bind_socket("127.0.0.1", 0)
        accepted = asyncio.get_running_loop().create_future()

        async def on_client(reader, writer):
            accepted.set_result(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(on_client, sock=sock)
        _, writer = await asyncio.open_connection(*sock.getsockname())
        nodelay = await accepted
        writer.close()
        server.close()
        return nodelay

    assert asyncio.run(main()) != 0
