"""Every flag of ``vllm bench serve`` is either implemented or refused by name, and the implemented
ones do what vLLM's do (checked against the scripted SSE server: what was sent, what was written).

The flag list is written here from vLLM's source (``vllm/benchmarks/serve.py`` ``add_cli_args`` and
``vllm/benchmarks/datasets`` ``add_dataset_parser``, ``add_random_dataset_base_args``,
``add_random_multimodal_dataset_args``), not from kvserve's parser.
"""

from __future__ import annotations

import json
import sys

import pytest
from bench_sse_server import ScriptedServer

from kvserve.bench.cli import build_parser, main, prepare_online_args
from kvserve.bench.refused import REFUSED_FLAGS
from kvserve.errors import InvalidRequestError

# vLLM flag -> a value to pass (None: a switch)
IMPLEMENTED = {
    "--trust-remote-code": None, "--seed": "3", "--num-prompts": "5", "--dataset-name": "random",
    "--dataset-path": "x.json", "--no-oversample": None, "--skip-chat-template": None, "--disable-shuffle": None,
    "--custom-output-len": "7", "--spec-bench-output-len": "7", "--spec-bench-category": "math",
    "--sharegpt-output-len": "7", "--random-input-len": "9", "--random-output-len": "4",
    "--random-range-ratio": "0.1", "--random-prefix-len": "2", "--prefix-repetition-prefix-len": "4",
    "--prefix-repetition-suffix-len": "4", "--prefix-repetition-num-prefixes": "2",
    "--prefix-repetition-output-len": "3", "--label": "x", "--backend": "openai", "--base-url": "http://h:1",
    "--host": "h", "--port": "1", "--endpoint": "/v1/completions", "--header": "a=b", "--max-concurrency": "2",
    "--model": "m", "--input-len": "9", "--output-len": "4", "--tokenizer": "t", "--tokenizer-mode": "hf",
    "--logprobs": "1", "--request-rate": "3", "--burstiness": "2", "--disable-tqdm": None, "--num-warmups": "1",
    "--save-result": None, "--save-detailed": None, "--append-result": None, "--metadata": "k=v",
    "--result-dir": "d", "--result-filename": "f.json", "--ignore-eos": None, "--percentile-metrics": "ttft",
    "--metric-percentiles": "50", "--goodput": "ttft:10", "--request-id-prefix": "p-", "--top-p": "0.9",
    "--top-k": "5", "--min-p": "0.1", "--temperature": "0", "--frequency-penalty": "0.1",
    "--presence-penalty": "0.1", "--repetition-penalty": "1.1", "--served-model-name": "s",
    "--lora-modules": "a", "--lora-assignment": "round-robin", "--ramp-up-strategy": "linear",
    "--ramp-up-start-rps": "1", "--ramp-up-end-rps": "2", "--ready-check-timeout-sec": "5",
    "--chat-template-kwargs": '{"a": 1}', "--extra-body": '{"a": 1}', "--insecure": None,
}
REFUSED = {
    "--no-stream": None, "--enable-multimodal-chat": None, "--custom-ensure-client-side-data": None,
    "--sonnet-input-len": "1", "--sonnet-output-len": "1", "--sonnet-prefix-len": "1",
    "--timed-trace-chunk-hash-size": "1", "--timed-trace-sec-multiplier": "1", "--timed-trace-label-timestamp": "t",
    "--timed-trace-label-input-length": "i", "--timed-trace-label-output-length": "o",
    "--timed-trace-label-hash-ids": "h", "--blazedit-min-distance": "0", "--blazedit-max-distance": "1",
    "--asr-max-audio-len-sec": "1", "--asr-min-audio-len-sec": "0", "--random-batch-size": "2",
    "--no-reranker": None, "--random-mm-base-items-per-request": "1", "--random-mm-num-mm-items-range-ratio": "0",
    "--random-mm-limit-mm-per-prompt": "{}", "--random-mm-bucket-config": "{}", "--hf-subset": "s",
    "--hf-split": "s", "--hf-name": "n", "--hf-output-len": "1", "--bfcl-categories": "c",
    "--speed-bench-dataset-subset": "qualitative", "--speed-bench-output-len": "1", "--speed-bench-category": "c",
    "--use-beam-search": None, "--probe-request-rate": "1", "--profile": None, "--self-timed": None,
    "--no-self-timed": None, "--skip-tokenizer-init": None, "--plot-timeline": None,
    "--timeline-itl-thresholds": "25,50", "--plot-dataset-stats": None,
}
VLLM_DATASETS = {"sharegpt": True, "burstgpt": False, "sonnet": False, "random": True, "random-mm": False,
                 "random-rerank": False, "hf": False, "custom": True, "custom_audio": False, "custom_image": False,
                 "custom_mm": False, "prefix_repetition": True, "spec_bench": True, "speed_bench": False,
                 "timed_trace": False}
