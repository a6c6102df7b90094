"""``vllm bench serve`` command lines run unchanged (first word aside) against a live kvserve with an
API key, and write vLLM's flat result keys.

The command lines are those of vLLM's documentation (``docs/benchmarking/cli.md``: the online
benchmark with ``--backend vllm``, the custom-dataset one with ``--save-result --save-detailed
--result-dir --temperature --top-p``; the chat one with ``--backend openai-chat --endpoint
/v1/chat/completions``) with the model, dataset sizes and the server's address filled in. The
server runs kvserve's built-in model with ``--api-key``; the benchmark gets the key the way vLLM's
does, from ``OPENAI_API_KEY``. Expected values are exact where the workload fixes them
(``--ignore-eos``: every request generates its output length).
"""

from __future__ import annotations

import glob
import json
import math
import shlex
import sys
from pathlib import Path

import pytest

from kvserve.bench.cli import main
from kvserve.builtin import BUILTIN_MODEL_NAME, builtin_model_path
from kvserve.testing.live_server import start_live_server

REPO = Path(__file__).resolve().parents[2]
KEY = "sk-kvserve-bench-test"
# vLLM's flat result keys (vllm/benchmarks/serve.py: main_async and benchmark)
ALWAYS = {"date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts", "request_rate",
          "burstiness", "max_concurrency", "duration", "completed", "failed", "total_input_tokens",
          "total_output_tokens", "request_throughput", "request_goodput", "output_throughput",
          "total_token_throughput", "latencies", "queue_times", "max_output_tokens_per_s",
          "max_concurrent_requests", "rtfx"}
DETAILED = {"input_lens", "output_lens", "ttfts", "itls", "start_times", "generated_texts", "errors"}


@pytest.fixture(scope="module")
def live():
    server = start_live_server(str(builtin_model_path()), served_model_name=BUILTIN_MODEL_NAME, api_key=KEY,
                               max_model_len=256, max_num_seqs=4)
    yield server
    server.stop()


def bench(monkeypatch, command: str, key: str | None = KEY) -> int:
    argv = shlex.split(command)
    assert argv[:3] == ["vllm", "bench", "serve"]
    argv[0] = "kvserve"
    if key is None:
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    else:
        monkeypatch.setenv("OPENAI_API_KEY", key)
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.chdir(REPO)
    return main(argv[1:])


