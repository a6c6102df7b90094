"""``kvserve bench serve`` and ``kvserve bench sweep`` end to end against a live kvserve server
(the real engine on the tiny Llama checkpoint, uvicorn on loopback): every request completes,
outputs have exactly ``--output-len`` tokens (``--ignore-eos``), the server's prompt-token usage
equals the benchmark's exact prompt lengths, TTFT <= E2E, provenance is recorded, and the sweep
writes its PNG."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvserve.bench.cli import main
from kvserve.testing.live_server import start_live_server

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def live(tiny_llama):
    server = start_live_server(str(tiny_llama), served_model_name="tiny-llama", api_key="",
                               max_model_len=512, enable_prefix_caching=True)
    yield server
    server.stop()


def run_bench(monkeypatch, args: list[str]) -> int:
    argv = ["kvserve", "bench", *args]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.chdir(REPO)  # provenance reads the git state of the cwd
    return main(argv[1:])


def head_commit() -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()


def check_run(run: dict, num_prompts: int, input_len: int, output_len: int) -> None:
    """The numbers one online run must have whatever the machine's speed."""
    m = run["metrics"]
    assert (m["completed"], m["failed"], m["first_error"]) == (num_prompts, 0, "")
    assert m["total_output_tokens"] == num_prompts * output_len
    assert m["total_input_tokens"] == num_prompts * input_len  # the server's usage.prompt_tokens
    assert m["output_tokens_from_tokenizer"] == 0  # every count came from the server's usage
    assert len(run["requests"]) == num_prompts == run["num_distinct_prompts"]
    for r in run["requests"]:
        assert r["success"] and r["error"] == ""
        assert (r["prompt_len"], r["output_tokens"], r["output_tokens_source"]) == (input_len, output_len, "usage")
        assert 0 < r["ttft_s"] <= r["e2el_s"]
        assert len(r["itl_s"]) >= 1 and all(gap >= 0 for gap in r["itl_s"])
    assert m["ttft_ms"]["count"] == num_prompts and m["e2el_ms"]["count"] == num_prompts
    assert 0 < m["ttft_ms"]["mean"] <= m["e2el_ms"]["mean"]
    assert m["tpot_ms"]["count"] == num_prompts and m["tpot_ms"]["mean"] > 0
    expected_rate = m["total_output_tokens"] / m["duration_s"]
    assert m["output_throughput"] == pytest.approx(expected_rate)


def test_bench_serve_finds_the_tokenizer_of_a_served_name(live, tiny_llama, monkeypatch, tmp_path):
    """``--model`` names the served model (not a folder) and no ``--tokenizer`` is given: the
    tokenizer comes from the folder the server's /v1/models reports as the model's root."""
    import httpx

    cards = httpx.get(live.base_url + "/v1/models").json()["data"]
    assert [(c["id"], c["root"]) for c in cards] == [("tiny-llama", str(tiny_llama.resolve()))]
    result = tmp_path / "serve.json"
    args = ["serve", "--base-url", live.base_url, "--model", "tiny-llama", "--dataset-name", "random",
            "--input-len", "16", "--output-len", "4", "--num-prompts", "2", "--ignore-eos", "--disable-tqdm",
            "--result-file", str(result)]
    assert run_bench(monkeypatch, args) == 0
    doc = json.loads(result.read_text())
    assert (doc["model_id"], doc["tokenizer_id"]) == ("tiny-llama", "tiny-llama")  # vLLM's keys: the --model given
    check_run(doc, 2, 16, 4)


def test_why_no_tokenizer_folder_was_found_is_said(live, tiny_llama):
    from kvserve.bench.commands import served_model_root

    assert served_model_root(live.base_url, "tiny-llama", {}, True) == (str(tiny_llama.resolve()), "")
    assert served_model_root(live.base_url, "bar", {}, True) == (None, "the server lists no model 'bar' (it serves: "
                                                                       "tiny-llama)")
    root, why = served_model_root("http://127.0.0.1:9", "tiny-llama", {}, True)
    assert root is None and why.startswith("http://127.0.0.1:9/v1/models could not be read (ConnectError")