VLLM_BACKENDS = {"vllm": True, "openai": True, "openai-chat": True, "openai-audio": False,
                 "openai-embeddings": False, "openai-embeddings-chat": False, "openai-embeddings-clip": False,
                 "openai-embeddings-vlm2vec": False, "infinity-embeddings": False, "infinity-embeddings-clip": False,
                 "vllm-pooling": False, "vllm-rerank": False}


def parse(*args: str):
    return build_parser().parse_args(["bench", "serve", *args])


def test_refusal_table_is_vllms_unimplemented_flags():
    assert set(REFUSED_FLAGS) == set(REFUSED)
    assert not set(IMPLEMENTED) & set(REFUSED)


@pytest.mark.parametrize("flag", sorted(IMPLEMENTED))
def test_implemented_flag_is_accepted(flag):
    value = IMPLEMENTED[flag]
    args = parse(flag, *([] if value is None else [value]))
    if flag == "--dataset-path":  # vLLM refuses a path with a generated dataset: see the next test
        args = parse(flag, value, "--dataset-name", "sharegpt")
    if flag.startswith("--ramp-up"):
        return  # needs its two companions: see test_ramp_up_records_rate_changes
    prepare_online_args(args)


def test_generated_datasets_take_no_path():
    with pytest.raises(InvalidRequestError, match="--dataset-name random generates its prompts"):
        prepare_online_args(parse("--dataset-path", "x.json"))


@pytest.mark.parametrize("flag", sorted(REFUSED))
def test_unimplemented_flag_is_refused_by_name(flag):
    value = REFUSED[flag]
    args = parse(flag, *([] if value is None else [value]))
    with pytest.raises(InvalidRequestError) as err:
        prepare_online_args(args)
    assert err.value.message.startswith(f"{flag} is not supported by kvserve bench: ")


@pytest.mark.parametrize("name, implemented", sorted(VLLM_DATASETS.items()))
def test_vllm_datasets(name, implemented):
    args = parse("--dataset-name", name)
    if implemented:
        prepare_online_args(args)
    else:
        with pytest.raises(InvalidRequestError, match=f"--dataset-name {name} is not supported: "):
            prepare_online_args(args)


@pytest.mark.parametrize("name, implemented", sorted(VLLM_BACKENDS.items()))
def test_vllm_backends(name, implemented):
    endpoint = "/v1/chat/completions" if name == "openai-chat" else "/v1/completions"
    args = parse("--backend", name, "--endpoint", endpoint)
    if implemented:
        prepare_online_args(args)
    else:
        with pytest.raises(InvalidRequestError, match=f"--backend {name} is not supported: "):
            prepare_online_args(args)


@pytest.fixture(scope="module")
def server():
    with ScriptedServer() as s:
        yield s


def run(monkeypatch, server, tokenizer_dir, *args: str, key: str | None = "sk-1") -> int:
    argv = ["kvserve", "bench", "serve", "--base-url", server.base_url, "--tokenizer", tokenizer_dir,
            "--disable-tqdm", *args]
    if key:
        monkeypatch.setenv("OPENAI_API_KEY", key)
    monkeypatch.setattr(sys, "argv", argv)
    return main(argv[1:])