def test_vllm_docs_online_benchmark(live, monkeypatch, tmp_path, capsys):
    port = live.base_url.rsplit(":", 1)[1]
    command = f"""vllm bench serve \
        --backend vllm \
        --model {BUILTIN_MODEL_NAME} \
        --endpoint /v1/completions \
        --dataset-name random --random-input-len 24 --random-output-len 8 \
        --num-prompts 6 --max-concurrency 3 --request-rate 50 --burstiness 2 --seed 7 \
        --ignore-eos --temperature=0.3 --top-p=0.75 --top-k 20 --min-p 0.01 \
        --percentile-metrics ttft,tpot,itl,e2el,client_queue_time --metric-percentiles 50,90,99.9 \
        --goodput ttft:600000 tpot:600000 --metadata run=ci tp=1 --label kvs \
        --ready-check-timeout-sec 30 --host 127.0.0.1 --port {port} \
        --extra-body '{{"skip_special_tokens": false}}' \
        --save-result --save-detailed --result-dir {tmp_path} --result-filename vllm_style.json"""
    # skip_special_tokens false: a sampled special token (the built-in model draws </s>, <s> or a
    # chat marker for ~2% of tokens here) would otherwise have no text, and so no chunk of its own.
    assert bench(monkeypatch, command) == 0
    printed = capsys.readouterr().out
    result = json.loads((tmp_path / "vllm_style.json").read_text())
    assert ALWAYS | DETAILED <= set(result)
    # the workload: 6 prompts of 24 tokens, 8 generated each
    assert (result["completed"], result["failed"], result["num_prompts"]) == (6, 0, 6)
    assert result["total_output_tokens"] == 6 * 8 and result["output_lens"] == [8] * 6
    assert result["input_lens"] == [24] * 6 and result["total_input_tokens"] == 6 * 24
    assert result["errors"] == [""] * 6 and len(result["generated_texts"]) == 6
    assert all(len(itl) == 7 for itl in result["itls"])  # one streamed chunk per token
    assert all(0 < ttft <= lat for ttft, lat in zip(result["ttfts"], result["latencies"]))
    # throughputs over the duration
    duration = result["duration"]
    assert result["request_throughput"] == pytest.approx(6 / duration)
    assert result["output_throughput"] == pytest.approx(48 / duration)
    assert result["total_token_throughput"] == pytest.approx((48 + 144) / duration)
    assert result["request_goodput"] == pytest.approx(6 / duration)  # generous SLOs: every request
    assert 1 <= result["max_concurrent_requests"] <= 3 and result["max_output_tokens_per_s"] >= 1
    # the run description
    assert (result["backend"], result["endpoint_type"], result["label"]) == ("vllm", "vllm", "kvs")
    assert (result["model_id"], result["tokenizer_id"]) == (BUILTIN_MODEL_NAME, BUILTIN_MODEL_NAME)
    assert (result["request_rate"], result["burstiness"], result["max_concurrency"]) == (50.0, 2.0, 3)
    assert (result["run"], result["tp"]) == ("ci", "1")
    # statistics of the selected metrics, in ms, from the per-request lists
    ttfts_ms = sorted(t * 1000 for t in result["ttfts"])
    assert result["mean_ttft_ms"] == pytest.approx(sum(ttfts_ms) / 6)
    assert result["median_ttft_ms"] == pytest.approx((ttfts_ms[2] + ttfts_ms[3]) / 2)
    for metric in ("ttft", "tpot", "itl", "e2el", "client_queue_time"):
        for stat in ("mean", "median", "std", "p50", "p90", "p99.9"):
            assert math.isfinite(result[f"{stat}_{metric}_ms"]), (stat, metric)
        assert result[f"p50_{metric}_ms"] <= result[f"p90_{metric}_ms"] <= result[f"p99.9_{metric}_ms"]
    assert "mean_e2el_including_client_queue_ms" not in result  # not selected
    tpot = [(lat - ttft) / 7 * 1000 for lat, ttft in zip(result["latencies"], result["ttfts"])]
    assert result["mean_tpot_ms"] == pytest.approx(sum(tpot) / 6, rel=1e-6)
    # kvserve's richer data beside them
    assert result["kind"] == "serve" and result["metrics"]["completed"] == 6
    assert result["config"]["headers"] == {"Authorization": "<redacted>"}
    assert result["config"]["extra_body"] == {"skip_special_tokens": False, "temperature": 0.3, "top_p": 0.75,
                                              "top_k": 20, "min_p": 0.01}
    # vLLM's printed summary
    assert "============ Serving Benchmark Result ============" in printed
    assert "Successful requests:                     6" in printed
    assert "Request rate configured (RPS):           50.00" in printed
    assert "P99.9 TTFT (ms):" in printed and "-------------Client-side Queueing--------------" in printed


def test_vllm_chat_command_line_default_file_name(live, monkeypatch, tmp_path):
    command = f"""vllm bench serve --backend openai-chat --model {BUILTIN_MODEL_NAME} \
        --endpoint /v1/chat/completions --dataset-name random --num-prompts 4 \
        --random-input-len 16 --random-output-len 4 --base-url {live.base_url} --header x-bench=on \
        --save-result --result-dir {tmp_path}"""
    assert bench(monkeypatch, command) == 0
    (path,) = glob.glob(str(tmp_path / f"openai-chat-infqps-{BUILTIN_MODEL_NAME}-*-*.json"))
    result = json.loads(Path(path).read_text())
    assert ALWAYS <= set(result) and not DETAILED & set(result)  # lists only with --save-detailed
    assert (result["completed"], result["total_output_tokens"]) == (4, 16)  # random: EOS ignored, as vLLM
    assert result["request_goodput"] is None and result["max_concurrency"] is None
    assert result["request_rate"] == "inf" and result["num_prompts"] == 4
    assert {"mean_ttft_ms", "p99_ttft_ms", "p99_tpot_ms", "p99_itl_ms"} <= set(result)  # vLLM's defaults
    assert "p99_e2el_ms" not in result
    command = result["provenance"]["command"]  # header values may hold keys: redacted, as vLLM
    assert command[command.index("--header") + 1] == "x-bench=<redacted>"


def test_without_the_key_every_request_is_refused(live, monkeypatch, tmp_path, capsys):
    command = f"""vllm bench serve --model {BUILTIN_MODEL_NAME} --base-url {live.base_url} \
        --dataset-name random --num-prompts 2 --random-input-len 8 --random-output-len 2 --disable-tqdm"""
    assert bench(monkeypatch, command, key=None) == 1
    out = capsys.readouterr().out
    assert "Failed requests:                         2" in out and "HTTP 401" in out
