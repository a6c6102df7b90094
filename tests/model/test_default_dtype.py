"""``--dtype auto`` for the engine: bfloat16 on CPUs with native bf16, the checkpoint's elsewhere."""

from __future__ import annotations

import pytest
import torch

from kvserve.model import loader
from kvserve.model.loader import cpu_supports_bf16, default_dtype_for_device


@pytest.mark.parametrize(
    ("stored", "device", "native_bf16", "expected"),
    [
        (torch.float32, "cpu", True, torch.bfloat16),  # fp32 checkpoint cast down on AMX CPUs
        (torch.float16, "cpu", True, torch.bfloat16),
        (torch.bfloat16, "cpu", True, torch.bfloat16),
        (torch.float32, "cpu", False, torch.float32),  # no native bf16: keep float32
        (torch.float16, "cpu", False, torch.float32),
        (torch.bfloat16, "cpu", False, torch.bfloat16),  # a bf16 checkpoint stays bf16
        (torch.float32, "cuda", True, torch.float32),  # CUDA: the checkpoint's dtype
        (torch.float16, "meta", False, torch.float16),
    ],
)
def test_default_dtype(tiny_checkpoint, monkeypatch, stored, device, native_bf16, expected):
    path, _ = tiny_checkpoint("llama", stored)
    monkeypatch.setattr(loader, "cpu_supports_bf16", lambda: native_bf16)
    assert default_dtype_for_device(path, device) == expected


def test_cpu_flags_read_from_proc_cpuinfo():
    with open("/proc/cpuinfo") as f:
        flags = set(f.read().split())
    assert cpu_supports_bf16() == bool(flags & {"amx_bf16", "avx512_bf16"})


def test_load_model_auto_keeps_checkpoint_dtype(tiny_checkpoint):
    """The library call is unchanged: only the engine applies the CPU rule."""
    path, _ = tiny_checkpoint("llama", torch.float32)
    assert loader.load_model(path).dtype == torch.float32
