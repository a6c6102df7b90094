"""``kvserve bench serve`` end to end against the scripted SSE server: counts, failures,
warmups, concurrency cap, duration, and the provenance every result file must carry."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from bench_sse_server import MODEL, PROMPT_TOKENS, VERSION, ScriptedServer

from kvserve.bench.cli import main
from kvserve.bench.prompts import load_tokenizer

GIT = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]


@pytest.fixture(scope="module")
def server():
    with ScriptedServer() as s:
        yield s


@pytest.fixture
def git_repo(tmp_path, monkeypatch):
    """A fresh repository with one commit as the cwd; returns its HEAD."""
    subprocess.run([*GIT, "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "f.txt").write_text("a\n")
    subprocess.run([*GIT, "add", "f.txt"], cwd=tmp_path, check=True)
    subprocess.run([*GIT, "commit", "-q", "-m", "x"], cwd=tmp_path, check=True)
    monkeypatch.chdir(tmp_path)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()


def run_cli(monkeypatch, args: list[str]) -> int:
    argv = ["kvserve", "bench", *args]
    monkeypatch.setattr(sys, "argv", argv)
    return main(argv[1:])


def test_serve_random_writes_result_with_provenance(server, tokenizer_dir, git_repo, monkeypatch, tmp_path):
    result = tmp_path / "out" / "serve.json"
    n = len(server.received)
    args = ["serve", "--base-url", server.base_url, "--tokenizer", tokenizer_dir, "--input-len", "12",
            "--output-len", "5", "--num-prompts", "6", "--num-warmups", "2", "--max-concurrency", "2",
            "--ignore-eos", "--goodput", "ttft:60000", "--percentiles", "50,75", "--disable-tqdm",
            "--result-file", str(result)]
    assert run_cli(monkeypatch, args) == 0
    doc = json.loads(result.read_text())
    # Provenance
    prov = doc["provenance"]
    assert prov["command"] == ["kvserve", "bench", *args]
    assert (prov["git_commit"], prov["git_dirty"], prov["git_error"]) == (git_repo, False, "")
    assert prov["server"]["version"] == VERSION and prov["server"]["model"] == MODEL
    assert prov["server"]["base_url"] == server.base_url
    assert prov["kvserve_version"] and prov["python_version"] and prov["torch_version"]
    assert prov["cpu_model"] and prov["cpu_count"] >= 1 and prov["timestamp"].endswith("+00:00")
    # What was sent: 2 warmups + 6 measured, exact prompt lengths, the server's model name.
    bodies = server.received[n:]
    assert len(bodies) == 8 and all(b["model"] == MODEL and b["max_tokens"] == 5 for b in bodies)
    tok = load_tokenizer(tokenizer_dir)
    assert all(len(tok(b["prompt"], add_special_tokens=False)["input_ids"]) == 12 for b in bodies)
    warmup, measured = {b["prompt"] for b in bodies[:2]}, {b["prompt"] for b in bodies[2:]}
    assert len(measured) == 6 and not warmup & measured  # warmups do not pre-cache measured prompts
    # What was measured
    m = doc["metrics"]
    assert (m["completed"], m["failed"], m["total_output_tokens"]) == (6, 0, 30)
    assert m["total_input_tokens"] == 6 * PROMPT_TOKENS  # the server's usage wins
    assert 1 <= m["peak_concurrency"] <= 2
    assert m["goodput"] == pytest.approx(6 / m["duration_s"])
    assert set(m["ttft_ms"]["percentiles"]) == {"50.0", "75.0"}
    assert doc["warmup_failed"] == 0 and len(doc["requests"]) == 6
    assert doc["num_requests"] == doc["num_distinct_prompts"] == 6
    assert doc["config"]["request_rate"] == "inf"


def test_failed_requests_are_counted(server, tokenizer_dir, monkeypatch, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('"fine prompt"\n"FAIL here"\n{"prompt": "NOUSAGE counted by tokenizer", "output_len": 3}\n')
    result = tmp_path / "r.json"
    rc = run_cli(monkeypatch, ["serve", "--base-url", server.base_url, "--tokenizer", tokenizer_dir,
                               "--dataset-name", "jsonl", "--dataset-path", str(prompts), "--output-len", "4",
                               "--endpoint", "/v1/chat/completions", "--disable-tqdm",
                               "--result-file", str(result)])
    assert rc == 1
    m = json.loads(result.read_text())["metrics"]
    assert (m["completed"], m["failed"]) == (2, 1)
    assert m["first_error"].startswith("HTTP 500")
    tok = load_tokenizer(tokenizer_dir)
    assert m["output_tokens_from_tokenizer"] == 1
    assert m["total_output_tokens"] == 4 + len(tok(" w0 w1 w2", add_special_tokens=False)["input_ids"])


def test_duration_and_rate(server, tokenizer_dir, monkeypatch, tmp_path):
    result = tmp_path / "d.json"
    rc = run_cli(monkeypatch, ["serve", "--base-url", server.base_url, "--tokenizer", tokenizer_dir,
                               "--input-len", "4", "--output-len", "2", "--num-prompts", "3", "--duration", "0.4",
                               "--request-rate", "40", "--burstiness", "2", "--disable-tqdm",
                               "--result-file", str(result)])
    assert rc == 0
    doc = json.loads(result.read_text())
    assert doc["metrics"]["completed"] > 3  # the 3 prompts were cycled, and the file says so
    assert (doc["num_distinct_prompts"], doc["num_requests"]) == (3, doc["metrics"]["completed"])
    assert all(r["start_s"] < 0.4 + 0.2 for r in doc["requests"])


def test_missing_version_is_recorded(tokenizer_dir, monkeypatch, tmp_path):
    with ScriptedServer(with_version=False) as bare:
        result = tmp_path / "v.json"
        rc = run_cli(monkeypatch, ["serve", "--base-url", bare.base_url, "--tokenizer", tokenizer_dir,
                                   "--input-len", "4", "--output-len", "2", "--num-prompts", "1",
                                   "--disable-tqdm", "--result-file", str(result)])
    assert rc == 0
    server = json.loads(result.read_text())["provenance"]["server"]
    assert server["version"] is None and server["version_error"].startswith("HTTP 404")


def test_bad_arguments_exit_2(server, tokenizer_dir, monkeypatch, capsys):
    rc = run_cli(monkeypatch, ["serve", "--base-url", server.base_url, "--tokenizer", tokenizer_dir,
                               "--goodput", "latency:5", "--num-prompts", "1"])
    assert rc == 2 and "goodput SLO 'latency:5'" in capsys.readouterr().err
    rc = run_cli(monkeypatch, ["serve", "--base-url", server.base_url, "--tokenizer", tokenizer_dir,
                               "--duration", "1", "--num-prompts", "1", "--input-len", "3"])
    assert rc == 2 and "--max-concurrency" in capsys.readouterr().err
