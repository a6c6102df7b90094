"""``kvserve bench compare`` end to end on the built-in model: two kvserve servers (one started by
the spec's start command with prefix caching on and restarted by ``stop-start``, one running in
this process with prefix caching off behind an API key), a third skipped by its ``only_if``. Two
load levels, every failure probe, the reports, a second run that resumes without measuring, and
the HTML page in headless Chromium (screenshot, no console errors, every plot drawn)."""

from __future__ import annotations

import json
import math
import shlex
import sys
import time
from pathlib import Path

import pytest

from kvserve.bench.cli import main
from kvserve.builtin import BUILTIN_MODEL_NAME, builtin_model_path
from kvserve.testing.live_server import free_port, start_live_server

from bench_chromium import check_page, find_chromium

REPO = Path(__file__).resolve().parents[2]
REQUESTS, OUTPUT_LEN = 6, 8
# About a minute on a quiet machine (two `kvserve serve` starts: the first and the restart). The
# limits leave room for a machine whose kernels are being rebuilt by a parallel install.
pytestmark = [pytest.mark.timeout(1500), pytest.mark.slow]


def tiny_spec(port: int, other_url: str) -> str:
    serve = (f"exec {shlex.quote(sys.executable)} -m kvserve.cli serve --host 127.0.0.1 --port {port} "
             "--enable-prefix-caching --cpu-threads 1 --uvicorn-log-level warning")
    return f"""
name: tiny-ci
description: prefix caching on (started by the spec) and off (in-process), built-in model
hardware: the CI machine
model: {{name: {BUILTIN_MODEL_NAME}}}
requests:
  seed: 3
  datasets:
    - name: prose
      weight: 3
      input_len: {{dist: uniform, low: 8, high: 24}}
      output_len: {{dist: fixed, value: {OUTPUT_LEN}}}
      shared_prefix: {{share: 0.5, prefix_len: 32, num_prefixes: 2}}
    - name: chat
      api: chat
      input_len: {{dist: lognormal, median: 12, sigma: 0.5, max: 48}}
      output_len: {{dist: fixed, value: {OUTPUT_LEN}}}
  long_context: {{share: 0.2, input_len: {{dist: fixed, value: 160}}}}
load:
  concurrency: [1, 3]
  requests_per_level: {REQUESTS}
  warmup_requests: 1
  request_timeout_s: 120
slos:
  ttft: {{limit_ms: 60000, percentile: 90}}
  tpot: {{limit_ms: 30000, percentile: 90}}
capacity: {{target_request_rate: 50, headroom: 0.5, max_replicas: 1000}}
probes:
  cache_exhaustion: {{requests: 6, output_len: 8}}
  disconnect_storm: {{requests: 4, output_len: 64}}
  restart: {{concurrency: 2, load_before_s: 0.3, load_after_s: 0.3, timeout_s: 600}}
engines:
  - name: pc-on
    base_url: http://127.0.0.1:{port}
    start: {json.dumps(serve)}
    restart: stop-start
    metrics_url: http://127.0.0.1:{port}/metrics
    ready_timeout_s: 600
  - name: pc-off
    base_url: {other_url}
    api_key_env: COMPARE_TEST_KEY
    metrics_url: {other_url}/metrics
    notes: in-process server of the test
  - name: absent
    base_url: http://127.0.0.1:9
    only_if: "false"
"""


@pytest.fixture(scope="module")
def pc_off_server():
    server = start_live_server(str(builtin_model_path()), served_model_name=BUILTIN_MODEL_NAME,
                               api_key="compare-secret", enable_prefix_caching=False)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def compare_run(pc_off_server, tmp_path_factory):
    """Run the tiny spec once (module scope: the tests below read its output)."""
    root = tmp_path_factory.mktemp("compare")
    spec = root / "tiny.yaml"
    spec.write_text(tiny_spec(free_port(), pc_off_server.base_url))
    out = root / "out"
    mp = pytest.MonkeyPatch()
    mp.setenv("COMPARE_TEST_KEY", "compare-secret")
    mp.setattr(sys, "argv", ["kvserve", "bench", "compare", "--spec", str(spec), "--out", str(out)])
    try:
        start = time.perf_counter()
        code = main(["bench", "compare", "--spec", str(spec), "--out", str(out)])
        seconds = time.perf_counter() - start
        first_cells = {p: p.read_bytes() for p in sorted((out / "cells").rglob("*.json"))}
        resumed = main(["bench", "compare", "--spec", str(spec), "--out", str(out)])
    finally:
        mp.undo()
    return {"code": code, "resumed": resumed, "out": out, "seconds": seconds, "first_cells": first_cells,
            "doc": json.loads((out / "compare.json").read_text())}


def engine(doc: dict, name: str) -> dict:
    return next(e for e in doc["engines"] if e["name"] == name)


