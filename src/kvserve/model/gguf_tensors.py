"""GGUF (GGML) tensors -> torch: float types as they are, quantized types re-packed exactly into
kvserve's ``QuantizedTensor`` forms (``kvserve.model.quant_tensor``), which the quantized GEMM
(``kernels/csrc/quant_linear.cpp``) reads without dequantizing.

A GGUF matrix of N rows (outputs) and K columns (inputs) is stored row by row; a quantized row is
K / block consecutive blocks (ggml's ``block_q*`` structs, little-endian). Block layouts and what
each becomes (float16 d, dmin; every product below is exact in float32)::

    F32, F16, BF16   -> float tensor of that dtype (the loader casts it to the model dtype)
    Q8_0  (34 B / 32):  d f16 | q[32] int8                w = d * q
                     -> int8, group 32: scales = d                      (exact, float32)
    Q4_0  (18 B / 32):  d f16 | qs[16]; q[i] = qs[i] & 15, q[i + 16] = qs[i] >> 4;  w = d * (q - 8)
                     -> int4, group 32, symmetric: scales = d           (exact, float16)
    Q4_K (144 B / 256): d f16 | dmin f16 | 12 bytes of eight 6-bit (scale, min) pairs |
                        qs[128]: sub-block 2c = low nibbles of qs[32c:32c+32], 2c+1 = high ones
                        w = d * sc[j] * q - dmin * m[j]                 (j = sub-block of 32)
                     -> int4, group 32, zero points: scales = d * sc, offsets = dmin * m (float32)
    Q6_K (210 B / 256): ql[128] (low 4 bits) | qh[64] (high 2 bits) | sc[16] int8 | d f16
                        w = d * sc[j] * (q - 32)                        (j = sub-block of 16)
                     -> int8, group 16: q - 32, scales = d * sc         (exact, float32)

``QuantizedTensor.dequantize`` of each form computes the same float32 operations as
``gguf.quants.dequantize`` (the tests check the bits). Q4_K and Q6_K cost more bytes in kvserve's
forms (6 and 10 bits per weight against 4.5 and 6.6) but stay exact; other types are refused.
"""

from __future__ import annotations

import numpy as np
import torch

from kvserve.errors import CheckpointError
from kvserve.model.quant_tensor import QuantizedTensor

FLOAT_TYPES = ("F32", "F16", "BF16")
QUANT_TYPES = ("Q8_0", "Q4_0", "Q4_K", "Q6_K")
SUPPORTED_TYPES = FLOAT_TYPES + QUANT_TYPES
_BLOCK_BYTES = {"Q8_0": (32, 34), "Q4_0": (32, 18), "Q4_K": (256, 144), "Q6_K": (256, 210)}


