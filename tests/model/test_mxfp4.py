"""MXFP4 weights (GPT-OSS's experts): the checkpoint's blocks and scales read as transformers reads
them (``convert_moe_packed_tensors``, the independent reference), kvserve's quantizer against the
OCP rule written out here in numpy, and the round trip to the checkpoint format."""

from __future__ import annotations

import numpy as np
import torch

from kvserve.model.quant_tensor import from_mxfp4, quantize_mxfp4, to_mxfp4

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float64)


def random_blocks(n: int, groups: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (n, groups, 16), generator=gen, dtype=torch.int32).to(torch.uint8)
    scales = torch.randint(118, 130, (n, groups), generator=gen, dtype=torch.int32).to(torch.uint8)
    return blocks, scales


def test_checkpoint_tensors_dequantize_as_transformers_reads_them():
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    blocks, scales = random_blocks(2 * 24, 3, seed=0)  # two experts of 24 outputs, 96 inputs
    ref = convert_moe_packed_tensors(blocks.view(2, 24, 3, 16), scales.view(2, 24, 3), dtype=torch.float32)
    ours = from_mxfp4(blocks, scales).dequantize()  # [N, K]; transformers' is [E, K, N]
    assert torch.equal(ours.view(2, 24, 96).transpose(1, 2), ref)


def np_mxfp4(w: np.ndarray) -> np.ndarray:
    """The OCP Microscaling rule per 32 inputs: X = 2^(floor(log2 max|w|) - 2), each element the
    nearest E2M1 value of w / X (ties to the smaller magnitude, kvserve's choice), clamped to
    +-6; returns the dequantized weight."""
    out = np.zeros_like(w, dtype=np.float64)
    for r in range(w.shape[0]):
        for g in range(0, w.shape[1], 32):
            x = w[r, g:g + 32].astype(np.float64)
            peak = np.abs(x).max()
            scale = 2.0 ** (np.floor(np.log2(peak)) - 2) if peak > 0 else 1.0
            v = np.clip(x / scale, -6, 6)
            for i, value in enumerate(v):
                distances = np.abs(np.abs(value) - E2M1)
                out[r, g + i] = np.sign(value) * E2M1[int(np.argmin(distances))] * scale
    return out


def test_quantizer_is_the_ocp_rule_and_round_trips_through_the_checkpoint_format():
    w = torch.randn(7, 96, generator=torch.Generator().manual_seed(1)) * 3
    w[0, :32] = 0  # an all-zero group
    qt = quantize_mxfp4(w)
    assert qt.codebook == "e2m1" and qt.group_size == 32
    assert np.array_equal(qt.dequantize().double().numpy(), np_mxfp4(w.numpy()))
    blocks, scales = to_mxfp4(qt)
    assert blocks.shape == (7, 3, 16) and scales.dtype == torch.uint8
    again = from_mxfp4(blocks, scales)
    assert torch.equal(again.q, qt.q) and torch.equal(again.scales, qt.scales)
