"""Giving freed host memory back to the operating system while weights are repacked.

Packing a model's linears (``use_invariant_linears``, ``quantize_linears``) frees each float weight
as its packed copy is made. glibc's ``malloc`` raises its mmap threshold as large blocks are freed,
so most weights of a big checkpoint live in its heap, and freed heap memory stays resident: loading
an 11.2 GB Qwen3-30B-A3B-shaped checkpoint (8 layers) held 16.9 GB after packing and peaked at
23.4 GB with the runner, against 10.8 GB after ``malloc_trim``. :class:`HeapTrimmer` trims every
``every_bytes`` freed, which bounds the peak by the model plus that much.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None on other C libraries."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def trim() -> None:
    """Return the C heap's free pages to the operating system (a no-op without glibc)."""
    function = _malloc_trim()
    if function is not None:
        function(0)


class HeapTrimmer:
    """Counts bytes freed and trims the heap each time ``every_bytes`` more were freed."""

    def __init__(self, every_bytes: int = 512 * 2**20):
        self.every_bytes = every_bytes
        self._since = 0

    def freed(self, nbytes: int) -> None:
        self._since += nbytes
        if self._since >= self.every_bytes:
            trim()
            self._since = 0
