"""Hand-made front-end states and Prometheus readers for the metrics tests."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from kvserve.engine.output_processor import ChoiceState, RequestState, RequestTimes
from kvserve.sampling_params import SamplingParams


def make_state(request_id: str = "r", num_prompt: int = 5, choices=None, prompt: str | None = "hi",
               arrival: float = 100.0, n: int | None = None) -> RequestState:
    """``choices``: list of (finish_reason, num_output_tokens, RequestTimes) per choice index."""
    choices = choices or [("stop", 3, RequestTimes(arrival, 100.5, 101.0, 101.5, 100.25))]
    states = {}
    for index, (reason, num_tokens, times) in enumerate(choices):
        child_id = request_id if len(choices) == 1 else f"{index}_{request_id}"
        states[child_id] = ChoiceState(index, None, None, finish_reason=reason, num_output_tokens=num_tokens,
                                       times=times)
    params = SamplingParams(n=n or len(choices), max_tokens=16)
    return RequestState(request_id, prompt, list(range(num_prompt)), params, states,
                        RequestTimes(arrival, finished=max(c[2].finished or 0 for c in choices)))


def sample(registry: CollectorRegistry, name: str, **labels) -> float:
    """A sample's value (0 when the series does not exist yet)."""
    return registry.get_sample_value(name, labels) or 0.0


def parse_metrics(text: str) -> dict[tuple[str, frozenset], float]:
    """``/metrics`` text -> {(sample name, frozenset(labels.items())): value}."""
    values = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            values[(s.name, frozenset(s.labels.items()))] = s.value
    return values
