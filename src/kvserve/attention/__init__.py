"""Attention backends, by name. The portable ``torch`` backend is the reference every faster
backend is tested against."""

from __future__ import annotations

from kvserve.attention.backend import AttentionBackend, AttentionMetadata
from kvserve.attention.torch_backend import TorchAttentionBackend
from kvserve.errors import InvalidRequestError

_BACKENDS: dict[str, type[AttentionBackend]] = {
    TorchAttentionBackend.name: TorchAttentionBackend,
}


def get_attention_backend(name: str = "torch") -> AttentionBackend:
    """A new instance of the backend registered as ``name``.

    Raises:
        InvalidRequestError: no backend has that name (the message lists the available ones).
    """
    try:
        return _BACKENDS[name]()
    except KeyError:
        raise InvalidRequestError(
            f"unknown attention backend {name!r}; available: {', '.join(sorted(_BACKENDS))}",
            param="attention_backend",
        ) from None


__all__ = ["AttentionBackend", "AttentionMetadata", "TorchAttentionBackend", "get_attention_backend"]