def test_every_engine_and_level_measured(compare_run):
    doc = compare_run["doc"]
    assert compare_run["code"] == 0
    assert [e["name"] for e in doc["engines"]] == ["pc-on", "pc-off", "absent"]
    assert engine(doc, "absent")["status"] == "skipped"
    assert engine(doc, "absent")["info"]["skipped"] == "only_if failed ('false' exited 1)"
    for name in ("pc-on", "pc-off"):
        e = engine(doc, name)
        assert e["status"] == "measured" and [lvl["label"] for lvl in e["levels"]] == ["c=1", "c=3"]
        for lvl in e["levels"]:
            assert (lvl["requests"], lvl["completed"], lvl["failed"]) == (REQUESTS, REQUESTS, 0)
            assert lvl["meets_slos"] and lvl["goodput"] == pytest.approx(lvl["request_throughput"])
            assert lvl["output_tokens_from_tokenizer"] == 0
            assert [s["percentile"] for s in lvl["short_percentiles"]] == [90.0, 99.0]  # 6 requests: too few
        assert e["levels"][0]["peak_concurrency"] == 1
        knee = e["knee"]
        assert knee["label"] == "c=3" and knee["goodput"] == e["levels"][1]["goodput"]
        replicas = math.ceil(50 / (knee["goodput"] * 0.5) - 1e-9)
        assert e["capacity"]["replicas"] == replicas and e["capacity"]["within_budget"] is True
        assert e["capacity"]["arithmetic"].endswith(f"= {replicas} (within the budget of 1000)")
        info = e["info"]
        assert info["model"] == BUILTIN_MODEL_NAME and info["max_model_len"] == 256
        assert info["version"]["version"] and info["metrics_readable"] is True
        assert "this machine" in info["machine"]
    flags = engine(doc, "pc-on")["info"]["flags"]
    assert flags[:3] == ["--host", "127.0.0.1", "--port"]
    assert flags[4:] == ["--enable-prefix-caching", "--cpu-threads", "1", "--uvicorn-log-level", "warning"]


def test_cells_record_exact_requests(compare_run):
    out = compare_run["out"]
    cell = json.loads((out / "cells" / "pc-off" / "c3.json").read_text())
    assert cell["num_requests"] == REQUESTS and cell["config"]["headers"] == {"Authorization": "<redacted>"}
    assert [r["output_tokens"] for r in cell["requests"]] == [OUTPUT_LEN] * REQUESTS
    assert cell["provenance"]["server"]["model"] == BUILTIN_MODEL_NAME and cell["provenance"]["git_commit"]
    same = json.loads((out / "cells" / "pc-on" / "c3.json").read_text())
    assert [r["prompt_len"] for r in same["requests"]] == [r["prompt_len"] for r in cell["requests"]]
    # the cell against the roofline bound: the kvserve server's /version names its model and format
    for c in (cell, same):
        roofline = c["roofline"]
        assert roofline["cap"] == 3 and roofline["output_tokens"] == OUTPUT_LEN * REQUESTS
        assert roofline["fraction"] == pytest.approx(roofline["bound_s"] / c["metrics"]["duration_s"])
        assert roofline["assumed"] == [] and c["provenance"]["machine_peaks"]["bandwidth_gbs"] > 0


def test_failure_probes(compare_run):
    doc = compare_run["doc"]
    on, off = engine(doc, "pc-on")["probes"], engine(doc, "pc-off")["probes"]
    for probes in (on, off):
        over = probes["over_long_prompt"]
        assert over["outcome"] == "pass" and over["status_code"] == 400 and over["prompt_tokens"] == 256 + 16
        assert "maximum context length is 256" in over["body"] and over["canary_after_ok"] is True
        burst = probes["cache_exhaustion"]
        assert burst["outcome"] == "pass" and burst["requests"] == 6 and burst["prompt_len"] == 192
        assert burst["failed"] == 0 and burst["recovery_s"] is not None and burst["ttft_p99_ms"] > 0
        storm = probes["disconnect_storm"]
        assert storm["outcome"] == "pass" and storm["chunks_read"] == [1, 1, 1, 1]
        assert storm["gauges_settled"]["num_requests_running"] == 0.0
        assert storm["gauges_settled"]["num_requests_waiting"] == 0.0 and storm["next_request_ok"] is True
    restart = on["restart"]
    assert restart["outcome"] == "pass" and restart["command"] == "stop-start" and restart["time_to_ready_s"] > 0
    assert restart["requests_total"] >= 1
    assert on["cold_start"]["outcome"] == "pass" and on["cold_start"]["cold_start_s"] > 0
    assert off["restart"] == {"outcome": "skipped", "summary": "no restart command in the spec"}
    assert "cold_start" not in off  # no start command: nothing to time


def test_second_run_resumes_without_measuring(compare_run):
    assert compare_run["resumed"] == 0
    cells = {p: p.read_bytes() for p in sorted((compare_run["out"] / "cells").rglob("*.json"))}
    assert len(cells) == 4 and cells == compare_run["first_cells"]
    log = (compare_run["out"] / "logs" / "pc-on.log").read_text()
    assert log.count("$ exec ") == 2  # the first start and the restart's; the resumed run started nothing


def test_markdown_summary(compare_run):
    md = (compare_run["out"] / "report.md").read_text()
    assert md.startswith("# bench compare: tiny-ci\n")
    for line in ("| pc-on | c=1 | 6/6 |", "| pc-off | c=3 | 6/6 |", "| pc-on | restart | pass |",
                 "| pc-off | restart | skipped | no restart command in the spec |", "| absent | skipped | none |"):
        assert line in md


def test_html_report_in_headless_chromium(compare_run, tmp_path):
    chromium, why = find_chromium()
    if chromium is None:
        pytest.skip(f"no Chromium could be installed on this host: {why}")
    page = compare_run["out"] / "report.html"
    html = page.read_text()
    assert "http://" not in html.split("<h2 id=\"provenance\">")[0].replace("http://www.w3.org", "")  # nothing fetched
    check = check_page(chromium, page, tmp_path / "report.png")
    assert check.errors == []
    assert [(name, loaded) for name, loaded, _ in check.plots] == [
        ("throughput_latency", True), ("goodput_load", True), ("ttft_cdf", True), ("itl_cdf", True)]
    assert all(width > 300 for _, _, width in check.plots)
    assert check.tables["capacity"] == 1 + 3 and check.tables["failures"] == 1 + 3
    assert check.tables["provenance"] == 1 + 3 and check.tables["slos"] == 1 + 2
    png = check.screenshot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 50_000
