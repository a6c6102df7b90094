"""Which layers run on kvserve's C++ kernels, decided once per layer when the model is built.

A :class:`KernelLayer` has a kernel path beside its torch code. Its ``ops`` (the kernels, or None
for the torch code) is :func:`kvserve.kernels.kernels_for` the device it is built on (None under
``meta``, where the loader builds models), and :func:`bind_kernels` sets it again for the device
the loader has put the model on. ``forward`` then checks only what its kernel accepts (the dtype,
the shape), never the machine. Passing None (``bind_kernels(model, None)``) runs a model on its
torch code alone.

On a CUDA device the layers that call only RMSNorm, SiLU-and-multiply and the rotary embedding
(``triton_kernels = True``) get those kernels in Triton
(:mod:`kvserve.kernels.triton_elementwise`) when the model's attention runs in Triton too (one
switch: ``--attention-backend triton``, ``auto`` on CUDA; ``torch`` keeps all torch code).
"""

from __future__ import annotations

import torch
from torch import nn

from kvserve.kernels import CpuKernels, kernels_for
from kvserve.kernels.triton_elementwise import TritonElementwise, triton_kernels_for


class KernelLayer(nn.Module):
    """A layer with a kernel path: ``self.ops`` is the kernels it runs on, or None."""

    # True where the layer calls only rms_norm, silu_and_mul and rotary_embedding of its ops
    # (the kernels Triton has).
    triton_kernels = False

    def __init__(self):
        super().__init__()
        self.ops: CpuKernels | TritonElementwise | None = kernels_for(torch.get_default_device())


def bind_kernels(model: nn.Module, device: torch.device | str | None, triton: bool = False) -> int:
    """Give every ``KernelLayer`` of ``model`` the kernels of ``device`` (None: the torch code
    everywhere); with ``triton`` on a CUDA device, the Triton kernels to the layers that take them.
    Returns how many layers it set."""
    ops = kernels_for(device)
    gpu_ops = triton_kernels_for(device) if triton else None
    layers = [module for module in model.modules() if isinstance(module, KernelLayer)]
    for layer in layers:
        layer.ops = gpu_ops if gpu_ops is not None and layer.triton_kernels else ops
    return len(layers)
