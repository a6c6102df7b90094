"""Q4_K and Q6_K encoders for tests (the ``gguf`` package only dequantizes these types).

Plain round-to-nearest with the block layouts of ggml's ``block_q4_K`` / ``block_q6_K`` (written
out in ``kvserve.model.gguf_tensors``); llama.cpp's quantizer searches scales more carefully, so
its files differ in the values but not in the layout. Whether the bytes are read right is decided
by ``gguf.quants.dequantize``, which the tests compare against.

    encode_q4_k(w)  float32 [N, K] -> uint8 [N, K / 256 * 144]
    encode_q6_k(w)  float32 [N, K] -> uint8 [N, K / 256 * 210]     (K a multiple of 256)
    q4_k_m_mix      a ``quantize`` hook for ``kvserve.testing.gguf_export.export_gguf``
"""

from __future__ import annotations

import numpy as np


def _f16(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(float16 bytes [..., 2], the float32 value of the float16)."""
    half = values.astype(np.float16)
    return half.reshape(*half.shape, 1).view(np.uint8), half.astype(np.float32)


def _safe_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b != 0, a / np.where(b != 0, b, 1), 0)


def encode_q4_k(weight: np.ndarray) -> np.ndarray:
    """Q4_K blocks of ``weight`` (module docstring): per 32 inputs a 6-bit scale and min of the
    block's float16 ``d`` and ``dmin``; ``w ~ d * sc * q - dmin * m``, q in 0..15."""
    n, k = weight.shape
    x = weight.astype(np.float32).reshape(n * k // 256, 8, 32)
    low = np.minimum(x.min(axis=2), 0)
    scale_f = (x.max(axis=2) - low) / 15
    d_bytes, d = _f16(scale_f.max(axis=1) / 63)
    dmin_bytes, dmin = _f16(-low.min(axis=1) / 63)
    sc = np.clip(np.round(_safe_div(scale_f, d[:, None])), 0, 63).astype(np.uint8)
    m = np.clip(np.round(_safe_div(-low, dmin[:, None])), 0, 63).astype(np.uint8)
    step = (d[:, None] * sc)[:, :, None]
    q = np.clip(np.round(_safe_div(x + (dmin[:, None] * m)[:, :, None], step)), 0, 15).astype(np.uint8)
    scales = np.concatenate([(sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6),
                             (m[:, :4] & 63) | ((m[:, 4:] >> 4) << 6),
                             (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4)], axis=1)
    pairs = q.reshape(-1, 4, 2, 32)
    qs = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(-1, 128)
    blocks = np.concatenate([d_bytes, dmin_bytes, scales, qs], axis=1)
    return blocks.reshape(n, k // 256 * 144)


def encode_q6_k(weight: np.ndarray) -> np.ndarray:
    """Q6_K blocks of ``weight`` (module docstring): per 16 inputs an int8 scale of the block's
    float16 ``d``; ``w ~ d * sc * (q - 32)``, q in 0..63."""
    n, k = weight.shape
    x = weight.astype(np.float32).reshape(n * k // 256, 16, 16)
    peak = np.take_along_axis(x, np.abs(x).argmax(axis=2)[:, :, None], axis=2)[:, :, 0]
    scale_f = peak / -32
    d_bytes, d = _f16(np.abs(scale_f).max(axis=1) / 127)
    sc = np.clip(np.round(_safe_div(scale_f, d[:, None])), -128, 127).astype(np.int8)
    step = (d[:, None] * sc.astype(np.float32))[:, :, None]
    q = (np.clip(np.round(_safe_div(x, step)), -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 4, 32)
    low, high = q & 15, q >> 4
    ql = np.concatenate([low[:, :, 0] | (low[:, :, 2] << 4), low[:, :, 1] | (low[:, :, 3] << 4)], axis=2)
    qh = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)
    blocks = np.concatenate([ql.reshape(-1, 128), qh.reshape(-1, 64), sc.view(np.uint8), d_bytes], axis=1)
    return blocks.reshape(n, k // 256 * 210)


def q4_k_m_mix(name: str, weight: np.ndarray):
    """llama.cpp's Q4_K_M split, simplified: attn_v, ffn_down and the LM head (``output``) in Q6_K,
    every other matrix in Q4_K (llama.cpp gives some layers' attn_v/ffn_down Q4_K too). Returns
    (blocks, ``GGMLQuantizationType``) for ``export_gguf(quantize=...)``."""
    from gguf import GGMLQuantizationType

    if name.endswith(("attn_v.weight", "ffn_down.weight", "output.weight")):
        return encode_q6_k(weight), GGMLQuantizationType.Q6_K
    return encode_q4_k(weight), GGMLQuantizationType.Q4_K
