"""``kvserve.huge_pages``: tensors of 2 MiB or more in a 2 MiB-aligned private mapping advised
``MADV_HUGEPAGE`` (which the packed weights, the KV cache and the machine probe use), kept alive by
their views; small tensors and ``KVSERVE_HUGE_PAGES=0`` get ``torch.empty``."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import pytest
import torch

from kvserve import huge_pages

linux_thp = pytest.mark.skipif(not sys.platform.startswith("linux") or not huge_pages.enabled(),
                               reason="huge pages are a Linux mapping advice")


def vm_flags(address: int) -> list[str]:
    """The VmFlags of this process's mapping that holds ``address`` (/proc/self/smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            low, high = (int(part, 16) for part in head.split("-"))
            inside = low <= address < high
        elif inside and head == "VmFlags:":
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@linux_thp
def test_a_large_tensor_is_aligned_advised_and_outlives_its_base():
    t = huge_pages.zeros((3, 1 << 20), torch.float32)  # 12 MiB
    assert t.shape == (3, 1 << 20) and t.dtype == torch.float32 and t.is_contiguous()
    assert t.data_ptr() % huge_pages.HUGE_PAGE == 0
    assert int(t.count_nonzero()) == 0
    if Path("/sys/kernel/mm/transparent_hugepage/enabled").exists():
        assert "hg" in vm_flags(t.data_ptr())  # MADV_HUGEPAGE took
    row = t[2]
    address = row.data_ptr()
    del t
    gc.collect()
    row.fill_(1.5)  # the mapping lives while a view does
    assert row.data_ptr() == address and float(row.sum()) == 1.5 * (1 << 20)


@linux_thp
def test_place_copies_large_tensors_and_leaves_small_ones():
    large = torch.randn(1500, 1000)  # 6 MB
    placed = huge_pages.place(large)
    assert placed is not large and torch.equal(placed, large) and placed.data_ptr() % huge_pages.HUGE_PAGE == 0
    small = torch.randn(10, 10)
    assert huge_pages.place(small) is small
    assert huge_pages.empty((4,), torch.bfloat16).shape == (4,)


def test_turned_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("KVSERVE_HUGE_PAGES", "0")
    assert not huge_pages.enabled()
    large = torch.randn(1500, 1000)
    assert huge_pages.place(large) is large
    assert huge_pages.zeros((1 << 20,), torch.float32).sum() == 0
