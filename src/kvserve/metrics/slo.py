"""The latency-target series of ``/metrics`` (kvserve's, no vLLM counterpart):

    <prefix>slo_requests_total{slo_class, outcome}     met | missed (finished choices of requests
                                                       with targets) | refused (at admission)
    <prefix>slo_ttft_prediction_error                  |predicted - actual| / actual TTFT, at each
                                                       targeted request's first token (histogram)
    <prefix>slo_step_cost_seconds{term}                the step-cost model's fit (gauge)
    <prefix>slo_step_cost_ready                        1 once admission uses predictions (gauge)
    <prefix>slo_plan_margin                            share of a target plans fill (gauge; learned
                                                       from the steps' actual / predicted times)
    <prefix>slo_predicted_ttft_seconds                 TTFT of a 128-token prompt arriving now (gauge;
                                                       a router's input)

Goodput of a class is ``rate(slo_requests_total{outcome="met"})``; its attainment among accepted
requests ``met / (met + missed)``. ``slo_class`` is the ``--slo-classes`` name, or ``request`` for
targets a request gave itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from kvserve.errors import RequestRejectedError
from kvserve.scheduler.stats import SchedulerStats
from kvserve.slo.cost_model import TERMS

OUTCOMES = ("met", "missed", "refused")
ERROR_BUCKETS = (0.05, 0.1, 0.15, 0.25, 0.35, 0.5, 0.75, 1.0, 2.0, 5.0)
OWN_TARGETS = "request"


class SLOStatsLogger:
    """A stats consumer (``kvserve.metrics.wiring.StatsConsumer``) counting outcomes and errors.

    Args:
        model_name: the ``model_name`` label.
        registry: the server's registry.
        prefix: the start of every name.
    """

    def __init__(self, model_name: str, registry: CollectorRegistry, prefix: str):
        self.model_name = model_name
        self.requests = Counter(prefix + "slo_requests", "Requests with latency targets by class and outcome: met, "
                                "missed (finished choices) or refused (at admission).",
                                ["model_name", "slo_class", "outcome"], registry=registry)
        self.ttft_error = Histogram(prefix + "slo_ttft_prediction_error",
                                    "Relative error |predicted - actual| / actual of the TTFT predicted at admission.",
                                    ["model_name"], buckets=ERROR_BUCKETS, registry=registry).labels(model_name)

    def on_step(self, step_stats, finished: list, iteration) -> None:
        if step_stats is not None and step_stats.scheduler.slo is not None:
            for error in step_stats.scheduler.slo.ttft_errors:
                self.ttft_error.observe(error)
        for state in finished:
            if state.slo is None:
                continue
            name = state.slo.slo_class or OWN_TARGETS
            for choice in state.choices.values():  # judged once, by the output processor (usage's slo_missed)
                if choice.finish_reason == "abort" or choice.slo_missed is None:
                    continue
                met = choice.finish_reason != "error" and not choice.slo_missed
                self.requests.labels(self.model_name, name, "met" if met else "missed").inc()

    def on_request_aborted(self, request_id: str) -> None:
        pass

    def on_request_rejected(self, exc: BaseException) -> None:
        if isinstance(exc, RequestRejectedError) and exc.reason == "slo_unattainable":
            name = (exc.details or {}).get("slo_class") or OWN_TARGETS
            self.requests.labels(self.model_name, name, "refused").inc()


class SLOStepCostCollector:
    """The step-cost model of the latest ``SchedulerStats`` as gauges."""

    def __init__(self, model_name: str, snapshot: Callable[[], SchedulerStats], prefix: str):
        self.model_name = model_name
        self.snapshot = snapshot
        self.prefix = prefix

    def collect(self) -> Iterator[Metric]:
        slo = self.snapshot().slo
        cost = GaugeMetricFamily(self.prefix + "slo_step_cost_seconds",
                                 "The step-cost model: seconds per step, prompt token, decode row and million "
                                 "attention pairs, fitted on the engine's recent steps.",
                                 labels=["model_name", "term"])
        ready = GaugeMetricFamily(self.prefix + "slo_step_cost_ready",
                                  "1 once the step-cost model has seen enough steps to predict (admission uses it).",
                                  labels=["model_name"])
        margin = GaugeMetricFamily(self.prefix + "slo_plan_margin",
                                   "Share of a latency target that admission and step plans fill: the inverse of "
                                   "the 90th percentile of actual / predicted step time, within [0.4, 0.8].",
                                   labels=["model_name"])
        predicted = GaugeMetricFamily(self.prefix + "slo_predicted_ttft_seconds",
                                      "Predicted TTFT of a 128-token prompt arriving now behind every waiting "
                                      "request (what a router compares); absent until the cost model is ready.",
                                      labels=["model_name"])
        if slo is not None:
            for term in TERMS:
                cost.add_metric([self.model_name, term], slo.step_cost["coefficients"][term])
            ready.add_metric([self.model_name], float(slo.step_cost["ready"]))
            margin.add_metric([self.model_name], slo.step_cost["margin"])
            if slo.reference_ttft is not None:
                predicted.add_metric([self.model_name], slo.reference_ttft)
        yield cost
        yield ready
        yield margin
        yield predicted
