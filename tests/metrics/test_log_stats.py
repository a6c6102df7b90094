"""Summary and access log lines from hand-made stats objects (exact text and fields)."""

from __future__ import annotations

import io
import json
import logging

import pytest

from kvserve.engine.core import StepStats
from kvserve.errors import RequestRejectedError
from kvserve.metrics.log_format import JsonFormatter, configure_logging
from kvserve.metrics.log_stats import IntervalSummary, LoggingStatsLogger, RequestLogger
from kvserve.metrics.stats import IterationStats
from kvserve.scheduler.stats import SchedulerStats
from metrics_helpers import make_state


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def step(**scheduler) -> StepStats:
    return StepStats(0.0, 0.01, 1, 0, 1, SchedulerStats(**scheduler))


def test_summary_after_interval_with_throughput_hit_rate_and_preemptions(caplog):
    clock = Clock()
    stats = LoggingStatsLogger(interval=10.0, clock=clock)
    stats.on_step(step(num_running=2, prefix_cache_queries=100, prefix_cache_hits=40), [], IterationStats(100, 20))
    assert not caplog.records
    clock.now = 4.0
    with caplog.at_level(logging.INFO, logger="kvserve.stats"):
        stats.on_step(step(num_running=2, num_waiting=1, kv_cache_usage=0.5, prefix_cache_queries=200,
                           prefix_cache_hits=90, num_preemptions=3), [], IterationStats(0, 30))
        assert not caplog.records  # 4 s < 10 s
        clock.now = 10.0
        stats.on_step(step(num_running=1, num_waiting=1, kv_cache_usage=0.25, prefix_cache_queries=200,
                           prefix_cache_hits=90, num_preemptions=3), [], IterationStats(0, 50))
    [record] = caplog.records
    assert record.getMessage() == (
        "Avg prompt throughput: 10.0 tokens/s, Avg generation throughput: 10.0 tokens/s, Running: 1 reqs, "
        "Waiting: 1 reqs, KV cache usage: 25.0%, Prefix cache hit rate: 45.0%, Preemptions: 3")
    assert record.stats["num_preemptions"] == 3


def test_summary_interval_is_relative_and_idle_intervals_are_silent(caplog):
    clock = Clock()
    stats = LoggingStatsLogger(interval=5.0, clock=clock)
    stats.on_step(step(prefix_cache_queries=10, prefix_cache_hits=10), [], IterationStats(10, 0))
    clock.now = 5.0
    with caplog.at_level(logging.INFO, logger="kvserve.stats"):
        first = stats.maybe_log()
        clock.now = 10.0
        second = stats.maybe_log()  # nothing happened in (5, 10]
    assert first == IntervalSummary(2.0, 0.0, 0, 0, 0.0, 1.0, 0)
    assert second is None and len(caplog.records) == 1


def test_interval_must_be_positive():
    with pytest.raises(ValueError, match="must be > 0"):
        LoggingStatsLogger(interval=0)


def test_request_lines_with_and_without_prompt(caplog):
    state = make_state(request_id="cmpl-1", prompt="secret words")
    with caplog.at_level(logging.INFO, logger="kvserve.requests"):
        RequestLogger(log_prompts=False).on_step(None, [state], None)
        RequestLogger(log_prompts=True).on_step(None, [state], None)
        RequestLogger().on_request_aborted("cmpl-2")
        RequestLogger().on_request_rejected(RequestRejectedError("queue is full", reason="queue_full"))
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == ("request finished: request_id=cmpl-1 status=stop prompt_tokens=5 generation_tokens=3 "
                        "cached_tokens=0 e2e_seconds=1.5 ttft_seconds=0.5")
    assert "secret" not in lines[0]
    assert lines[1].endswith("ttft_seconds=0.5 prompt='secret words'")
    assert lines[2] == "request aborted: request_id=cmpl-2"
    assert lines[3] == "request rejected: reason=queue_full error=queue is full"
    assert caplog.records[0].request["generation_tokens"] == 3


