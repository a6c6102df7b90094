"""Greedy decoding: the index of each row's largest logit.

On the CPU, float32 and bfloat16 logits go through the C++ ``argmax_rows`` kernel
(``kvserve/kernels/csrc/argmax.cpp``), which reads bfloat16 in place instead of upcasting a
``[N, V]`` copy first; on CUDA through its Triton twin (``kvserve/kernels/triton_sample.py``);
elsewhere ``torch.argmax``. All return the first index of the maximum, a NaN counting as the
maximum, so the choice is the same with or without a kernel.
"""

from __future__ import annotations

import torch

from kvserve.kernels.triton_sample import SampleKernels


def greedy_argmax(logits: torch.Tensor, ops: SampleKernels | None) -> torch.Tensor:
    """int64 ``[N]``: ``logits.argmax(dim=1)`` for ``[N, V]`` logits of any float dtype, device; on
    ``ops`` (the caller's kernels, ``sample_ops_for`` the logits' device) where they take the dtype."""
    if ops is not None and logits.dtype in (torch.float32, torch.bfloat16) and logits.shape[1] > 0:
        return ops.argmax_rows(logits.contiguous())
    return logits.argmax(dim=1)
