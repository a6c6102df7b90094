"""GPTQ and AWQ checkpoints written by the tests, from known integers, with numpy only: an
independent implementation of the formats (from their documentation: AutoGPTQ/GPTQModel's
``qweight``/``qzeros``/``scales``/``g_idx``, AutoAWQ's GEMM layout; kvserve's reader is
``kvserve.model.prequantized``), and the float weights the format defines
(``scale * (q - zero)``), for the reference model.

``write_prequantized(float_dir, out_dir, ref_dir, **format)`` turns a float checkpoint (the
session's random ones) into a quantized folder (out_dir) and a float folder with the dequantized
weights (ref_dir, for transformers), and returns the reference weights by module name.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import load_file, save_file

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Linears that read the same input (GPTQ quantizes them with the same act order).
_SAME_INPUT = {"q_proj": "attn", "k_proj": "attn", "v_proj": "attn", "gate_proj": "mlp", "up_proj": "mlp"}


def pack_along_rows(values: np.ndarray, bits: int = 4) -> np.ndarray:
    """int [pR, C] (p = 32 / bits values per word) -> int32 [R, C]: value pr + i at bits
    bits*i.. of word r (GPTQ qweight)."""
    per = 32 // bits
    rows, cols = values.shape
    out = np.zeros((rows // per, cols), np.uint32)
    for i in range(per):
        out |= values[i::per].astype(np.uint32) << np.uint32(bits * i)
    return out.view(np.int32)


def pack_along_cols(values: np.ndarray, order=None, bits: int = 4) -> np.ndarray:
    """int [R, pC] -> int32 [R, C]: column pc + order[i] at bits bits*i.. of word c (GPTQ qzeros:
    natural order; AWQ qweight/qzeros: ``AWQ_ORDER``)."""
    per = 32 // bits
    order = tuple(range(per)) if order is None else order
    rows, cols = values.shape
    out = np.zeros((rows, cols // per), np.uint32)
    for i in range(per):
        out |= values[:, order[i]::per].astype(np.uint32) << np.uint32(bits * i)
    return out.view(np.int32)


def act_order_g_idx(k: int, group_size: int, rng: np.random.Generator) -> np.ndarray:
    """GPTQ act-order ``g_idx``: inputs visited in a random order (GPTQ's Hessian order), the i-th
    visited input in group i // group_size."""
    visit = rng.permutation(k)
    g_idx = np.empty(k, np.int32)
    g_idx[visit] = np.arange(k) // group_size
    return g_idx


def quantize(w: np.ndarray, g_idx: np.ndarray, groups: int, sym: bool, zero_min: int = 0, bits: int = 4):
    """Round-to-nearest per group of inputs (``g_idx``): q int [N, K] in 0..L-1 (L = 2^bits),
    zeros int [G, N], scales float16 [G, N]. Symmetric: zero L/2, scale max|w| / (L/2 - 1); else
    the range [min, max] (with 0) over 0..L-1, zero = round(-min / scale) clipped to
    [zero_min, L-1]."""
    top, half = (1 << bits) - 1, 1 << (bits - 1)
    n, k = w.shape
    q = np.zeros((n, k), np.int64)
    zeros = np.zeros((groups, n), np.int64)
    scales = np.zeros((groups, n), np.float16)
    for g in range(groups):
        cols = np.nonzero(g_idx == g)[0]
        x = w[:, cols].astype(np.float32)
        if sym:
            s = (np.abs(x).max(axis=1) / (half - 1)).astype(np.float16)
            z = np.full(n, half)
        else:
            lo, hi = np.minimum(x.min(axis=1), 0), np.maximum(x.max(axis=1), 0)
            s = ((hi - lo) / top).astype(np.float16)
            z = np.clip(np.rint(-lo / s.astype(np.float32)), zero_min, top).astype(np.int64)
        s32 = s.astype(np.float32)[:, None]
        q[:, cols] = np.clip(np.rint(x / s32) + z[:, None], 0, top)
        zeros[g], scales[g] = z, s
    return q, zeros, scales


def dequantize(q: np.ndarray, zeros: np.ndarray, scales: np.ndarray, g_idx: np.ndarray) -> np.ndarray:
    """The format's definition, float32 [N, K]: ``scales[g, n] * (q[n, k] - zeros[g, n])``, g = g_idx[k]
    (computed in float64: exact, then float32: exact too for a float16 scale)."""
    s = scales.astype(np.float64)[g_idx].T
    z = zeros[g_idx].T
    return (s * (q - z)).astype(np.float32)


def gptq_tensors(q, zeros, scales, g_idx, checkpoint_format: str, bits: int = 4) -> dict[str, np.ndarray]:
    stored = zeros - 1 if checkpoint_format == "gptq" else zeros
    assert stored.min() >= 0, "v1 stores zero - 1: zero points must be >= 1"
    return {"qweight": pack_along_rows(q.T, bits), "qzeros": pack_along_cols(stored, bits=bits), "scales": scales,
            "g_idx": g_idx.astype(np.int32)}


def awq_tensors(q, zeros, scales) -> dict[str, np.ndarray]:
    return {"qweight": pack_along_cols(q.T, AWQ_ORDER), "qzeros": pack_along_cols(zeros, AWQ_ORDER),
            "scales": scales}


def quantization_config(method: str, group_size: int, desc_act=False, sym=True, checkpoint_format="gptq_v2",
                        bits: int = 4, lm_head: bool = False):
    if method == "gptq":
        return {"quant_method": "gptq", "bits": bits, "group_size": group_size, "desc_act": desc_act, "sym": sym,
                "checkpoint_format": checkpoint_format, "lm_head": lm_head, "true_sequential": True,
                "damp_percent": 0.01}
    return {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True, "version": "gemm",
            "modules_to_not_convert": None}


def quantize_linear(w: np.ndarray, method: str, group_size: int, desc_act: bool, sym: bool,
                    checkpoint_format: str, rng: np.random.Generator, g_idx: np.ndarray | None = None,
                    bits: int = 4):
    """One float [N, K] weight -> (packed tensors, reference float32 weight, g_idx)."""
    n, k = w.shape
    size = k if group_size == -1 else group_size
    if g_idx is None:
        g_idx = act_order_g_idx(k, size, rng) if desc_act else (np.arange(k) // size).astype(np.int32)
    zero_min = 1 if checkpoint_format == "gptq" else 0
    q, zeros, scales = quantize(w, g_idx, k // size, sym, zero_min, bits)
    tensors = gptq_tensors(q, zeros, scales, g_idx, checkpoint_format, bits) if method == "gptq" else \
        awq_tensors(q, zeros, scales)
    return tensors, dequantize(q, zeros, scales, g_idx), g_idx


def write_prequantized(float_dir: Path, out_dir: Path, ref_dir: Path, method: str = "gptq", group_size: int = 32,
                       desc_act: bool = False, sym: bool = False, checkpoint_format: str = "gptq_v2",
                       shared_order: bool = True, seed: int = 0, bits: int = 4, lm_head: bool = False,
                       declare_lm_head: bool | None = None, extra_bias: float | None = None) -> dict[str, np.ndarray]:
    """Quantize every q/k/v/o/gate/up/down projection of ``float_dir`` (a float32 single-file
    checkpoint; the untied LM head too with ``lm_head``) into ``out_dir``; write the dequantized
    weights as float32 into ``ref_dir``. ``shared_order`` False gives q/k/v (and gate/up)
    different act orders; ``declare_lm_head`` writes another ``lm_head`` field than the truth;
    ``extra_bias`` adds a constant bias to each quantized linear that has none (older GPTQ writers
    store zeros).
    Returns module name -> reference weight."""
    projections = PROJECTIONS + (("lm_head",) if lm_head else ())
    rng = np.random.default_rng(seed)
    tensors = load_file(str(float_dir / "model.safetensors"))
    for folder in (out_dir, ref_dir):
        shutil.copytree(float_dir, folder, dirs_exist_ok=True)
    quantized, reference, refs, orders = {}, {}, {}, {}
    for name, value in tensors.items():
        module, _, kind = name.rpartition(".")
        projection = module.rpartition(".")[2]
        if kind != "weight" or projection not in projections:
            quantized[name] = reference[name] = value
            continue
        key = (module.rpartition(".")[0].rpartition(".")[0], _SAME_INPUT.get(projection, projection))
        shared = orders.get(key) if shared_order and method == "gptq" else None
        packed, w_ref, g_idx = quantize_linear(value, method, group_size, desc_act, sym, checkpoint_format, rng,
                                               shared, bits)
        orders[key] = g_idx
        quantized.update({f"{module}.{kind}": t for kind, t in packed.items()})
        if extra_bias is not None and f"{module}.bias" not in tensors:
            quantized[f"{module}.bias"] = np.full(value.shape[0], extra_bias, np.float16)
        reference[name] = refs[module] = w_ref
    save_file(quantized, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    save_file(reference, str(ref_dir / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((float_dir / "config.json").read_text())
    declared = lm_head if declare_lm_head is None else declare_lm_head
    config["quantization_config"] = quantization_config(method, group_size, desc_act, sym, checkpoint_format, bits,
                                                        declared)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    return refs


def torch_reference(refs: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {name: torch.from_numpy(w) for name, w in refs.items()}
