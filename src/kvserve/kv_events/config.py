"""``--kv-events-config``: vLLM's ``KVEventsConfig`` (``vllm/config/kv_events.py``), same keys,
same defaults, given as one JSON object::

    kvserve serve --kv-events-config '{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557",
                                       "replay_endpoint": "tcp://*:5558", "topic": "kv-events"}'

=======================  ================  ==================================================
key                      default           meaning
=======================  ================  ==================================================
enable_kv_cache_events   false             record prefix-cache events in the KV manager
publisher                zmq if enabled,   ``zmq`` or ``null`` (record nothing, publish nothing)
                         else null
endpoint                 tcp://*:5557      PUB socket: binds when the address has ``*``, ``::``
                                           or is ipc:// / inproc://, else connects
replay_endpoint          null              ROUTER socket answering replay requests
buffer_steps             10000             batches kept for replay (the replay window)
hwm                      100000            ZMQ high-water mark of the PUB socket
max_queue_size           100000            batches waiting for the publisher thread
topic                    ""                first frame of every message
=======================  ================  ==================================================

With ``--data-parallel-size N`` engine rank r publishes on the endpoint's port + r (vLLM's
``offset_endpoint_port``).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Literal

from kvserve.errors import ConfigError


@dataclass(frozen=True)
class KVEventsConfig:
    """vLLM's KV-events configuration (see the module docstring for each key)."""

    enable_kv_cache_events: bool = False
    publisher: Literal["null", "zmq"] | None = None
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    def __post_init__(self) -> None:
        if self.publisher is None:
            object.__setattr__(self, "publisher", "zmq" if self.enable_kv_cache_events else "null")
        if self.publisher not in ("null", "zmq"):
            raise ConfigError(f"--kv-events-config: publisher must be 'zmq' or 'null', got {self.publisher!r}")
        for name in ("buffer_steps", "hwm", "max_queue_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"--kv-events-config: {name} must be an integer >= 1, got {value!r}")

    @property
    def publishes(self) -> bool:
        """True when events are recorded and sent over ZMQ."""
        return self.enable_kv_cache_events and self.publisher == "zmq"

    def for_rank(self, rank: int) -> KVEventsConfig:
        """The configuration of data-parallel engine ``rank`` (ports offset by the rank)."""
        return dataclasses.replace(self, endpoint=offset_endpoint_port(self.endpoint, rank),
                                   replay_endpoint=offset_endpoint_port(self.replay_endpoint, rank))


def offset_endpoint_port(endpoint: str | None, rank: int) -> str | None:
    """``tcp://*:5557`` -> ``tcp://*:5558`` for rank 1; ``inproc://x`` -> ``inproc://x_dp1``
    (vLLM's rule; rank 0 and None are left as they are). kvserve also gives ``ipc://`` paths the
    ``_dp<rank>`` suffix (vLLM refuses them).

    Raises:
        ConfigError: neither tcp, ipc nor inproc.
    """
    if not endpoint or rank == 0:
        return endpoint
    if endpoint.startswith(("inproc://", "ipc://")):
        return f"{endpoint}_dp{rank}"
    if "tcp" in endpoint:
        base, _, port = endpoint.rpartition(":")
        return f"{base}:{int(port) + rank}"
    raise ConfigError(f"--kv-events-config: cannot give data-parallel rank {rank} its own endpoint for "
                      f"{endpoint!r}; use tcp://, ipc:// or inproc://")


def kv_events_config_from_json(text: str | dict | None) -> KVEventsConfig | None:
    """Parse ``--kv-events-config`` (a JSON object, or a dict from the offline path).

    Raises:
        ConfigError: not a JSON object, an unknown key, or a bad value.
    """
    if text is None:
        return None
    try:
        values = dict(json.loads(text) if isinstance(text, str) else text)
    except (json.JSONDecodeError, TypeError, ValueError) as exc:
        raise ConfigError(f"--kv-events-config must be a JSON object: {exc}") from None
    known = {f.name for f in dataclasses.fields(KVEventsConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"--kv-events-config: unknown key {unknown[0]!r}; known: {', '.join(sorted(known))}")
    try:
        return KVEventsConfig(**values)
    except TypeError as exc:
        raise ConfigError(f"--kv-events-config: {exc}") from None