def test_compare_and_route_find_the_tokenizer_from_the_servers_root(live, tiny_llama, tmp_path):
    """``bench compare`` without ``model.tokenizer`` and ``route`` without ``--tokenizer`` take the
    folder a worker reports as its model's root."""
    from types import SimpleNamespace

    from kvserve.bench.compare.run import resolve_tokenizer
    from kvserve.errors import InvalidRequestError
    from kvserve.router.launcher import worker_model_folder

    assert worker_model_folder(["http://127.0.0.1:9", live.base_url]) == str(tiny_llama.resolve())
    spec = SimpleNamespace(model=SimpleNamespace(name="tiny-llama", tokenizer=None))  # what it reads of a spec
    cache: dict = {}
    tokenizer = resolve_tokenizer(spec, "tiny-llama", cache, str(tiny_llama.resolve()))
    assert list(cache) == [str(tiny_llama.resolve())] and tokenizer("hello")["input_ids"]
    with pytest.raises(InvalidRequestError, match="model.tokenizer is required"):
        resolve_tokenizer(spec, "tiny-llama", {}, str(tmp_path / "not-here"))


def check_provenance(doc: dict, argv: list[str], live) -> None:
    prov = doc["provenance"]
    assert prov["command"] == argv
    assert prov["git_commit"] == head_commit() and prov["git_error"] == ""
    assert isinstance(prov["git_dirty"], bool)
    assert prov["kvserve_version"] and prov["python_version"] and prov["torch_version"]
    assert prov["cpu_model"] and prov["cpu_count"] >= 1
    assert prov["server"]["base_url"] == live.base_url
    assert prov["server"]["model"] == "tiny-llama" and prov["server"]["models_error"] == ""
    assert prov["server"]["version_error"] == "" and prov["server"]["version"]


def test_bench_serve_against_live_kvserve(live, tiny_llama, monkeypatch, tmp_path):
    result = tmp_path / "serve.json"
    args = ["serve", "--base-url", live.base_url, "--tokenizer", str(tiny_llama), "--dataset-name", "random",
            "--input-len", "24", "--output-len", "12", "--num-prompts", "6", "--max-concurrency", "3",
            "--num-warmups", "1", "--ignore-eos", "--disable-tqdm", "--seed", "3", "--result-file", str(result)]
    assert run_bench(monkeypatch, args) == 0
    doc = json.loads(result.read_text())
    assert doc["kind"] == "serve" and doc["model"] == "tiny-llama"
    check_run(doc, num_prompts=6, input_len=24, output_len=12)
    assert 1 <= doc["metrics"]["peak_concurrency"] <= 3
    assert doc["warmup_failed"] == 0
    assert doc["workload"]["seed"] == 3 and doc["config"]["ignore_eos"] is True
    check_provenance(doc, ["kvserve", "bench", *args], live)


def test_bench_sweep_against_live_kvserve(live, tiny_llama, monkeypatch, tmp_path):
    result, plot = tmp_path / "sweep.json", tmp_path / "sweep.png"
    args = ["sweep", "--base-url", live.base_url, "--tokenizer", str(tiny_llama), "--dataset-name",
            "shared-prefix", "--num-groups", "2", "--prompts-per-group", "2", "--system-prompt-len", "32",
            "--question-len", "8", "--output-len", "6", "--concurrency", "1,4", "--ignore-eos",
            "--disable-tqdm", "--result-file", str(result), "--plot-file", str(plot)]
    assert run_bench(monkeypatch, args) == 0
    doc = json.loads(result.read_text())
    assert doc["kind"] == "sweep" and doc["plot_file"] == str(plot)
    assert [r["point"]["max_concurrency"] for r in doc["runs"]] == [1, 4]
    for run in doc["runs"]:
        check_run(run, num_prompts=4, input_len=40, output_len=6)
    assert doc["runs"][0]["metrics"]["peak_concurrency"] == 1
    check_provenance(doc, ["kvserve", "bench", *args], live)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 5000
