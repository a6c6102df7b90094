"""``--kv-transfer-config``: vLLM's ``KVTransferConfig`` JSON shape, with kvserve's connectors::

    kvserve serve M --kv-transfer-config '{"kv_connector": "DiskConnector", "kv_role": "kv_both",
        "kv_connector_extra_config": {"path": "/var/cache/kvserve", "max_bytes": 10737418240}}'
    kvserve serve M --kv-transfer-config '{"kv_connector": "TcpConnector", "kv_role": "kv_producer",
        "kv_ip": "10.0.0.5", "kv_port": 14579}'
    kvserve serve M --kv-transfer-config '{"kv_connector": "TcpConnector", "kv_role": "kv_consumer",
        "kv_connector_extra_config": {"producers": ["10.0.0.5:14579"]}}'
    kvserve serve M --kv-transfer-config '{"kv_connector": "MultiConnector", "kv_role": "kv_consumer",
        "kv_connector_extra_config": {"connectors": [{"kv_connector": "TcpConnector"},
                                                     {"kv_connector": "DiskConnector", ...}]}}'

and the short forms ``--kv-offloading-size GIB`` (vLLM's: a host-memory tier, looked up before the
disk; on a GPU it holds blocks between the device pool and the disk), ``--kv-offload-dir DIR
[--kv-offload-size GIB]`` (the disk tier) and
``--kv-role producer [--kv-ip IP] [--kv-port PORT]`` / ``--kv-role consumer --kv-producers HOST:PORT ...``
(disaggregated prefill/decode over TCP).

=========================  ==============  =================================================
key                        default         meaning
=========================  ==============  =================================================
kv_connector               (required)      DiskConnector, TcpConnector or MultiConnector
kv_role                    kv_both         kv_producer (a prefill instance: serves its blocks),
                                           kv_consumer (a decode instance: fetches them),
                                           kv_both (the disk tier: reads and writes)
kv_ip                      127.0.0.1       producer: the address consumers reach it at
kv_port                    14579           producer: the TCP port its block server binds
kv_load_failure_policy     recompute       a block that cannot be loaded is computed
extra: path                (required)      DiskConnector: the tier's folder
extra: max_bytes           10 GiB          DiskConnector: size bound (LRU by block)
extra: staging_bytes       1 GiB           TcpConnector: blocks a producer keeps for consumers
                                           (LRU), or a consumer holds between fetch and load
extra: producers           (required)      TcpConnector consumer: the producers' block servers
                                           (HOST:PORT) it may fetch from; a request naming
                                           another is refused (a client cannot plant K/V)
=========================  ==============  =================================================

vLLM's other connectors (``NixlConnector``, ``LMCacheConnectorV1``, ``OffloadingConnector``, ...)
and keys kvserve has no use for (``kv_buffer_device``, ``kv_rank``, ...) are refused by name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kvserve.errors import ConfigError

CONNECTORS = ("DiskConnector", "TcpConnector", "MultiConnector")
ROLES = ("kv_producer", "kv_consumer", "kv_both")
DEFAULT_PORT = 14579  # vLLM's kv_port default
DEFAULT_DISK_BYTES = 10 << 30
DEFAULT_STAGING_BYTES = 1 << 30
_KEYS = ("kv_connector", "kv_role", "kv_ip", "kv_port", "kv_connector_extra_config", "kv_load_failure_policy",
         "engine_id")
_REFUSED_KEYS = {
    "kv_buffer_device": "KV moves between host memory and files or sockets; there is no device buffer",
    "kv_buffer_size": "KV moves between host memory and files or sockets; there is no device buffer",
    "kv_rank": "P/D pairs are set up per request by kvserve route --pd, not by ranks",
    "kv_parallel_size": "P/D pairs are set up per request by kvserve route --pd, not by ranks",
    "kv_connector_module_path": "connectors are kvserve's own (DiskConnector, TcpConnector)",
    "enable_permute_local_kv": "blocks keep one layout",
}


@dataclass(frozen=True)
class DiskTierConfig:
    path: str
    max_bytes: int = DEFAULT_DISK_BYTES


@dataclass(frozen=True)
class PDConfig:
    """Disaggregated prefill/decode: ``role`` ``producer`` (prefill) or ``consumer`` (decode)."""

    role: str
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    staging_bytes: int = DEFAULT_STAGING_BYTES
    producers: tuple[str, ...] = ()  # a consumer's: the block servers it may fetch from, "host:port"

    def __post_init__(self) -> None:
        if self.role == "consumer" and not self.producers:
            raise ConfigError("a P/D consumer (--kv-role consumer) needs the block servers it may fetch from: "
                              "--kv-producers HOST:PORT ... (kv_connector_extra_config.producers), each a prefill "
                              "instance's --kv-ip:--kv-port")
        if self.role == "producer" and self.producers:
            raise ConfigError("--kv-producers applies to --kv-role consumer")
        for producer in self.producers:
            host, _, port = producer.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ConfigError(f"--kv-producers: {producer!r} is not HOST:PORT")


@dataclass(frozen=True)
class KVTransferConfig:
    """What the engine builds its ``KVConnector`` from: a host-memory tier (``host_bytes`` > 0),
    a disk tier, a P/D role, or several."""

    disk: DiskTierConfig | None = None
    pd: PDConfig | None = None
    host_bytes: int = 0

    def __post_init__(self) -> None:
        if self.disk is None and self.pd is None and not self.host_bytes:
            raise ConfigError("--kv-transfer-config: no connector configured")


def _fail(message: str) -> ConfigError:
    return ConfigError(f"--kv-transfer-config: {message}")


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _fail(f"{name} must be an integer >= 1, got {value!r}")
    return value


def _port(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise _fail(f"kv_port must be an integer in 1..65535, got {value!r}")
    return value


def _connector(entry: Any, role: str | None, inherited: dict) -> tuple[DiskTierConfig | None, PDConfig | None]:
    if not isinstance(entry, dict):
        raise _fail(f"a connector must be a JSON object, got {entry!r}")
    for key in entry:
        if key in _REFUSED_KEYS:
            raise _fail(f"{key} is not supported: {_REFUSED_KEYS[key]}")
        if key not in _KEYS:
            raise _fail(f"unknown key {key!r}; accepted: {', '.join(_KEYS)}")
    name = entry.get("kv_connector")
    if name not in CONNECTORS:
        raise _fail(f"kv_connector {name!r} is not supported; kvserve's connectors: {', '.join(CONNECTORS)} "
                    "(docs/kv_tiers.md)")
    role = entry.get("kv_role", role or "kv_both")
    if role not in ROLES:
        raise _fail(f"kv_role must be one of {', '.join(ROLES)}, got {role!r}")
    policy = entry.get("kv_load_failure_policy", "recompute")
    if policy != "recompute":
        raise _fail(f"kv_load_failure_policy {policy!r} is not supported: a block that cannot be loaded is "
                    "recomputed (recompute)")
    extra = entry.get("kv_connector_extra_config", {})
    if not isinstance(extra, dict):
        raise _fail(f"kv_connector_extra_config must be a JSON object, got {extra!r}")
    if name == "MultiConnector":
        return _multi(extra, role, entry)
    allowed = {"DiskConnector": ("path", "max_bytes"), "TcpConnector": ("staging_bytes", "producers")}[name]
    for key in extra:
        if key not in allowed:
            raise _fail(f"{name}: unknown kv_connector_extra_config key {key!r}; accepted: {', '.join(allowed)}")
    if name == "DiskConnector":
        path = extra.get("path")
        if not isinstance(path, str) or not path:
            raise _fail("DiskConnector needs kv_connector_extra_config.path: the tier's folder")
        if role != "kv_both":
            raise _fail(f"DiskConnector reads and writes its folder: kv_role must be kv_both, got {role!r}")
        return DiskTierConfig(path, _positive_int(extra.get("max_bytes", DEFAULT_DISK_BYTES), "max_bytes")), None
    if role == "kv_both":
        raise _fail("TcpConnector: kv_role must be kv_producer (a prefill instance) or kv_consumer (a decode "
                    "instance)")
    merged = {**inherited, **entry}
    host = merged.get("kv_ip", "127.0.0.1")
    if not isinstance(host, str) or not host:
        raise _fail(f"kv_ip must be a host name or address, got {host!r}")
    staging = _positive_int(extra.get("staging_bytes", DEFAULT_STAGING_BYTES), "staging_bytes")
    producers = extra.get("producers", [])
    if not isinstance(producers, list) or not all(isinstance(p, str) for p in producers):
        raise _fail(f"producers must be a list of \"HOST:PORT\" strings, got {producers!r}")
    try:
        return None, PDConfig(role.removeprefix("kv_"), host, _port(merged.get("kv_port", DEFAULT_PORT)), staging,
                              tuple(producers))
    except ConfigError as exc:
        raise _fail(str(exc).replace("--kv-producers HOST:PORT ... (kv_connector_extra_config.producers)",
                                     "kv_connector_extra_config.producers")) from None


def _multi(extra: dict, role: str, entry: dict) -> tuple[DiskTierConfig | None, PDConfig | None]:
    connectors = extra.get("connectors")
    if set(extra) != {"connectors"} or not isinstance(connectors, list) or not connectors:
        raise _fail("MultiConnector needs kv_connector_extra_config.connectors: a list of connectors")
    disk = pd = None
    for inner in connectors:
        if isinstance(inner, dict) and inner.get("kv_connector") == "MultiConnector":
            raise _fail("a MultiConnector cannot hold another MultiConnector")
        inner_role = role if not isinstance(inner, dict) or inner.get("kv_connector") != "DiskConnector" else None
        found_disk, found_pd = _connector(inner, inner_role, entry)
        if (found_disk and disk) or (found_pd and pd):
            raise _fail("a MultiConnector holds at most one connector of each kind")
        disk, pd = disk or found_disk, pd or found_pd
    return disk, pd


def kv_transfer_config_from_json(text: str | dict | None) -> KVTransferConfig | None:
    """Parse ``--kv-transfer-config`` (None when not given).

    Raises:
        ConfigError: not JSON, an unknown or refused key or connector, a bad value (named).
    """
    if text is None:
        return None
    if isinstance(text, str):
        try:
            text = json.loads(text)
        except json.JSONDecodeError as exc:
            raise _fail(f"not valid JSON: {exc}") from None
    disk, pd = _connector(text, None, {})
    return KVTransferConfig(disk=disk, pd=pd)


def kv_transfer_config_from_flags(config: KVTransferConfig | None, offload_dir: str | None,
                                  offload_gib: float | None, role: str | None, port: int | None,
                                  host: str | None, producers: list[str] | None = None,
                                  offloading_gib: float | None = None,
                                  offloading_backend: str | None = None) -> KVTransferConfig | None:
    """Merge the short flags into ``--kv-transfer-config`` (each kind given once).

    Raises:
        ConfigError: a kind given both ways, or a short flag without the one it qualifies.
    """
    disk, pd = (config.disk, config.pd) if config is not None else (None, None)
    if offload_gib is not None and offload_dir is None:
        raise ConfigError("--kv-offload-size needs --kv-offload-dir (the folder of the disk tier)")
    if offload_dir is not None:
        if disk is not None:
            raise ConfigError("--kv-offload-dir and a DiskConnector in --kv-transfer-config: give the disk tier once")
        size = DEFAULT_DISK_BYTES if offload_gib is None else int(offload_gib * (1 << 30))
        if size < 1:
            raise ConfigError(f"--kv-offload-size must be > 0 GiB, got {offload_gib}")
        disk = DiskTierConfig(offload_dir, size)
    if (port is not None or host is not None or producers) and role is None:
        raise ConfigError("--kv-port, --kv-ip and --kv-producers need --kv-role producer|consumer")
    if role is not None:
        if pd is not None:
            raise ConfigError("--kv-role and a TcpConnector in --kv-transfer-config: give the P/D role once")
        if port is not None and not 0 < port < 65536:
            raise ConfigError(f"--kv-port must be in 1..65535, got {port}")
        pd = PDConfig(role, host or "127.0.0.1", DEFAULT_PORT if port is None else port, producers=tuple(producers or ()))
    if offloading_backend not in (None, "native"):
        raise ConfigError(f"--kv-offloading-backend {offloading_backend} is not supported: kvserve's host-memory "
                          "tier is its own (native)")
    if offloading_backend is not None and offloading_gib is None:
        raise ConfigError("--kv-offloading-backend needs --kv-offloading-size (the host tier's GiB)")
    host_bytes = 0 if offloading_gib is None else int(offloading_gib * (1 << 30))
    if offloading_gib is not None and host_bytes < 1:
        raise ConfigError(f"--kv-offloading-size must be > 0 GiB, got {offloading_gib}")
    if disk is None and pd is None and not host_bytes:
        return None
    return KVTransferConfig(disk=disk, pd=pd, host_bytes=host_bytes)
