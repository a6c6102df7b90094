"""Which layers run on kvserve's C++ kernels, decided once per layer when the model is built.

A :class:`KernelLayer` has a C++ kernel path beside its torch code. Its ``ops`` (the kernels, or
None for the torch code) is :func:`kvserve.kernels.kernels_for` the device it is built on (None
under ``meta``, where the loader builds models), and :func:`bind_kernels` sets it again for the
device the loader has put the model on. ``forward`` then checks only what its kernel accepts (the
dtype, the shape), never the machine. Passing None (``bind_kernels(model, None)``) runs a model
on its torch code alone, as a GPU would.
"""

from __future__ import annotations

import torch
from torch import nn

from kvserve.kernels import CpuKernels, kernels_for


class KernelLayer(nn.Module):
    """A layer with a C++ kernel path: ``self.ops`` is the kernels it runs on, or None."""

    def __init__(self):
        super().__init__()
        self.ops: CpuKernels | None = kernels_for(torch.get_default_device())


def bind_kernels(model: nn.Module, device: torch.device | str | None) -> int:
    """Give every ``KernelLayer`` of ``model`` the kernels of ``device`` (None: the torch code
    everywhere). Returns how many layers it set."""
    ops = kernels_for(device)
    layers = [module for module in model.modules() if isinstance(module, KernelLayer)]
    for layer in layers:
        layer.ops = ops
    return len(layers)
