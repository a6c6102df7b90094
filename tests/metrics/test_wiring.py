"""Observability flags of ``kvserve serve`` and the consumers they switch on."""

from __future__ import annotations

import sys

import pytest

from kvserve.cli import build_parser
from kvserve.metrics.log_stats import LoggingStatsLogger, RequestLogger
from kvserve.metrics.wiring import ObservabilityConfig, build_stats_consumers, observability_config_from_args


def parse(*flags: str):
    return build_parser().parse_args(["serve", "/models/x", *flags])


def test_defaults_log_a_summary_every_10_seconds_and_nothing_else():
    config = observability_config_from_args(parse())
    assert config == ObservabilityConfig(10.0, False, False, "text", None)
    [consumer] = build_stats_consumers(config, "m")
    assert isinstance(consumer, LoggingStatsLogger) and consumer.interval == 10.0


def test_flags_switch_consumers_on_and_off():
    args = parse("--log-stats-interval", "0", "--enable-log-requests", "--log-prompts", "--log-format", "json",
                 "--log-level", "debug")
    config = observability_config_from_args(args)
    assert config == ObservabilityConfig(0.0, True, True, "json", None) and args.log_level == "debug"
    [consumer] = build_stats_consumers(config, "m")
    assert isinstance(consumer, RequestLogger) and consumer.log_prompts


def test_negative_interval_is_refused():
    with pytest.raises(ValueError, match="--log-stats-interval must be >= 0"):
        observability_config_from_args(parse("--log-stats-interval", "-1"))


def test_unknown_log_format_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        parse("--log-format", "xml")
    assert "invalid choice: 'xml'" in capsys.readouterr().err


def test_tracing_without_opentelemetry_says_how_to_install(monkeypatch):
    for name in ("opentelemetry.sdk.trace", "opentelemetry.sdk.resources", "opentelemetry.sdk.trace.export"):
        monkeypatch.setitem(sys.modules, name, None)  # import now raises ImportError
    config = ObservabilityConfig(log_stats_interval=0, otlp_traces_endpoint="http://127.0.0.1:4317")
    with pytest.raises(ImportError, match=r"pip install 'kvserve\[tracing\]'"):
        build_stats_consumers(config, "m")


def test_no_tracing_no_opentelemetry_import(monkeypatch):
    for name in list(sys.modules):
        if name.startswith("opentelemetry") or name == "kvserve.metrics.tracing":
            monkeypatch.delitem(sys.modules, name)
    build_stats_consumers(ObservabilityConfig(enable_log_requests=True), "m")
    assert not any(name.startswith("opentelemetry") for name in sys.modules)
