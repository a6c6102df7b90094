"""Derived per-request durations (kvserve.metrics.stats) against hand computation."""

from __future__ import annotations

import pytest

from kvserve.engine.output_processor import RequestTimes
from kvserve.metrics.stats import finished_request_stats
from metrics_helpers import make_state


def test_durations_from_recorded_times():
    # arrival 100, scheduled 100.25, first token 100.5, finished 101.5, 3 tokens
    [stats] = finished_request_stats(make_state())
    assert stats.request_id == "r" and stats.finish_reason == "stop"
    assert (stats.num_prompt_tokens, stats.num_generation_tokens) == (5, 3)
    assert stats.queue_time == pytest.approx(0.25)
    assert stats.time_to_first_token == pytest.approx(0.5)
    assert stats.prefill_time == pytest.approx(0.25)
    assert stats.decode_time == pytest.approx(1.0)
    assert stats.e2e_latency == pytest.approx(1.5)
    assert stats.time_per_output_token == pytest.approx(1.0 / 2)


def test_each_choice_is_one_request_with_its_own_times():
    state = make_state(choices=[
        ("length", 4, RequestTimes(100.0, 100.2, 100.8, 100.8, 100.1)),
        ("stop", 1, RequestTimes(100.0, 100.3, 100.3, 100.3, 100.1)),
    ])
    first, second = finished_request_stats(state)
    assert (first.request_id, second.request_id) == ("0_r", "1_r")
    assert first.time_per_output_token == pytest.approx(0.6 / 3)
    assert second.time_per_output_token == 0.0  # one token: no decode gaps (vLLM observes 0)
    assert second.decode_time == 0.0 and second.queue_time == pytest.approx(0.1)


def test_missing_times_fall_back_so_durations_stay_defined():
    # aborted before being scheduled: no first_scheduled, no first token
    state = make_state(choices=[("abort", 0, RequestTimes(100.0, None, None, 102.0, None))])
    [stats] = finished_request_stats(state)
    assert stats.queue_time == pytest.approx(2.0)
    assert stats.prefill_time == 0.0 and stats.decode_time == 0.0
    assert stats.e2e_latency == pytest.approx(2.0)


def test_unfinished_choices_are_skipped():
    state = make_state(choices=[("stop", 2, RequestTimes(1.0, 2.0, 3.0, 3.0, 1.5)),
                                (None, 1, RequestTimes(1.0, 2.0, 2.0, None, 1.5))])
    assert [s.request_id for s in finished_request_stats(state)] == ["0_r"]
