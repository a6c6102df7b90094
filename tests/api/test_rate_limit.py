"""Token-bucket arithmetic with an injected clock."""

from __future__ import annotations

import math

import pytest

from kvserve.api.errors import APIError
from kvserve.api.rate_limit import RateLimiter, TokenBucket


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_bucket_starts_full_and_refills_linearly():
    clock = FakeClock()
    bucket = TokenBucket(capacity=60, refill_per_second=1.0, clock=clock)
    assert bucket.wait_time(60) == 0
    bucket.take(60)
    assert bucket.wait_time(1) == pytest.approx(1.0)
    assert bucket.wait_time(30) == pytest.approx(30.0)
    clock.now += 12.5
    assert bucket.wait_time(10) == 0
    assert bucket.wait_time(20) == pytest.approx(7.5)
    clock.now += 1000  # never above capacity
    assert bucket.level <= 60 and bucket.wait_time(60) == 0 and bucket.level == 60
    assert bucket.wait_time(61) == math.inf


def test_requests_per_minute_retry_after():
    clock = FakeClock()
    limiter = RateLimiter(requests_per_minute=2, clock=clock)
    for _ in range(2):
        limiter.acquire("k", 0)
        limiter.release("k")
    with pytest.raises(APIError) as info:
        limiter.acquire("k", 0)
    error = info.value
    assert error.status_code == 429 and error.type == "requests" and error.code == "rate_limit_exceeded"
    assert error.retry_after == pytest.approx(30.0)  # 2 per minute -> one every 30 s
    clock.now += 30
    limiter.acquire("k", 0)
    limiter.acquire("other-key", 0)  # keys are independent


def test_tokens_per_minute_charges_and_refuses_without_charging():
    clock = FakeClock()
    limiter = RateLimiter(requests_per_minute=100, tokens_per_minute=600, clock=clock)
    limiter.acquire("k", 500)
    with pytest.raises(APIError) as info:
        limiter.acquire("k", 200)
    assert info.value.type == "tokens" and info.value.retry_after == pytest.approx(10.0)
    # The refused request charged nothing: 100 tokens and 99 requests are still there.
    limiter.acquire("k", 100)
    with pytest.raises(APIError) as info:
        limiter.acquire("k", 601)
    assert info.value.retry_after == 60 and "601" in info.value.message


def test_concurrency_cap():
    limiter = RateLimiter(max_concurrent=2, clock=FakeClock())
    limiter.acquire("k", 1)
    limiter.acquire("k", 1)
    with pytest.raises(APIError) as info:
        limiter.acquire("k", 1)
    assert info.value.status_code == 429 and info.value.retry_after == 1
    assert limiter.in_flight("k") == 2
    limiter.release("k")
    limiter.acquire("k", 1)
    assert limiter.in_flight("k") == 2 and limiter.in_flight("nobody") == 0


def test_no_limits_admits_everything():
    limiter = RateLimiter(clock=FakeClock())
    for _ in range(1000):
        limiter.acquire("k", 10**9)
    assert limiter.in_flight("k") == 1000
