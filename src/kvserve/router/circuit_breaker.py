"""A per-worker circuit breaker: passive ejection after failures, half-open probes to return.

    CLOSED ──(failures in a row >= threshold, or a refused connection)──► OPEN
      ▲                                                                   │ open_seconds pass
      └──────────── probe succeeds ◄── HALF_OPEN (one request at a time) ◄┘
                    probe fails ──► OPEN again

Method after SGLang's router (``sgl-router/src/core/circuit_breaker.rs``: closed / open /
half-open, a failure threshold, a success threshold, a timeout before probing).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable


class BreakerState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    """Args:
        failure_threshold: failures in a row that open the breaker.
        open_seconds: how long it stays open before letting one probe through.
        clock: seconds (injected in tests).
    """

    def __init__(self, failure_threshold: int = 3, open_seconds: float = 5.0,
                 clock: Callable[[], float] = time.monotonic):
        self.failure_threshold = failure_threshold
        self.open_seconds = open_seconds
        self.clock = clock
        self.state = BreakerState.CLOSED
        self.failures = 0
        self.opened_at = 0.0
        self.probing = False
        self.num_opened = 0

    def allows(self) -> bool:
        """True when a request may go through now (closed, or half-open with no probe out)."""
        if self.state is BreakerState.OPEN and self.clock() - self.opened_at >= self.open_seconds:
            self.state = BreakerState.HALF_OPEN
            self.probing = False
        if self.state is BreakerState.HALF_OPEN:
            return not self.probing
        return self.state is BreakerState.CLOSED

    def on_attempt(self) -> None:
        """A request is sent (in half-open it is the probe)."""
        if self.state is BreakerState.HALF_OPEN:
            self.probing = True

    def record_success(self) -> None:
        self.failures = 0
        self.probing = False
        self.state = BreakerState.CLOSED

    def record_failure(self, fatal: bool = False) -> bool:
        """A request failed (``fatal``: the connection was refused: the process is gone).
        Returns True when this failure opened the breaker."""
        self.failures += 1
        self.probing = False
        if self.state is BreakerState.OPEN:
            return False
        if fatal or self.state is BreakerState.HALF_OPEN or self.failures >= self.failure_threshold:
            self.state = BreakerState.OPEN
            self.opened_at = self.clock()
            self.num_opened += 1
            return True
        return False
