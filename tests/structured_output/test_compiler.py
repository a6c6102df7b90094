"""The compile service: off the caller's thread, cached by canonical spec, deadline, rejections
cached, late results kept."""

from __future__ import annotations

import threading
import time

import pytest

from kvserve.structured_output import (
    GrammarCompileService,
    GrammarCompileTimeout,
    StructuredOutputError,
    StructuredOutputsConfig,
    StructuredOutputsParams,
)
from kvserve.structured_output.backend import CompiledGrammar, StructuredOutputBackend


class _Compiled(CompiledGrammar):
    def __init__(self, text):
        self.text = text

    def new_grammar(self):
        raise NotImplementedError


class SlowBackend(StructuredOutputBackend):
    """Compiles in ``delay`` seconds; refuses regexes that contain 'bad'."""

    def __init__(self, delay: float):
        super().__init__([], 10, [0], StructuredOutputsConfig(compile_timeout_s=5))
        self.delay = delay
        self.calls = 0
        self.release = threading.Event()

    def compile(self, params):
        self.calls += 1
        if self.delay < 0:
            self.release.wait(10)
        else:
            time.sleep(self.delay)
        if "bad" in params.spec_text():
            raise StructuredOutputError(f"{params.source}: bad spec", param=params.source)
        return _Compiled(params.spec_text())


def test_submit_returns_at_once_and_caches_by_canonical_text():
    backend = SlowBackend(0.2)
    service = GrammarCompileService(backend)
    start = time.perf_counter()
    future = service.submit(StructuredOutputsParams(json={"a": 1}))
    assert time.perf_counter() - start < 0.1 and not future.done()
    assert future.result().text == '{"a":1}'
    again = service.submit(StructuredOutputsParams(json='{"a":   1}', source="guided_json"))
    assert again.done() and again.result() is future.result()
    assert backend.calls == 1 and service.hits == 1 and service.misses == 1


def test_concurrent_requests_share_one_compile():
    backend = SlowBackend(0.2)
    service = GrammarCompileService(backend)
    futures = [service.submit(StructuredOutputsParams(regex="x+")) for _ in range(5)]
    assert len({f.result() for f in futures}) == 1 and backend.calls == 1


def test_rejections_are_cached_and_keep_their_param():
    backend = SlowBackend(0.0)
    service = GrammarCompileService(backend)
    for _ in range(2):
        with pytest.raises(StructuredOutputError) as info:
            service.compile(StructuredOutputsParams(regex="bad", source="guided_regex"))
        assert info.value.param == "guided_regex"
    assert backend.calls == 1


def test_deadline_refuses_the_request_and_keeps_the_late_result():
    backend = SlowBackend(-1)  # blocks until released
    service = GrammarCompileService(backend, timeout_s=0.2)
    params = StructuredOutputsParams(regex="slow")
    with pytest.raises(GrammarCompileTimeout) as info:
        service.compile(params)
    assert "longer than the 0.2 s limit" in info.value.message
    assert info.value.param == "structured_outputs"
    backend.release.set()
    deadline = time.time() + 5
    while not service.cached(params) and time.time() < deadline:
        time.sleep(0.01)
    assert service.submit(params).result().text == "slow"


def test_bad_json_text_fails_the_future_not_the_caller():
    service = GrammarCompileService(SlowBackend(0.0))
    future = service.submit(StructuredOutputsParams(json="{oops", source="guided_json"))
    with pytest.raises(StructuredOutputError) as info:
        future.result()
    assert info.value.param == "guided_json"
