"""The floor of a Python hop: a TCP relay on asyncio that copies bytes both ways without reading
them (one worker connection per client connection, no HTTP parsing, no routing). Anything an
HTTP-aware router does costs at least this much; benchmarks/router.py measures it beside the router.

    python benchmarks/router_floor_relay.py LISTEN_PORT TARGET_PORT
"""

from __future__ import annotations

import asyncio
import signal
import sys


class _Pipe(asyncio.Protocol):
    """One side of a relayed connection: what it receives is written to its peer."""

    def __init__(self):
        self.transport: asyncio.Transport | None = None
        self.peer: _Pipe | None = None
        self.early: list[bytes] = []  # bytes from the client before the worker connection was up

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.write(data)
        else:
            self.early.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


async def main(listen_port: int, target_port: int) -> None:
    loop = asyncio.get_running_loop()

    def client_side() -> _Pipe:
        pipe = _Pipe()

        async def connect() -> None:
            try:
                _, worker = await loop.create_connection(_Pipe, "127.0.0.1", target_port)
            except OSError:
                pipe.transport.close()
                return
            worker.peer, pipe.peer = pipe, worker
            for data in pipe.early:
                worker.transport.write(data)
            pipe.early.clear()

        loop.call_soon(lambda: loop.create_task(connect()))
        return pipe

    server = await loop.create_server(client_side, "127.0.0.1", listen_port)
    stop = loop.create_future()
    loop.add_signal_handler(signal.SIGTERM, stop.set_result, None)
    async with server:
        await stop


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
