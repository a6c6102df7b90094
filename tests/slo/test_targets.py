"""Latency targets as a request, its headers and --slo-classes give them: every bad value is refused
naming the field, and the precedence is body over headers over class (API key over priority)."""

from __future__ import annotations

import math

import pytest

from kvserve.errors import ConfigError, InvalidRequestError
from kvserve.slo.targets import SLOClasses, SLOTarget

CLASSES = ('{"interactive": {"ttft_ms": 1000, "tpot_ms": 100, "priority": 0}, "batch": {"priority": 1}, '
           '"tenant": {"ttft_ms": 500, "on_miss": "queue", "api_keys": ["key-t"]}}')


def test_a_body_slo_is_parsed():
    target = SLOTarget.parse({"ttft_ms": 250, "tpot_ms": 40.5, "on_miss": "queue"}, "slo")
    assert target == SLOTarget(ttft_ms=250.0, tpot_ms=40.5, on_miss="queue")
    assert SLOTarget.parse({}, "slo") == SLOTarget() and not SLOTarget().has_targets


@pytest.mark.parametrize("fields,param,message", [
    ({"ttft_ms": -5}, "slo.ttft_ms", "between 1 and 8.64e+07 ms, got -5"),
    ({"ttft_ms": 0}, "slo.ttft_ms", "got 0"),
    ({"tpot_ms": 0.5}, "slo.tpot_ms", "got 0.5"),  # absurdly small: under a millisecond
    ({"tpot_ms": 1e9}, "slo.tpot_ms", "got 1e+09"),
    ({"ttft_ms": "fast"}, "slo.ttft_ms", "a number of milliseconds, got 'fast'"),
    ({"ttft_ms": True}, "slo.ttft_ms", "a number of milliseconds, got True"),
    ({"ttft_ms": [1]}, "slo.ttft_ms", "a number of milliseconds"),
    ({"ttft_ms": math.nan}, "slo.ttft_ms", "a number of milliseconds"),
    ({"on_miss": "drop"}, "slo.on_miss", "one of ['reject', 'queue'], got 'drop'"),
    ({"ttft": 5}, "slo.ttft", "unknown field(s) ['ttft']"),
])
def test_bad_targets_are_refused_naming_the_field(fields, param, message):
    with pytest.raises(InvalidRequestError) as error:
        SLOTarget.parse(fields, "slo")
    assert error.value.param == param and message in error.value.message


@pytest.mark.parametrize("headers,param", [({"ttft_ms": "soon"}, "X-SLO-TTFT-Ms"), ({"tpot_ms": "-1"}, "X-SLO-TPOT-Ms"),
                                           ({"on_miss": "never"}, "X-SLO-On-Miss")])
def test_bad_headers_are_refused_naming_the_header(headers, param):
    with pytest.raises(InvalidRequestError) as error:
        SLOTarget.from_headers(headers)
    assert error.value.param == param


def test_a_class_is_chosen_by_api_key_then_priority_and_overridden_field_by_field():
    classes = SLOClasses.from_json(CLASSES)
    assert classes.resolve({}, {}, 0, None) == SLOTarget(1000.0, 100.0, "reject", "interactive")
    assert classes.resolve({}, {}, 1, None) is None  # the batch class has no target
    assert classes.resolve({}, {}, 7, None) is None
    assert classes.resolve({}, {}, 0, "key-t") == SLOTarget(500.0, None, "queue", "tenant")  # key before priority
    headers = {"x-slo-ttft-ms": "2000", "x-slo-on-miss": "queue"}
    assert classes.resolve({}, headers, 0, None) == SLOTarget(2000.0, 100.0, "queue", "interactive")
    assert classes.resolve({"ttft_ms": 300}, headers, 0, None) == SLOTarget(300.0, 100.0, "queue", "interactive")
    assert classes.resolve({"tpot_ms": 50}, {}, 1, None) == SLOTarget(None, 50.0, "reject", "batch")


@pytest.mark.parametrize("text,message", [
    ("{", "is not JSON"),
    ('["a"]', "must be an object of classes"),
    ('{"a": {"ttft_ms": -1}}', "a.ttft_ms must be between"),
    ('{"a": {"priority": "high"}}', "a.priority must be an integer"),
    ('{"a": {"api_keys": "k"}}', "a.api_keys must be a list of strings"),
    ('{"a": {"priority": 0}, "b": {"priority": 0}}', "classes 'a' and 'b' both claim priority 0"),
    ('{"a": {"api_keys": ["k"]}, "b": {"api_keys": ["k"]}}', "both claim API key 'k'"),
])
def test_bad_classes_stop_the_start(text, message):
    with pytest.raises(ConfigError, match="--slo-classes") as error:
        SLOClasses.from_json(text)
    assert message in str(error.value)


def test_met_compares_ttft_and_tpot_in_milliseconds():
    target = SLOTarget(ttft_ms=1000, tpot_ms=100)
    assert target.met(1.0, 0.1) and not target.met(1.001, 0.05) and not target.met(0.5, 0.1001)
    assert SLOTarget(tpot_ms=100).met(99.0, 0.0)  # no TTFT target; one token has TPOT 0
