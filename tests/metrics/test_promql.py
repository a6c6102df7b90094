"""The test PromQL evaluator on hand-made scrapes, values worked out by Prometheus's rules."""

from __future__ import annotations

import math

import pytest

from promql import Evaluator, bucket_quantile, label_values, parse_scrape, tokenize

BEFORE = """\
# TYPE x:lat_seconds histogram
x:lat_seconds_bucket{model_name="m",le="1.0"} 1.0
x:lat_seconds_bucket{model_name="m",le="2.0"} 2.0
x:lat_seconds_bucket{model_name="m",le="+Inf"} 2.0
x:lat_seconds_count{model_name="m"} 2.0
x:lat_seconds_sum{model_name="m"} 2.5
# TYPE x:done counter
x:done_total{model_name="m",reason="stop"} 1.0
x:done_total{model_name="m",reason="length"} 0.0
x:done_total{model_name="other",reason="stop"} 5.0
# TYPE x:running gauge
x:running{model_name="m"} 3.0
"""
CHANGES = {'le="1.0"} 1.0': 'le="1.0"} 3.0', 'le="2.0"} 2.0': 'le="2.0"} 7.0', 'le="+Inf"} 2.0': 'le="+Inf"} 9.0',
           '_count{model_name="m"} 2.0': '_count{model_name="m"} 9.0',
           '_sum{model_name="m"} 2.5': '_sum{model_name="m"} 16.5', 'reason="length"} 0.0': 'reason="length"} 4.0',
           'x:running{model_name="m"} 3.0': 'x:running{model_name="m"} 1.0'}
AFTER = BEFORE
for old, new in CHANGES.items():
    AFTER = AFTER.replace(old, new)


@pytest.fixture
def ev():
    return Evaluator(parse_scrape(BEFORE), parse_scrape(AFTER), seconds=10.0)


def test_bucket_quantile_prometheus_rules():
    buckets = [(1.0, 2.0), (2.0, 6.0), (math.inf, 8.0)]
    assert bucket_quantile(0.5, buckets) == 1.5  # rank 4 in (1, 2]: 1 + (4 - 2) / (6 - 2)
    assert bucket_quantile(0.25, buckets) == 1.0  # rank 2 in (0, 1]: 0 + 1 * 2 / 2
    assert bucket_quantile(0.99, buckets) == 2.0  # rank 7.92 in +Inf: the highest finite bound
    assert math.isnan(bucket_quantile(0.5, [(1.0, 0.0), (math.inf, 0.0)]))


def test_rate_sum_by_and_quantile(ev):
    sel = '{model_name="m"}'
    # increases: le=1: 2, le=2: 5, +Inf: 7 -> rank 3.5 in (1, 2]: 1 + (3.5 - 2) / (5 - 2)
    q = ev.evaluate(f"histogram_quantile(0.5, sum by(le) (rate(x:lat_seconds_bucket{sel}[$__rate_interval])))")
    assert q == {frozenset(): pytest.approx(1.5)}
    mean = ev.evaluate(f"rate(x:lat_seconds_sum{sel}[5m])\n/\nrate(x:lat_seconds_count{sel}[5m])")
    assert mean == {frozenset({("model_name", "m")}): pytest.approx(14 / 7)}
    by_reason = ev.evaluate(f"sum by(finished_reason, reason) (increase(x:done_total{sel}[1m]))")
    assert by_reason == {frozenset({("reason", "stop")}): 0.0, frozenset({("reason", "length")}): 4.0}
    assert ev.evaluate(f"x:running{sel}") == {frozenset({("__name__", "x:running"), ("model_name", "m")}): 1.0}
    assert ev.evaluate('sum(x:done_total{reason=~"st.*"}) * 2') == {frozenset(): 12.0}
    assert ev.evaluate("x:missing") == {}


def test_label_values_and_tokens(ev):
    assert label_values(ev.after, "x:.*", "model_name") == {"m", "other"}
    assert [t[1] for t in tokenize('a{b=~"c\\"d"}[1m]')] == ["a", "{", "b", "=~", '"c\\"d"', "}", "[1m]"]
    with pytest.raises(ValueError):
        ev.evaluate("rate(x:done_total{model_name=\"m\"}")