def test_json_format_one_object_per_line_with_fields():
    stream = io.StringIO()
    handler = configure_logging("info", "json", stream=stream)
    try:
        state = make_state(request_id="cmpl-9")
        RequestLogger().on_step(None, [state], None)
        logging.getLogger("kvserve.test").debug("hidden at info level")
    finally:
        logging.getLogger().removeHandler(handler)
    [line] = stream.getvalue().splitlines()
    entry = json.loads(line)
    assert entry["level"] == "INFO" and entry["logger"] == "kvserve.requests"
    assert entry["message"].startswith("request finished: request_id=cmpl-9")
    assert entry["request"]["request_id"] == "cmpl-9" and entry["request"]["prompt_tokens"] == 5
    assert entry["time"].endswith("Z")


def test_json_formatter_keeps_exceptions():
    try:
        raise KeyError("k")
    except KeyError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed %s", ("now",), exc_info=True)
        import sys
        record.exc_info = sys.exc_info()
    entry = json.loads(JsonFormatter().format(record))
    assert entry["message"] == "failed now" and "KeyError" in entry["exception"]


@pytest.mark.parametrize("level, fmt, match", [("loud", "text", "log level"), ("info", "xml", "log format")])
def test_configure_logging_rejects_unknown_values(level, fmt, match):
    with pytest.raises(ValueError, match=match):
        configure_logging(level, fmt)


def test_window_after_idle_time_starts_at_the_first_step(caplog):
    clock = Clock()
    stats = LoggingStatsLogger(interval=10.0, clock=clock)
    clock.now = 100.0  # start-up and idle time
    with caplog.at_level(logging.INFO, logger="kvserve.stats"):
        stats.on_step(step(num_running=1), [], IterationStats(8, 1))
        assert not caplog.records  # not logged at once over 100 idle seconds
        clock.now = 110.0
        stats.on_step(step(num_running=1), [], IterationStats(0, 9))
    [record] = caplog.records
    assert record.stats["prompt_throughput"] == 0.8 and record.stats["generation_throughput"] == 1.0


def test_spec_decode_acceptance_is_per_interval(caplog):
    """The acceptance in the line counts the drafts since the previous line (vLLM's
    ``SpecDecodingLogging`` resets at each log), not since start-up; an interval without drafts
    shows none."""
    from kvserve.spec_decode.stats import SpecDecodingStats

    clock = Clock()
    stats = LoggingStatsLogger(interval=10.0, clock=clock)
    totals = [SpecDecodingStats(4, 12, 6, (3, 2, 1)),    # first interval: 6 of 12
              SpecDecodingStats(9, 27, 21, (8, 7, 6)),   # second: 15 of 15 more
              SpecDecodingStats(9, 27, 21, (8, 7, 6))]   # third: no new drafts
    with caplog.at_level(logging.INFO, logger="kvserve.stats"):
        for i, total in enumerate(totals):
            stats.on_step(step(num_running=1, spec_decoding=total), [], IterationStats(0, 10))
            clock.now += 10.0
            stats.on_step(step(num_running=1, spec_decoding=total), [], IterationStats(0, 10))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert lines[0].endswith(", Spec decode acceptance: 50.0% of 12 draft tokens, mean acceptance length 2.50, "
                             "per position [0.75, 0.50, 0.25]")
    assert lines[1].endswith(", Spec decode acceptance: 100.0% of 15 draft tokens, mean acceptance length 4.00, "
                             "per position [1.00, 1.00, 1.00]")
    assert lines[2].endswith("Preemptions: 0")
    assert caplog.records[1].stats["spec_decoding"] == {"num_drafts": 5, "num_draft_tokens": 15,
                                                        "num_accepted_tokens": 15,
                                                        "num_accepted_tokens_per_pos": (5, 5, 5)}
