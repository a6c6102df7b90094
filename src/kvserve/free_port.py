"""A free TCP port for a server this process starts next (see :func:`free_port`)."""

from __future__ import annotations

import random
import socket
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    """A port of ``host`` nothing is bound to, drawn at random below the kernel's ephemeral range
    (``ip_local_port_range``), for a server started next (``kvserve serve -dp N``'s engines, tests'
    servers). A port the kernel hands out for port 0 is free only until it hands it out again (a
    TCPStore, gloo's connections, any client socket), which happened between a test choosing one
    and its server binding it; a port below the range is taken only by a bind that names it."""
    low = _ephemeral_ports_start()
    draw = random.SystemRandom()  # not a seeded generator: each process its own draws
    for _ in range(200):
        port = draw.randrange(max(1024, low - 12000), low)
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port found below {low} on {host}")


def _ephemeral_ports_start(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> int:
    """The first port the kernel hands out for port 0 (Linux's default range starts at 32768)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768
