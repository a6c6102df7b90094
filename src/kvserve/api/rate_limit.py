"""Per-API-key admission limits: requests per minute, tokens per minute, requests in flight.

Rates use token buckets (each key has one bucket per limit): a bucket holds at most ``capacity``
units (the per-minute limit, so a quiet key may burst one minute's worth), refills continuously
at ``capacity / 60`` units per second, and a request is admitted only if every bucket can pay its
charge at once (1 request; prompt + max_tokens tokens). Otherwise nothing is charged and the
client gets 429 with ``Retry-After`` = seconds until the emptiest bucket would have enough.

    tokens
    capacity ┤‾‾‾‾╲        ╱‾‾‾‾‾        a charge of c takes the level down by c;
             │     ╲     ╱               the level climbs back at capacity/60 per second
             │      ╲__╱
             └────────────────── time
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kvserve.api.errors import APIError

Clock = Callable[[], float]


@dataclass
class TokenBucket:
    """A continuously refilled bucket (units, seconds from ``clock``); starts full."""

    capacity: float
    refill_per_second: float
    clock: Clock = time.monotonic
    level: float = field(init=False)
    updated: float = field(init=False)

    def __post_init__(self) -> None:
        self.level = self.capacity
        self.updated = self.clock()

    def _refill(self) -> None:
        now = self.clock()
        self.level = min(self.capacity, self.level + (now - self.updated) * self.refill_per_second)
        self.updated = now

    def wait_time(self, amount: float) -> float:
        """Seconds until ``amount`` units are available (0 = now; ``inf`` if over capacity)."""
        self._refill()
        if amount > self.capacity:
            return math.inf
        missing = amount - self.level
        return 0.0 if missing <= 0 else missing / self.refill_per_second

    def take(self, amount: float) -> None:
        """Remove ``amount`` units; call only after ``wait_time(amount) == 0``."""
        self._refill()
        assert self.level >= amount - 1e-9, "take() without a successful wait_time()"
        self.level -= amount


@dataclass
class _KeyState:
    requests: TokenBucket | None
    tokens: TokenBucket | None
    in_flight: int = 0


class RateLimiter:
    """Admission control per API key.

    Args:
        requests_per_minute: request budget per key per minute, or None for no limit.
        tokens_per_minute: token budget per key per minute, or None.
        max_concurrent: requests in flight per key, or None.
        clock: seconds; injected in tests.
    """

    def __init__(self, requests_per_minute: float | None = None, tokens_per_minute: float | None = None,
                 max_concurrent: int | None = None, clock: Clock = time.monotonic):
        self.requests_per_minute = requests_per_minute
        self.tokens_per_minute = tokens_per_minute
        self.max_concurrent = max_concurrent
        self.clock = clock
        self._keys: dict[str, _KeyState] = {}

    def _bucket(self, per_minute: float | None) -> TokenBucket | None:
        if per_minute is None:
            return None
        return TokenBucket(per_minute, per_minute / 60.0, self.clock)

    def _state(self, key: str) -> _KeyState:
        if key not in self._keys:
            self._keys[key] = _KeyState(self._bucket(self.requests_per_minute),
                                        self._bucket(self.tokens_per_minute))
        return self._keys[key]

    def acquire(self, key: str, num_tokens: int) -> None:
        """Admit one request charging ``num_tokens`` tokens, or raise without charging anything.

        Raises:
            APIError: 429 ``rate_limit_exceeded`` with ``retry_after`` in seconds.
        """
        state = self._state(key)
        if self.max_concurrent is not None and state.in_flight >= self.max_concurrent:
            raise APIError(429, f"Too many concurrent requests for this API key: the limit is "
                                f"{self.max_concurrent} in flight.", code="rate_limit_exceeded",
                           retry_after=1)
        if state.tokens is not None and num_tokens > state.tokens.capacity:
            raise APIError(429, f"Request too large: it needs {num_tokens} tokens (prompt + max_tokens) "
                                f"but the limit is {self.tokens_per_minute:g} tokens per minute.",
                           type="tokens", code="rate_limit_exceeded", retry_after=60)
        waits = [(state.requests.wait_time(1) if state.requests else 0.0, "requests"),
                 (state.tokens.wait_time(num_tokens) if state.tokens else 0.0, "tokens")]
        wait, kind = max(waits)
        if wait > 0:
            limit = self.requests_per_minute if kind == "requests" else self.tokens_per_minute
            raise APIError(429, f"Rate limit reached: {limit:g} {kind} per minute for this API key. "
                                f"Retry in {wait:.1f} s.", type=kind, code="rate_limit_exceeded",
                           retry_after=wait)
        if state.requests:
            state.requests.take(1)
        if state.tokens:
            state.tokens.take(num_tokens)
        state.in_flight += 1

    def release(self, key: str) -> None:
        """A request admitted by :meth:`acquire` ended (finished, failed or aborted)."""
        state = self._keys[key]
        assert state.in_flight > 0, "release() without acquire()"
        state.in_flight -= 1

    def in_flight(self, key: str) -> int:
        """Requests of ``key`` admitted and not yet released."""
        return self._keys[key].in_flight if key in self._keys else 0
