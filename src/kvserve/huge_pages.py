"""CPU tensors in memory the kernel backs with 2 MiB pages: the packed weights, the KV cache and the
machine probe's buffers.

A decode step streams every weight once. With the default 4 KiB pages each 4 KiB of a 1 GB stream
is a TLB miss and a page walk, and the hardware prefetchers stop at every page boundary: measured
on the 2-vCPU Sapphire Rapids host (docs/benchmarks.md section 3.4), a float32 ``sum`` reads 18-19
GB/s from 4 KiB pages and 29 GB/s from 2 MiB pages, and the 24 layers' AMX linears plus the LM head
of the Qwen2.5-0.5B shape take 0.45-0.90x the time at one row and 0.74-0.89x at 64 rows.

Linux gives an anonymous private mapping transparent huge pages where
``/sys/kernel/mm/transparent_hugepage/enabled`` is ``always``, or ``madvise`` (the usual default)
and the range was advised ``MADV_HUGEPAGE``; glibc's ``malloc`` (hence ``torch.empty``) does not
advise. :func:`empty` maps the bytes itself, aligns the tensor to 2 MiB and advises its whole
2 MiB pages; the tail beyond the last whole page, and the alignment gap before the tensor, stay
small pages (or untouched): no more memory is used than with ``torch.empty``. Small tensors
(under 2 MiB), other devices, other systems and ``KVSERVE_HUGE_PAGES=0`` get ``torch.empty``.
Whether the kernel actually gave huge pages (``never``, fragmented memory) changes speed only.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import sys

import torch

HUGE_PAGE = 2 * 2**20


def enabled() -> bool:
    """Whether :func:`empty` maps huge pages here: Linux, ``MADV_HUGEPAGE`` known to Python, and not
    turned off by ``KVSERVE_HUGE_PAGES=0``."""
    return (sys.platform.startswith("linux") and hasattr(mmap, "MADV_HUGEPAGE")
            and os.environ.get("KVSERVE_HUGE_PAGES", "1") != "0")


def _worth_it(nbytes: int) -> bool:
    """Whether a CPU tensor of ``nbytes`` goes to huge pages: it spans one, and they are on."""
    return nbytes >= HUGE_PAGE and enabled()


def empty(shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised contiguous CPU tensor, in huge pages where it spans at least one (module
    docstring); ``torch.empty`` otherwise. The mapping lives as long as the tensor or any view."""
    nbytes = math.prod(shape) * dtype.itemsize
    if not _worth_it(nbytes):
        return torch.empty(shape, dtype=dtype)
    mapping = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    # frombuffer holds the mapping (a buffer export) for as long as a view of it lives.
    raw = torch.frombuffer(mapping, dtype=torch.uint8)
    start = -raw.data_ptr() % HUGE_PAGE
    with contextlib.suppress(OSError):  # a kernel built without transparent huge pages: small pages
        mapping.madvise(mmap.MADV_HUGEPAGE, start, nbytes // HUGE_PAGE * HUGE_PAGE)
    return raw[start:start + nbytes].view(dtype).view(shape)


def zeros(shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """:func:`empty` filled with zeros."""
    return empty(shape, dtype).zero_()


def place(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s values in huge pages (a contiguous copy made by :func:`empty`), or ``tensor``
    itself where :func:`empty` would not use them (under 2 MiB, not on the CPU, turned off). For
    tensors nothing else writes to: packed weights."""
    if tensor.device.type != "cpu" or not _worth_it(tensor.numel() * tensor.element_size()):
        return tensor
    out = empty(tensor.shape, tensor.dtype)
    out.copy_(tensor)
    return out
