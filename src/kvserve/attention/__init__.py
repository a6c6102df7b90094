"""Attention backends, by name. The portable ``torch`` backend is the reference every faster
backend is tested against; ``cpu_paged`` is the C++ kernel for CPUs; ``triton`` the Triton kernels
for NVIDIA GPUs (when the triton package is installed); ``auto`` picks the fastest one that works
for a device."""

from __future__ import annotations

import torch

from kvserve.attention.backend import AttentionBackend, AttentionMetadata
from kvserve.attention.cpu_paged import CpuPagedAttentionBackend, cpu_paged_available
from kvserve.attention.torch_backend import TorchAttentionBackend
from kvserve.attention.triton_paged import TritonPagedAttentionBackend, triton_available, triton_refuses
from kvserve.errors import ConfigError

_BACKENDS: dict[str, type[AttentionBackend]] = {
    TorchAttentionBackend.name: TorchAttentionBackend,
    CpuPagedAttentionBackend.name: CpuPagedAttentionBackend,
    TritonPagedAttentionBackend.name: TritonPagedAttentionBackend,
}


def get_attention_backend(name: str = "torch", device: str | torch.device = "cpu", kv_cache_dtype: str = "auto",
                          block_size: int = 16) -> AttentionBackend:
    """A new instance of the backend registered as ``name``.

    ``auto``: ``cpu_paged`` on a CPU device when its kernel builds here, ``triton`` on a CUDA
    device when triton imports and takes the cache (``triton_refuses``), else ``torch``.

    Raises:
        ConfigError: no backend has that name (the message lists the available ones); ``triton``
            with a cache it does not read (named, with the fix).
        RuntimeError: ``cpu_paged`` was asked for by name and its kernel cannot be built.
    """
    refusal = triton_refuses(kv_cache_dtype != "auto", block_size)
    if name == "auto":
        kind = torch.device(device).type
        if kind == "cpu" and cpu_paged_available():
            name = CpuPagedAttentionBackend.name
        elif kind == "cuda" and triton_available() and refusal is None:
            name = TritonPagedAttentionBackend.name
        else:
            name = TorchAttentionBackend.name
    elif name == TritonPagedAttentionBackend.name and refusal is not None:
        raise ConfigError(refusal)
    try:
        backend_cls = _BACKENDS[name]
    except KeyError:
        raise ConfigError(
            f"unknown attention backend {name!r}; available: auto, {', '.join(sorted(_BACKENDS))}"
        ) from None
    return backend_cls()


__all__ = [
    "AttentionBackend",
    "AttentionMetadata",
    "CpuPagedAttentionBackend",
    "TorchAttentionBackend",
    "TritonPagedAttentionBackend",
    "cpu_paged_available",
    "get_attention_backend",
    "triton_refuses",
]
