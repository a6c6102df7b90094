"""What every kernel wrapper (``ops_*.py``) does to a tensor before it passes the pointer: the
checks, with the messages the kernels give, and the pointer itself."""

from __future__ import annotations

import torch

from kvserve.kernels.library import DTYPE_CODES

FLOAT_DTYPES = (torch.float32, torch.bfloat16)


def require(condition: bool, message: str) -> None:
    """Raise ``RuntimeError(message)`` (what a failed kernel check raises) unless ``condition``."""
    if not condition:
        raise RuntimeError(message)


def ptr(tensor: torch.Tensor) -> int:
    """A CPU tensor's data pointer (the kernels read host memory: any other device is refused here,
    for every tensor a wrapper passes)."""
    if tensor.device.type != "cpu":
        raise RuntimeError(f"the CPU kernels take CPU tensors, got one on {tensor.device}")
    return tensor.data_ptr()


def optional_ptr(tensor: torch.Tensor | None) -> int | None:
    """The data pointer, or None (NULL) for an absent tensor."""
    return None if tensor is None else ptr(tensor)


def code(dtype: torch.dtype) -> int:
    return DTYPE_CODES[dtype]


def cpu_contiguous(tensor: torch.Tensor, dims: int, dtypes: tuple[torch.dtype, ...], message: str) -> None:
    """A contiguous CPU tensor of ``dims`` dimensions and one of ``dtypes``, or RuntimeError."""
    require(tensor.dim() == dims and tensor.is_contiguous() and tensor.device.type == "cpu" and tensor.dtype in dtypes,
            message)


def index_tensor(tensor: torch.Tensor, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """A 1-D index tensor as the kernels read it: contiguous, of ``dtype``."""
    require(tensor.dtype == dtype, f"index tensors must be {dtype}")
    return tensor.contiguous()


def optional_bias(bias: torch.Tensor | None, n: int) -> int | None:
    """The bias's pointer (a contiguous float32 [N]), or None when it is absent."""
    if bias is None:
        return None
    require(bias.dtype == torch.float32 and bias.is_contiguous() and bias.numel() == n,
            "bias must be a contiguous float32 [N]")
    return bias.data_ptr()


def optional_offsets(neg_offsets: torch.Tensor | None, bits: int, scale_shape: tuple[int, ...]) -> int | None:
    """The negated int4 offsets' pointer (float32, the scales' shape), or None when absent."""
    if neg_offsets is None:
        return None
    require(bits == 4 and neg_offsets.is_contiguous() and tuple(neg_offsets.shape) == scale_shape
            and neg_offsets.dtype == torch.float32, "offsets (int4 only) must be float32 like the scales")
    return neg_offsets.data_ptr()
