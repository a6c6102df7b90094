"""Benchmark arithmetic on scripted streams with known timestamps.

All timestamps are dyadic fractions (exact in binary floating point), so the expected values
below, computed by hand, are exact; percentiles follow linear interpolation between order
statistics: for sorted x[0..n-1], p -> x[i] + f * (x[i+1] - x[i]) with i + f = p/100 * (n - 1).
"""

from __future__ import annotations

import json

import pytest

from kvserve.bench.metrics import calculate_metrics, parse_goodput, peak_concurrency
from kvserve.bench.stream import RequestFuncOutput, SSEParser, StreamAccumulator
from kvserve.errors import InvalidRequestError


def completion_chunk(text: str) -> str:
    return json.dumps({"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": text}]})


def usage_chunk(prompt: int | None, completion: int) -> str:
    usage = {"completion_tokens": completion}
    if prompt is not None:
        usage["prompt_tokens"] = prompt
    return json.dumps({"id": "cmpl-1", "choices": [], "usage": usage})


def run_script(start: float, prompt_len: int, events: list[tuple[float, str]], end: float) -> RequestFuncOutput:
    acc = StreamAccumulator(start, prompt_len)
    for now, data in events:
        acc.on_data(data, now)
    return acc.finish(end)


def test_completions_stream_timings():
    out = run_script(0.0, 5, [
        (0.25, completion_chunk("Hel")),
        (0.375, completion_chunk("lo")),
        (0.625, completion_chunk(" wo")),
        (0.6875, completion_chunk("rld")),
        (0.75, usage_chunk(6, 5)),
        (0.875, "[DONE]"),
    ], end=1.0)
    assert out.success and out.error == ""
    assert out.generated_text == "Hello world"
    assert out.ttft == 0.25
    assert out.itl == [0.125, 0.25, 0.0625]
    assert out.latency == 1.0
    assert (out.output_tokens, out.output_tokens_source, out.prompt_len) == (5, "usage", 6)
    m = calculate_metrics([out], duration_s=1.0)
    assert m.tpot_ms.mean == 187.5  # (1000 - 250) / (5 - 1)
    assert m.total_token_throughput == 11.0


def test_chat_role_chunk_is_not_a_token():
    role = json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    hi = json.dumps({"choices": [{"index": 0, "delta": {"content": "Hi"}}]})
    bang = json.dumps({"choices": [{"index": 0, "delta": {"content": "!"}, "finish_reason": "length"}]})
    out = run_script(2.0, 3, [(2.125, role), (2.5, hi), (2.75, bang), (2.875, usage_chunk(None, 2))], end=3.0)
    assert out.success
    assert (out.ttft, out.itl, out.latency) == (0.5, [0.25], 1.0)
    assert (out.output_tokens, out.prompt_len) == (2, 3)  # no prompt_tokens in usage: keep ours


def test_error_event_and_empty_stream_fail():
    err = run_script(0.0, 1, [(0.5, completion_chunk("a")), (0.75, json.dumps({"error": {"message": "oom"}}))], 1.0)
    assert not err.success and "oom" in err.error
    empty = run_script(0.0, 1, [(0.5, usage_chunk(1, 0)), (0.75, "[DONE]")], 1.0)
    assert not empty.success and "without any generated text" in empty.error
    bad = run_script(0.0, 1, [(0.5, "{not json")], 1.0)
    assert not bad.success and "not JSON" in bad.error
    http = StreamAccumulator(0.0, 1).finish(0.5, "HTTP 500: boom")
    assert not http.success and http.error == "HTTP 500: boom" and http.latency == 0.5


def test_sse_parser_joins_multiline_data_and_skips_comments():
    parser = SSEParser()
    lines = [": keep-alive", "", "event: message", 'data: {"a":', "data: 1}", "", "data:[DONE]", ""]
    assert [d for d in map(parser.feed_line, lines) if d is not None] == ['{"a":\n1}', "[DONE]"]
    parser.feed_line("data: tail")
    assert parser.flush() == "tail" and parser.flush() is None


def _out(start, ttft, latency, tokens, itl, prompt_len, error=""):
    return RequestFuncOutput(success=not error, error=error, prompt_len=prompt_len, output_tokens=tokens,
                             output_tokens_source="usage", ttft=ttft, itl=itl, latency=latency,
                             start_time=start, end_time=start + latency)


