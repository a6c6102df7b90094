"""``kvserve.free_port``: a port below the kernel's ephemeral range, which no port-0 bind (a
TCPStore, gloo, a client socket) can be handed between the choice and the server's bind (``kvserve
serve -dp N``'s engines, the tests' servers), and nothing is bound to when it is returned."""

from __future__ import annotations

import socket

from kvserve import free_port as ports


def test_ports_are_below_the_ephemeral_range_and_free():
    start = ports._ephemeral_ports_start()
    chosen = {ports.free_port() for _ in range(20)}
    assert all(1024 <= port < start for port in chosen) and len(chosen) > 1
    for port in chosen:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", port))  # nothing holds it


def test_the_ephemeral_range_is_read_from_the_kernel_or_linuxs_default(tmp_path):
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("40000\t60999\n")
    assert ports._ephemeral_ports_start(ranges) == 40000
    assert ports._ephemeral_ports_start(tmp_path / "absent") == 32768
