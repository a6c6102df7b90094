"""``pip wheel .`` makes a wheel that carries the kernels prebuilt (``setup.py``): the library of
this CPU's variant is in it, opens, and computes; the sources come along for other CPUs."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from kvserve.kernels import CpuKernels, build, cpu_kernels_available, library

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not cpu_kernels_available(), reason="no C++ compiler for the kernels")


@pytest.mark.slow
def test_pip_wheel_carries_the_kernels_of_this_cpu(tmp_path):
    variant = build.host_variant().name
    env = {**os.environ, "KVSERVE_WHEEL_VARIANTS": variant}  # one variant: the test's time
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", str(REPO),
                             "-w", str(tmp_path)], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    (wheel,) = tmp_path.glob("kvserve-*.whl")
    assert wheel.name.endswith("-py3-none-linux_x86_64.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        member = f"kvserve/kernels/lib/{build.library_name(variant)}"
        assert member in names and "kvserve/kernels/csrc/abi.h" in names and "kvserve/kernels/build.py" in names
        path = Path(archive.extract(member, tmp_path / "unpacked"))
    kernels = CpuKernels(library.Library(path))
    assert kernels.variant == variant
    logits = torch.randn(3, 500)
    assert torch.equal(kernels.argmax_rows(logits), logits.argmax(-1))
