"""A model built on the ``meta`` device (shapes, no storage, no random initialisation) and then
given storage for the loader to fill, without the paths of torch that run its Python reference
implementations for meta tensors: those import ``torch._dynamo`` (``nn.Embedding``'s ``normal_``
initialisation) and sympy (``Module.to_empty``'s ``empty_like``), 3-5 s of every process's first
model load (a server's start, each tensor-parallel rank's) for tensors the checkpoint overwrites.
"""

from __future__ import annotations

import torch
from torch import nn


def embedding(num_embeddings: int, embedding_dim: int) -> nn.Embedding:
    """An ``nn.Embedding`` whose weight is left uninitialised (the loader fills it)."""
    return nn.Embedding(num_embeddings, embedding_dim, _weight=torch.empty(num_embeddings, embedding_dim))


def materialize(module: nn.Module, device: torch.device | str) -> nn.Module:
    """``module.to_empty(device=device)``: every parameter and buffer given uninitialised storage
    of its shape and dtype on ``device`` (contiguous, as built)."""
    return module._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device=device))