def test_request_fields_headers_and_adapters(monkeypatch, server, tokenizer_dir, tmp_path):
    n = len(server.received)
    rc = run(monkeypatch, server, tokenizer_dir, "--model", "base", "--served-model-name", "served",
             "--num-prompts", "4", "--random-input-len", "6", "--random-output-len", "3", "--logprobs", "2",
             "--lora-modules", "ad1", "ad2", "--lora-assignment", "round-robin", "--request-id-prefix", "rq-",
             "--header", "x-a=1", "Authorization=Bearer sk-header", "--frequency-penalty", "0.5",
             "--extra-body", '{"frequency_penalty": 0.25, "seed": 4}', "--max-concurrency", "1")
    assert rc == 0
    bodies, headers = server.received[n:], server.headers[n:]
    assert [b["model"] for b in bodies] == ["ad1", "ad2", "ad1", "ad2"]  # round-robin adapters
    assert [h["x-request-id"] for h in headers] == ["rq-0", "rq-1", "rq-2", "rq-3"]
    assert {h["authorization"] for h in headers} == {"Bearer sk-header"}  # --header wins over the env key
    assert {h["x-a"] for h in headers} == {"1"}
    for body in bodies:  # --extra-body wins over the sampling flags; random ignores EOS
        assert (body["logprobs"], body["frequency_penalty"], body["seed"], body["ignore_eos"]) == (2, 0.25, 4, True)
        assert body["max_tokens"] == 3 and "temperature" not in body


def test_default_model_is_the_servers_and_the_env_key_is_sent(monkeypatch, server, tokenizer_dir, tmp_path):
    n = len(server.received)
    out = tmp_path / "r.jsonl"
    for seed in ("1", "2"):  # --append-result: one JSON document per line
        assert run(monkeypatch, server, tokenizer_dir, "--num-prompts", "2", "--random-input-len", "5",
                   "--random-output-len", "2", "--seed", seed, "--append-result", "--result-filename",
                   str(out)) == 0
    assert {b["model"] for b in server.received[n:]} == {"scripted-model"}
    assert {h["authorization"] for h in server.headers[n:]} == {"Bearer sk-1"}
    lines = out.read_text().splitlines()
    assert len(lines) == 2 and [json.loads(line)["completed"] for line in lines] == [2, 2]
    assert [json.loads(line)["model_id"] for line in lines] == ["scripted-model"] * 2


def test_ramp_up_records_rate_changes(monkeypatch, server, tokenizer_dir, tmp_path):
    out = tmp_path / "ramp.json"
    assert run(monkeypatch, server, tokenizer_dir, "--num-prompts", "5", "--random-input-len", "4",
               "--random-output-len", "2", "--ramp-up-strategy", "linear", "--ramp-up-start-rps", "20",
               "--ramp-up-end-rps", "24", "--save-result", "--result-filename", str(out)) == 0
    result = json.loads(out.read_text())
    assert (result["ramp_up_strategy"], result["ramp_up_start_rps"], result["ramp_up_end_rps"]) == ("linear", 20, 24)
    assert [e["rps"] for e in result["rps_change_events"]] == [20, 21, 22, 23, 24]
    assert run(monkeypatch, server, tokenizer_dir, "--num-prompts", "2", "--ramp-up-strategy", "linear",
               "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "2", "--request-rate", "3") == 2


def test_bad_values_are_errors_naming_the_flag(monkeypatch, server, tokenizer_dir, capsys):
    for args, words in ((["--percentile-metrics", "ttft,latency"], "--percentile-metrics latency"),
                        (["--header", "novalue"], "--header 'novalue': use KEY=VALUE"),
                        (["--backend", "tgi"], "unknown --backend 'tgi'"),
                        (["--backend", "openai-chat"], "--backend openai-chat posts to an endpoint ending in "
                                                       "chat/completions"),
                        (["--tokenizer-mode", "mistral"], "--tokenizer-mode mistral is not supported")):
        assert run(monkeypatch, server, tokenizer_dir, "--num-prompts", "1", *args) == 2
        assert words in capsys.readouterr().err, words