@pytest.fixture
def four_requests():
    return [
        _out(0.0, 0.25, 1.0, 5, [0.125, 0.25, 0.0625], 6),   # TPOT 0.1875 s
        _out(0.5, 0.5, 1.5, 3, [0.5, 0.25], 10),             # TPOT 0.5 s
        _out(0.75, 0.125, 0.125, 1, [], 4),                  # one token: no TPOT
        _out(1.5, 0.0, 0.25, None, [], 7, error="HTTP 500: boom"),
    ]


def test_summary_statistics(four_requests):
    m = calculate_metrics(four_requests, duration_s=2.0, percentiles=(50, 90, 99))
    assert (m.completed, m.failed, m.first_error) == (3, 1, "HTTP 500: boom")
    assert (m.total_input_tokens, m.total_output_tokens) == (20, 9)
    assert (m.request_throughput, m.input_throughput, m.output_throughput, m.total_token_throughput) == (
        1.5, 10.0, 4.5, 14.5)
    assert m.peak_concurrency == 3  # at t=0.75 requests 1, 2 and 3 are in flight
    # TTFT [125, 250, 500] ms
    assert m.ttft_ms.count == 3 and m.ttft_ms.mean == pytest.approx(875 / 3, rel=1e-12)
    assert m.ttft_ms.median == 250.0
    assert m.ttft_ms.percentiles == pytest.approx({50.0: 250.0, 90.0: 450.0, 99.0: 495.0}, rel=1e-12)
    # TPOT [187.5, 500] ms
    assert (m.tpot_ms.count, m.tpot_ms.mean, m.tpot_ms.median) == (2, 343.75, 343.75)
    assert m.tpot_ms.percentiles == pytest.approx({50.0: 343.75, 90.0: 468.75, 99.0: 496.875}, rel=1e-12)
    # ITL pooled [62.5, 125, 250, 250, 500] ms
    assert (m.itl_ms.count, m.itl_ms.mean, m.itl_ms.median) == (5, 237.5, 250.0)
    assert m.itl_ms.percentiles == pytest.approx({50.0: 250.0, 90.0: 400.0, 99.0: 490.0}, rel=1e-12)
    # E2E [125, 1000, 1500] ms
    assert (m.e2el_ms.mean, m.e2el_ms.median) == (875.0, 1000.0)
    assert m.e2el_ms.percentiles == pytest.approx({50.0: 1000.0, 90.0: 1400.0, 99.0: 1490.0}, rel=1e-12)
    assert m.goodput is None


def test_goodput(four_requests):
    # ttft <= 300 ms and tpot <= 200 ms: requests 1 and 3 (3 has no TPOT); 2 has TTFT 500.
    m = calculate_metrics(four_requests, 2.0, goodput_slos_ms=parse_goodput(["ttft:300", "tpot:200"]))
    assert m.goodput == 1.0
    # adding e2el <= 900 ms drops request 1 (1000 ms).
    m = calculate_metrics(four_requests, 2.0, goodput_slos_ms={"ttft": 300, "tpot": 200, "e2el": 900})
    assert m.goodput == 0.5


def test_parse_goodput_rejects_bad_items():
    assert parse_goodput(["e2el:1500.5"]) == {"e2el": 1500.5}
    for bad in (["ttft"], ["itl:5"], ["ttft:abc"], ["tpot:0"]):
        with pytest.raises(InvalidRequestError):
            parse_goodput(bad)


def test_peak_concurrency_end_frees_before_start():
    back_to_back = [_out(0.0, 0.25, 1.0, 2, [], 1), _out(1.0, 0.25, 1.0, 2, [], 1)]
    assert peak_concurrency(back_to_back) == 1
    assert peak_concurrency([]) == 0


def test_no_completed_requests():
    m = calculate_metrics([_out(0.0, 0.0, 0.5, None, [], 3, error="x")], duration_s=0.5)
    assert (m.completed, m.failed, m.output_throughput, m.ttft_ms.count, m.ttft_ms.mean) == (0, 1, 0.0, 0, 0.0)
