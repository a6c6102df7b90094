"""Hostile-client findings on /v1/responses and /v1/messages (loopback, scripted engine): each
request here once got a 500 or a misleading answer; now each is a 4xx naming the field it is
about, nothing is started, and the server goes on serving."""

from __future__ import annotations

import httpx
import pytest

from kvserve.testing.tokenizer_kinds import build_tokenizer
from loopback import LoopbackServer
from scripted_engine import ScriptedEngine
from test_server_errors import assert_error


@pytest.fixture(scope="module")
def srv():
    with LoopbackServer(ScriptedEngine(build_tokenizer("bpe"), step_delay=0.001)) as server:
        yield server


def responses(srv, **body) -> httpx.Response:
    return httpx.post(srv.base_url + "/v1/responses", timeout=30,
                      json={"model": "scripted-model", "input": "hi", "max_output_tokens": 2, **body})


def messages(srv, **body) -> httpx.Response:
    return httpx.post(srv.base_url + "/v1/messages", timeout=30,
                      json={"model": "scripted-model", "max_tokens": 2,
                            "messages": [{"role": "user", "content": "hi"}], **body})


def assert_still_serving(srv) -> None:
    assert srv.state.in_flight == 0
    assert responses(srv).status_code == 200


@pytest.mark.parametrize("key, value", [("content", {"text": "x"}), ("content", 5), ("content", "thought"),
                                        ("summary", {"0": {"text": "x"}}), ("summary", 3)])
def test_a_reasoning_item_whose_parts_are_not_a_list_is_400(srv, key, value):
    calls = len(srv.engine.calls)
    error = assert_error(responses(srv, input=[{"type": "reasoning", key: value}]), 400, param=f"input.0.{key}")
    assert "list" in error["message"]
    assert len(srv.engine.calls) == calls
    assert_still_serving(srv)


def test_a_replay_starting_before_the_first_event_is_400_not_the_last_events(srv):
    events = httpx.post(srv.base_url + "/v1/responses", timeout=30, json={
        "model": "scripted-model", "input": "hi", "max_output_tokens": 3, "background": True, "stream": True}).text
    response_id = events.split('"id":"', 1)[1].split('"', 1)[0]
    url = f"{srv.base_url}/v1/responses/{response_id}"
    every = httpx.get(url, params={"stream": "true"}, timeout=30).text
    assert httpx.get(url, params={"stream": "true", "starting_after": -1}, timeout=30).text == every
    for bad in (-2, -5):
        error = assert_error(httpx.get(url, params={"stream": "true", "starting_after": bad}, timeout=30), 400,
                             param="starting_after")
        assert str(bad) in error["message"]
    assert_still_serving(srv)
