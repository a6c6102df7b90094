"""The selection arithmetic of ``bench compare`` on scripted latencies, against values worked out by
hand (dyadic seconds, so every value is exact in binary floating point)."""

from __future__ import annotations

import math

import pytest

from kvserve.bench.compare.stats import (
    RequestRecord,
    empirical_cdf,
    evaluate_level,
    find_knee,
    min_requests_for_percentile,
    plan_replicas,
    slo_values_ms,
)

# ttft, e2e (s), output tokens, gaps (s)      TTFT ms  TPOT ms                  longest gap ms
R1 = RequestRecord(True, 0.125, 1.125, (0.0625, 0.25), 9)   # 125   (1.125-0.125)/8 = 125   250
R2 = RequestRecord(True, 0.25, 2.25, (0.125,), 17)          # 250   2/16 = 125              125
R3 = RequestRecord(True, 0.5, 0.5, (), 1)                   # 500   none (one token)        none
R4 = RequestRecord(True, 0.375, 4.375, (0.5,), 9)           # 375   4/8 = 500               500
R5 = RequestRecord(False, error="HTTP 500: boom")           # failed: a miss for every SLO
RECORDS = [R1, R2, R3, R4, R5]


def test_slo_values_of_one_request():
    assert slo_values_ms(R1) == {"ttft": 125.0, "tpot": 125.0, "itl": 250.0, "e2el": 1125.0}
    assert slo_values_ms(R3) == {"ttft": 500.0, "tpot": None, "itl": None, "e2el": 500.0}


def test_level_attainment_goodput_and_verdict():
    slos = {"ttft": (300.0, 50.0), "tpot": (200.0, 40.0), "itl": (300.0, 50.0)}
    v = evaluate_level(RECORDS, duration_s=2.0, slos=slos, load=4.0)
    assert (v.load, v.requests, v.completed, v.failed, v.duration_s) == (4.0, 5, 4, 1, 2.0)
    assert v.request_throughput == 2.0  # 4 completed / 2 s
    assert v.goodput == 1.0  # R1 and R2 are within every limit: 2 / 2 s
    ttft, tpot, itl = v.slos
    # TTFT: R1, R2 within 300 ms of 5 sent = 0.4 < 0.5; p50 of 125, 250, 375, 500 = 312.5
    assert (ttft.metric, ttft.attainment, ttft.required, ttft.value_ms, ttft.met) == ("ttft", 0.4, 0.5, 312.5, False)
    # TPOT: R1, R2 and R3 (no decode phase) within = 0.6 >= 0.4; p40 of 125, 125, 500 = 125
    assert (tpot.attainment, tpot.required, tpot.value_ms, tpot.met) == (0.6, 0.4, 125.0, True)
    # ITL: R1 (250), R2 (125), R3 (no gap) within = 0.6 >= 0.5; p50 of 125, 250, 500 = 250
    assert (itl.attainment, itl.value_ms, itl.met) == (0.6, 250.0, True)
    assert v.meets_slos is False
    # 4 completed: p40 needs 4 (estimable), p50 needs 5 and p99 needs 299 (not)
    assert v.short_percentiles == ((50.0, 5), (99.0, 299))


def test_level_meeting_every_slo():
    v = evaluate_level([R1, R2], duration_s=0.5, slos={"e2el": (2250.0, 99.0)})
    assert (v.slos[0].attainment, v.slos[0].met, v.meets_slos, v.goodput) == (1.0, True, True, 4.0)
    assert v.slos[0].value_ms == 1125.0 + 0.99 * (2250.0 - 1125.0)  # numpy's linear interpolation


def test_failed_requests_count_against_attainment():
    v = evaluate_level([R1, R5], duration_s=1.0, slos={"ttft": (1000.0, 50.0)})
    assert (v.slos[0].attainment, v.slos[0].met) == (0.5, True)
    v = evaluate_level([R1, R5], duration_s=1.0, slos={"ttft": (1000.0, 60.0)})
    assert (v.slos[0].attainment, v.slos[0].met, v.goodput) == (0.5, False, 1.0)


def test_level_without_requests_or_with_bad_input():
    v = evaluate_level([R5], duration_s=0.0, slos={"ttft": (1.0, 50.0)})
    assert (v.completed, v.goodput, v.meets_slos, math.isnan(v.slos[0].value_ms)) == (0, 0.0, False, True)
    with pytest.raises(ValueError, match="unknown SLO metric 'latency'"):
        evaluate_level([R1], 1.0, {"latency": (1.0, 50.0)})
    with pytest.raises(ValueError, match="needs a duration > 0 s"):
        evaluate_level([R1], 0.0, {"ttft": (1.0, 50.0)})


@pytest.mark.parametrize("percentile, needed", [(50.0, 5), (90.0, 29), (95.0, 59), (99.0, 299), (99.9, 2995)])
def test_requests_needed_for_a_tail_percentile(percentile, needed):
    assert min_requests_for_percentile(percentile) == needed
    q = percentile / 100
    assert 1 - q ** needed >= 0.95 > 1 - q ** (needed - 1)  # the definition, independently


def test_requests_needed_rejects_bad_arguments():
    with pytest.raises(ValueError):
        min_requests_for_percentile(100.0)
    with pytest.raises(ValueError):
        min_requests_for_percentile(99.0, confidence=1.0)


@pytest.mark.parametrize("met, knee", [([True, True, False, True], 1), ([False, True], None), ([True, True, True], 2),
                                       ([], None), ([True], 0)])
def test_knee_is_the_last_level_before_the_first_miss(met, knee):
    assert find_knee(met) == knee


def test_replicas_with_the_arithmetic():
    plan = plan_replicas(20.0, 2.5, headroom=0.8)
    assert (plan.replicas, plan.within_budget) == (10, None)  # 20 / (2.5 * 0.8) = 10 exactly: not 11
    assert plan.arithmetic == "ceil(20 req/s / (2.500 req/s x 0.8)) = ceil(10.000) = 10"
    plan = plan_replicas(21.0, 2.5, headroom=0.8, max_replicas=8)
    assert (plan.replicas, plan.within_budget) == (11, False)
    assert plan.arithmetic == "ceil(21 req/s / (2.500 req/s x 0.8)) = ceil(10.500) = 11 (over the budget of 8)"
    assert plan_replicas(3.0, 3.0, max_replicas=1).arithmetic.endswith("= 1 (within the budget of 1)")
    none = plan_replicas(20.0, None)
    assert (none.replicas, none.arithmetic) == (None, "no load level met the SLOs: capacity unknown")
    with pytest.raises(ValueError):
        plan_replicas(20.0, 1.0, headroom=1.5)


def test_empirical_cdf():
    assert empirical_cdf([3.0, 1.0, 2.0, 2.0]) == ([1.0, 2.0, 2.0, 3.0], [0.25, 0.5, 0.75, 1.0])


def test_records_from_a_result_file_entry():
    entry = {"success": True, "error": "", "prompt_len": 5, "output_tokens": 9, "ttft_s": 0.125, "e2el_s": 1.125,
             "itl_s": [0.0625, 0.25], "start_s": 0.0}
    assert RequestRecord.from_dict(entry) == R1
