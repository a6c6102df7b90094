"""A starting server says it is alive: a line on stderr at least every ``interval`` seconds until
it is ready (imports, the C++ kernels' first build, weight loading, the KV cache), naming what it
is doing and how much memory it holds. Standard library only: it starts before the heavy imports.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

PROGRESS_INTERVAL_S = 2.0


def resident_gib() -> float:
    """This process's resident memory in GiB (0 where /proc is not there)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0.0
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**30


class StartProgress:
    """``kvserve: <stage>: 6 s, 1.2 GiB in memory`` every ``interval`` seconds from its creation
    until :meth:`stop`; ``stage`` says what the start is doing now."""

    def __init__(self, stage: str = "starting", interval: float = PROGRESS_INTERVAL_S, out=None):
        self.start = time.perf_counter()
        self.stage = stage
        self._interval, self._out = interval, out
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvserve-start-progress", daemon=True)
        self._thread.start()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        while not self._stopped.wait(self._interval):
            print(f"kvserve: {self.stage}: {self.elapsed():.0f} s, {resident_gib():.1f} GiB in memory",
                  file=self._out or sys.stderr, flush=True)
