"""Spans of finished requests through OpenTelemetry's SDK with its in-memory exporter."""

from __future__ import annotations

import pytest

from kvserve.engine.output_processor import RequestTimes
from metrics_helpers import make_state

sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from kvserve.metrics.tracing import TracingStatsConsumer  # noqa: E402


def test_one_span_tree_per_choice_with_recorded_times():
    exporter = InMemorySpanExporter()
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    consumer = TracingStatsConsumer(provider, "m")
    state = make_state(request_id="r", num_prompt=5, choices=[
        ("length", 4, RequestTimes(100.0, 100.5, 101.0, 101.0, 100.25)),
        ("stop", 2, RequestTimes(100.0, 100.75, 100.8, 100.9, 100.5)),
    ])
    consumer.on_step(None, [state], None)
    spans = exporter.get_finished_spans()
    assert sorted(s.name for s in spans) == sorted(["llm_request", "queue", "prefill", "decode"] * 2)
    parents = [s for s in spans if s.name == "llm_request"]
    assert [p.attributes["gen_ai.response.id"] for p in parents] == ["0_r", "1_r"]
    first = parents[0]
    assert (first.start_time, first.end_time) == (100_000_000_000, 101_000_000_000)
    assert first.attributes["gen_ai.usage.prompt_tokens"] == 5
    assert first.attributes["gen_ai.usage.completion_tokens"] == 4
    assert first.attributes["gen_ai.request.model"] == "m"
    assert tuple(first.attributes["gen_ai.response.finish_reasons"]) == ("length",)
    children = {s.name: s for s in spans if s.parent is not None and s.parent.span_id == first.context.span_id}
    assert (children["queue"].start_time, children["queue"].end_time) == (100_000_000_000, 100_250_000_000)
    assert (children["prefill"].start_time, children["prefill"].end_time) == (100_250_000_000, 100_500_000_000)
    assert (children["decode"].start_time, children["decode"].end_time) == (100_500_000_000, 101_000_000_000)
    assert all(c.context.trace_id == first.context.trace_id for c in children.values())
