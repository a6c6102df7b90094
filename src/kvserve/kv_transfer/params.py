"""A request's ``kv_transfer_params`` (vLLM's field, with the keys of its P/D connectors) checked
against the server's role, in one place:

    on a producer (--kv-role producer):  {"do_remote_decode": true}
        -> its response carries {"do_remote_prefill": true, "remote_host", "remote_port",
           "remote_engine_id"} for the decode instance (``KVTransfer.kv_transfer_params``)
    on a consumer (--kv-role consumer):  {"do_remote_prefill": true, "remote_host": H,
                                          "remote_port": P, "remote_engine_id": FINGERPRINT}
        -> the prompt's blocks are fetched from H:P before the request is queued; H:P must be
           one of the consumer's --kv-producers (a client cannot make the server load K/V from
           a server of its choosing); a remote_engine_id that is not this server's fingerprint
           (another model or dtype: an operator's mistake, not the client's) leaves the prompt
           to be computed here
"""

from __future__ import annotations

from typing import Any

from kvserve.errors import InvalidRequestError

KEYS = ("do_remote_decode", "do_remote_prefill", "remote_host", "remote_port", "remote_engine_id")
PARAM = "kv_transfer_params"


def _fail(message: str) -> InvalidRequestError:
    return InvalidRequestError(f"{PARAM}: {message}", param=PARAM)


def check_kv_transfer_params(params: Any, transfer) -> str | None:
    """What the request asks of this server: ``"producer"`` (prefill here, decode elsewhere),
    ``"consumer"`` (prefilled elsewhere) or None (no P/D for this request).

    Args:
        transfer: the engine's ``KVTransfer`` (``kvserve.kv_transfer.setup``), or None.

    Raises:
        InvalidRequestError: not an object, an unknown key, a value of the wrong type, or a role
            this server does not have (named).
    """
    if params is None:
        return None
    if not isinstance(params, dict):
        raise _fail(f"must be an object, got {type(params).__name__}")
    for key, value in params.items():
        if key not in KEYS:
            raise _fail(f"unknown key {key!r}; accepted: {', '.join(KEYS)}")
        if key.startswith("do_") and not isinstance(value, bool):
            raise _fail(f"{key} must be a boolean, got {value!r}")
    host, port, engine = params.get("remote_host"), params.get("remote_port"), params.get("remote_engine_id")
    if host is not None and (not isinstance(host, str) or not host):
        raise _fail(f"remote_host must be the producer's address, got {host!r}")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536):
        raise _fail(f"remote_port must be an integer in 1..65535, got {port!r}")
    if engine is not None and not isinstance(engine, str):
        raise _fail(f"remote_engine_id must be a string, got {engine!r}")
    decode, prefill = params.get("do_remote_decode", False), params.get("do_remote_prefill", False)
    if decode and prefill:
        raise _fail("do_remote_decode and do_remote_prefill cannot both be true")
    if not decode and not prefill:
        return None
    role = "producer" if decode else "consumer"
    own = None if transfer is None or transfer.pd is None else transfer.pd.role
    if own != role:
        flag = f"--kv-role {role}"
        raise _fail(f"{'do_remote_decode' if decode else 'do_remote_prefill'} needs a server started with {flag} "
                    f"(this one: {'no --kv-role' if own is None else '--kv-role ' + own})")
    if role == "consumer":
        if host is None or port is None:
            raise _fail("do_remote_prefill needs remote_host and remote_port (the prefill instance's block server)")
        if f"{host}:{port}" not in transfer.pd.producers:
            raise _fail(f"{host}:{port} is not one of this server's producers (--kv-producers "
                        f"{' '.join(transfer.pd.producers)})")
    return role
