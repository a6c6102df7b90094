"""Seeded Poisson / gamma arrival schedules."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvserve.bench.arrivals import RampUp, arrival_gaps, arrival_offsets, arrival_schedule
from kvserve.errors import InvalidRequestError


def gaps(rate, burstiness, seed, n):
    it = arrival_gaps(rate, burstiness, seed)
    return np.array([next(it) for _ in range(n)])


def test_same_seed_same_schedule():
    assert arrival_offsets(3.0, 1.0, 7, 600) == arrival_offsets(3.0, 1.0, 7, 600)
    assert arrival_offsets(3.0, 0.5, 7, 50) != arrival_offsets(3.0, 0.5, 8, 50)


def test_offsets_are_cumulative_gaps():
    g = gaps(2.0, 1.0, 3, 10)
    assert arrival_offsets(2.0, 1.0, 3, 10) == pytest.approx(np.cumsum(g).tolist(), rel=1e-15)


def test_infinite_rate_sends_at_once():
    assert arrival_offsets(math.inf, 1.0, 0, 5) == [0.0] * 5


@pytest.mark.parametrize("rate,burstiness", [(4.0, 1.0), (10.0, 0.25), (0.5, 4.0)])
def test_gap_distribution(rate, burstiness):
    # Gamma(k, 1/(rate k)): mean 1/rate, coefficient of variation 1/sqrt(k); k = 1 is Poisson.
    g = gaps(rate, burstiness, 0, 40_000)
    assert g.mean() == pytest.approx(1 / rate, rel=0.03)
    assert g.std() / g.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.04)
    assert (g > 0).all()


def test_poisson_counts_per_window():
    # Poisson arrivals: counts per unit window have variance equal to their mean.
    offsets = np.array(arrival_offsets(5.0, 1.0, 1, 50_000))
    counts = np.bincount(offsets.astype(int))[:-1]
    assert counts.mean() == pytest.approx(5.0, rel=0.03)
    assert counts.var() == pytest.approx(5.0, rel=0.06)


@pytest.mark.parametrize("rate,burstiness", [(0.0, 1.0), (-1.0, 1.0), (math.nan, 1.0), (1.0, 0.0), (1.0, math.nan)])
def test_invalid_parameters(rate, burstiness):
    with pytest.raises(InvalidRequestError):
        next(arrival_gaps(rate, burstiness, 0))


def test_schedule_ends_exactly_at_count_over_rate():
    # vLLM's get_request rescales the cumulative gaps so the last send is at count / rate.
    offsets, rates = arrival_schedule(50, 4.0, 1.0, 3)
    assert offsets[-1] == pytest.approx(12.5, rel=1e-12) and rates == [4.0] * 50
    assert all(b > a for a, b in zip(offsets, offsets[1:]))
    assert arrival_schedule(50, 4.0, 1.0, 3) == (offsets, rates)  # seeded
    assert arrival_schedule(4, 2.0, math.inf, 0)[0] == pytest.approx([0.5, 1.0, 1.5, 2.0])  # constant gaps
    assert arrival_schedule(3, math.inf, 1.0, 0)[0] == [0.0, 0.0, 0.0]


def test_ramp_up_rates():
    assert arrival_schedule(3, math.inf, 1.0, 0, RampUp("linear", 1, 3))[1] == [1.0, 2.0, 3.0]
    assert arrival_schedule(3, math.inf, 1.0, 0, RampUp("exponential", 1, 4))[1] == [1.0, 2.0, 4.0]
    with pytest.raises(InvalidRequestError, match="rate of 0"):
        arrival_schedule(3, math.inf, 1.0, 0, RampUp("linear", 0, 3))
    with pytest.raises(InvalidRequestError, match="drop --request-rate"):
        RampUp("linear", 1, 3).validate(5.0)
    with pytest.raises(InvalidRequestError, match="start <= end"):
        RampUp("linear", 4, 3).validate(math.inf)
    with pytest.raises(InvalidRequestError, match="cannot start at 0"):
        RampUp("exponential", 0, 3).validate(math.inf)
