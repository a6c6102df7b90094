"""One-byte KV caches (``--kv-cache-dtype int8|fp8|fp8_e4m3|fp8_e5m2``): each token's K (and V)
row of one KV head is stored as ``head_dim`` one-byte values and its float32 scale, in the same
cache tensor::

    kv_cache  [2, num_blocks, block_size, num_kv_heads, head_dim + 4]    int8, float8_e4m3fn or float8_e5m2
    row       c_0 c_1 ... c_{D-1} | s (4 bytes: the float32 bits)
    value     x_d ~ float32(c_d) * s            s = max_d |x_d| / CMAX (1 for an all-zero row)

    int8:      c_d = round(x_d / s) in [-127, 127] (half to even),  CMAX = 127
    fp8_e4m3:  c_d = float8_e4m3fn(x_d / s) (round to nearest even), CMAX = 448   (``fp8`` as in vLLM)
    fp8_e5m2:  c_d = float8_e5m2(x_d / s),                            CMAX = 57344

A scale per token and KV head, written by the cache-write path (``write_kv_cache``) from the row
itself: no calibration and no scale state, so a row's stored bytes depend only on its own K/V
values and batch invariance holds as for float caches. The ``cpu_paged`` kernel reads the rows in
place and widens them in registers (``float32(c) * s``; fp8 through a 256-entry table,
``kv_one_byte.h``, ``paged_attention_portable.cpp``); the reference torch backend dequantizes the
rows it gathers (``dequantize_kv_rows``, the same float32 product). Bytes per row: ``head_dim + 4`` against
``2 * head_dim`` (bfloat16): 1.88x the blocks in the same memory at head_dim 64.
"""

from __future__ import annotations

import torch

KV_CACHE_DTYPES = ("auto", "int8", "fp8", "fp8_e4m3", "fp8_e5m2")
SCALE_BYTES = 4
_STORAGE = {"int8": torch.int8, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
_CMAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
ONE_BYTE_DTYPES = tuple(_STORAGE.values())


def normalize_kv_cache_dtype(name: str) -> str:
    """``fp8`` is ``fp8_e4m3`` (vLLM's meaning); other names as given."""
    return "fp8_e4m3" if name == "fp8" else name


def kv_cache_torch_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The cache tensor's dtype: the model's (``auto``) or the one-byte storage dtype."""
    return _STORAGE.get(normalize_kv_cache_dtype(kv_cache_dtype), model_dtype)


def kv_row_size(head_dim: int, kv_cache_dtype: str) -> int:
    """Elements of one (token, KV head) row of the cache tensor."""
    return head_dim if kv_cache_dtype == "auto" else head_dim + SCALE_BYTES


def quantize_kv_rows(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """K or V rows [..., D] (any float dtype) -> ``dtype`` (a one-byte storage dtype) [..., D + 4]
    (module docstring)."""
    cmax = _CMAX[dtype]
    x = x.to(torch.float32)
    scale = x.abs().amax(dim=-1, keepdim=True) / cmax
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    scaled = (x / scale).clamp_(-cmax, cmax)
    codes = torch.round(scaled).to(torch.int8) if dtype == torch.int8 else scaled.to(dtype).view(torch.int8)
    return torch.cat([codes, scale.contiguous().view(torch.int8)], dim=-1).view(dtype)


def dequantize_kv_rows(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One-byte rows [..., D + 4] -> [..., D] in ``dtype``: ``float32(c) * s`` rounded once to
    float32, then to ``dtype``."""
    raw = rows.view(torch.int8)
    scale = raw[..., -SCALE_BYTES:].contiguous().view(torch.float32)
    codes = raw[..., :-SCALE_BYTES].contiguous().view(rows.dtype)
    return (codes.to(torch.float32) * scale).to(dtype)
