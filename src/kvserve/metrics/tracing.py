"""OpenTelemetry traces: one span tree per finished choice, built after the fact from its times::

    llm_request  [arrival ─────────────────────────────────────────── finished]
      ├ queue    [arrival ── first scheduled]
      ├ prefill                [first scheduled ── first token]
      └ decode                                  [first token ──────── finished]

Attributes follow OpenTelemetry's GenAI semantic conventions (``gen_ai.*``) as vLLM's tracing
does. OpenTelemetry is imported only when tracing is asked for (``--otlp-traces-endpoint``); the
SDK and exporter come with ``pip install 'kvserve[tracing]'``.
"""

from __future__ import annotations

from typing import Any

from kvserve.metrics.stats import FinishedRequestStats, IterationStats, finished_request_stats

INSTALL_HINT = ("OpenTelemetry is not installed; tracing (--otlp-traces-endpoint) needs "
                "`pip install 'kvserve[tracing]'` (opentelemetry-sdk and opentelemetry-exporter-otlp)")


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def make_otlp_tracer_provider(endpoint: str, service_name: str = "kvserve") -> Any:
    """A ``TracerProvider`` exporting spans in batches over OTLP/gRPC to ``endpoint``
    (e.g. ``http://localhost:4317``); OTLP/HTTP when only that exporter is installed.

    Raises:
        ImportError: OpenTelemetry's SDK or OTLP exporter is not installed (message says how).
    """
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    except ImportError:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise ImportError(INSTALL_HINT) from exc
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return provider


class TracingStatsConsumer:
    """Emits the span tree of every finished choice (a stats consumer).

    Args:
        tracer_provider: an OpenTelemetry SDK ``TracerProvider`` (from
            :func:`make_otlp_tracer_provider`, or one with an in-memory exporter in tests).
        model_name: the ``gen_ai.request.model`` attribute.
    """

    def __init__(self, tracer_provider: Any, model_name: str):
        from opentelemetry import trace

        self._trace = trace
        self.tracer_provider = tracer_provider
        self.tracer = tracer_provider.get_tracer("kvserve")
        self.model_name = model_name

    def on_step(self, step_stats, finished: list, iteration: IterationStats | None) -> None:
        for state in finished:
            params = state.params
            attributes = {
                "gen_ai.request.model": self.model_name,
                "gen_ai.request.max_tokens": params.max_tokens if params.max_tokens is not None else -1,
                "gen_ai.request.temperature": float(params.temperature),
                "gen_ai.request.top_p": float(params.top_p),
                "gen_ai.request.n": int(params.n),
            }
            for stats in finished_request_stats(state):
                self.emit(stats, attributes)

    def emit(self, stats: FinishedRequestStats, attributes: dict[str, Any]) -> None:
        """Emit one choice's ``llm_request`` span and its queue/prefill/decode children."""
        parent = self.tracer.start_span("llm_request", start_time=_ns(stats.arrival_time), attributes={
            **attributes,
            "gen_ai.response.id": stats.request_id,
            "gen_ai.response.finish_reasons": [stats.finish_reason],
            "gen_ai.usage.prompt_tokens": stats.num_prompt_tokens,
            "gen_ai.usage.completion_tokens": stats.num_generation_tokens,
            "gen_ai.latency.time_in_queue": stats.queue_time,
            "gen_ai.latency.time_to_first_token": stats.time_to_first_token,
            "gen_ai.latency.e2e": stats.e2e_latency,
            "kvserve.num_cached_tokens": stats.num_cached_tokens,
        })
        context = self._trace.set_span_in_context(parent)
        for name, start, end in (("queue", stats.arrival_time, stats.first_scheduled_time),
                                 ("prefill", stats.first_scheduled_time, stats.first_token_time),
                                 ("decode", stats.first_token_time, stats.finished_time)):
            self.tracer.start_span(name, context=context, start_time=_ns(start)).end(end_time=_ns(end))
        parent.end(end_time=_ns(stats.finished_time))

    def on_request_aborted(self, request_id: str) -> None:
        pass

    def on_request_rejected(self, exc: BaseException) -> None:
        pass