def read_tensor(tensor, rows: torch.Tensor | None = None,
                columns: tuple[int, int] | None = None) -> torch.Tensor | QuantizedTensor:
    """A GGUF tensor (``gguf.ReaderTensor``) as a float tensor (1-D [K] or 2-D [N, K]) or, for a
    quantized matrix, a ``QuantizedTensor`` (module docstring). ``rows``: int64 indices of the N
    rows to take, in that order (the q/k rotary layout of llama files; a tensor-parallel rank's
    rows); ``columns``: a range ``[start, end)`` of the K inputs (a tensor-parallel rank's, in whole
    blocks: ``block_size``). Only the selected part is copied out of the file's memory map.

    Raises:
        CheckpointError: a GGML type kvserve does not read (the message names it and the tensor).
    """
    kind = tensor.tensor_type.name
    if kind not in SUPPORTED_TYPES:
        raise CheckpointError(f"tensor {tensor.name} has GGML type {kind}; kvserve reads "
                              f"{', '.join(SUPPORTED_TYPES)} GGUF tensors")
    shape = [int(d) for d in reversed(tensor.shape.tolist())]  # [N, K] (GGML stores K first)
    if kind in FLOAT_TYPES:
        data = np.asarray(tensor.data)
        if kind == "BF16":  # stored as bytes (numpy has no bfloat16)
            data = data.reshape(-1).view(np.int16)
        raw = torch.from_numpy(_select(data.reshape(shape), rows, columns))
        return raw.view(torch.bfloat16) if kind == "BF16" else raw
    block, size = _BLOCK_BYTES[kind]
    n, k = shape
    blocks = np.asarray(tensor.data).reshape(n, k // block, size)
    if columns is not None and (columns[0] % block or columns[1] % block):
        raise ValueError(f"columns {columns} of {tensor.name} are not whole {kind} blocks of {block}")
    blocks = _select(blocks, rows, None if columns is None else (columns[0] // block, columns[1] // block))
    return _UNPACK[kind](torch.from_numpy(blocks))


def block_size(kind: str) -> int:
    """Inputs per block of GGML type ``kind`` (1 for the float types)."""
    return 1 if kind in FLOAT_TYPES else _BLOCK_BYTES[kind][0]


def _select(data: np.ndarray, rows: torch.Tensor | None, columns: tuple[int, int] | None) -> np.ndarray:
    """A writable copy of ``data[rows][:, start:end]`` (axis 1 in blocks for quantized data)."""
    if rows is not None:
        data = data[rows.numpy()]
    if columns is not None:
        data = data[:, columns[0] : columns[1]]
    return np.array(data, copy=True)


def _f16(raw: torch.Tensor) -> torch.Tensor:
    """float16 values from pairs of little-endian bytes [..., 2] -> [...]."""
    return raw.contiguous().view(torch.float16)[..., 0]


def _q8_0(blocks: torch.Tensor) -> QuantizedTensor:
    n, nb, _ = blocks.shape
    scales = _f16(blocks[:, :, :2]).to(torch.float32)
    q = blocks[:, :, 2:].contiguous().view(torch.int8).reshape(n, nb * 32)
    return QuantizedTensor(q, scales, None, 8, 32)


def _q4_0(blocks: torch.Tensor) -> QuantizedTensor:
    n, nb, _ = blocks.shape
    qs = blocks[:, :, 2:]
    q = torch.cat((qs & 15, qs >> 4), dim=2).reshape(n, nb * 32)
    return QuantizedTensor(q.contiguous(), _f16(blocks[:, :, :2]), None, 4, 32)


def _q4_k_scales(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The eight 6-bit (scale, min) pairs of each Q4_K block: packed uint8 [..., 12] ->
    two int32 [..., 8]. Bytes 0-3 hold scales 0-3 (low 6 bits) and the top 2 bits of scales
    4-7; bytes 4-7 the same for the mins; bytes 8-11 the low 4 bits of scales 4-7 (low nibble)
    and mins 4-7 (high nibble)."""
    p = packed.to(torch.int32)
    sc_lo, m_lo, extra = p[..., 0:4], p[..., 4:8], p[..., 8:12]
    scales = torch.cat((sc_lo & 63, (extra & 15) | ((sc_lo >> 2) & 48)), dim=-1)
    mins = torch.cat((m_lo & 63, (extra >> 4) | ((m_lo >> 2) & 48)), dim=-1)
    return scales, mins


def _q4_k(blocks: torch.Tensor) -> QuantizedTensor:
    n, nb, _ = blocks.shape
    d = _f16(blocks[:, :, 0:2]).to(torch.float32)[:, :, None]
    dmin = _f16(blocks[:, :, 2:4]).to(torch.float32)[:, :, None]
    sc, m = _q4_k_scales(blocks[:, :, 4:16])
    qs = blocks[:, :, 16:].reshape(n, nb, 4, 1, 32)
    q = torch.cat((qs & 15, qs >> 4), dim=3).reshape(n, nb * 256)
    scales = (d * sc.to(torch.float32)).reshape(n, nb * 8)
    offsets = (dmin * m.to(torch.float32)).reshape(n, nb * 8)
    return QuantizedTensor(q.contiguous(), scales, offsets, 4, 32)


def _q6_k(blocks: torch.Tensor) -> QuantizedTensor:
    n, nb, _ = blocks.shape
    ql = blocks[:, :, 0:128].reshape(n, nb, 2, 1, 64)
    qh = blocks[:, :, 128:192].reshape(n, nb, 2, 1, 32)
    low = torch.cat((ql & 15, ql >> 4), dim=3).reshape(n, nb, 8, 32)
    high = torch.cat([(qh >> shift) & 3 for shift in (0, 2, 4, 6)], dim=3).reshape(n, nb, 8, 32)
    q = ((low | (high << 4)).to(torch.int16) - 32).to(torch.int8).reshape(n, nb * 256)
    sc = blocks[:, :, 192:208].contiguous().view(torch.int8).to(torch.float32)
    d = _f16(blocks[:, :, 208:210]).to(torch.float32)[:, :, None]
    return QuantizedTensor(q.contiguous(), (d * sc).reshape(n, nb * 16), None, 8, 16)


_UNPACK = {"Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_K": _q4_k, "Q6_K": _q6_k}
