"""Every ``kvserve bench`` mode prints the roofline fraction beside its throughput and records the
bound, the measured throughput and the fraction in its result, the probe's figures in the
provenance; where no bound can be known it says why instead of a number."""

from __future__ import annotations

import json
import math
import re
import sys

import pytest
from bench_sse_server import MODEL, PROMPT_TOKENS, ScriptedServer

from kvserve.bench.cli import main
from kvserve.bench.roofline import ServingFormat, model_cost, workload_bound
from kvserve.bench.roofline_report import RunEngine, server_engine
from kvserve.config import QuantizationConfig

PEAK_FIELDS = {"device", "threads", "bandwidth_gbs", "gemv_bf16_gbs", "sum_fp32_gbs", "matmul_tflops",
               "matmul_shape", "probe_s"}


@pytest.fixture(scope="module")
def server():
    with ScriptedServer() as s:
        yield s


def run_cli(monkeypatch, args: list[str]) -> int:
    argv = ["kvserve", "bench", *args]
    monkeypatch.setattr(sys, "argv", argv)
    return main(argv[1:])


def check_peaks(peaks: dict) -> None:
    assert set(peaks) == PEAK_FIELDS
    assert all(math.isfinite(v) and v > 0 for v in (peaks["bandwidth_gbs"], *peaks["matmul_tflops"].values()))


def test_throughput_reports_its_fraction_of_the_bound(tiny_llama, tmp_path, monkeypatch, capsys):
    result = tmp_path / "t.json"
    args = ["throughput", "--model", str(tiny_llama), "--input-len", "8", "--output-len", "4", "--num-prompts", "3",
            "--ignore-eos", "--engine-kwargs", '{"max_num_seqs": 2, "enable_prefix_caching": false}',
            "--result-file", str(result)]
    assert run_cli(monkeypatch, args) == 0
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("Roofline: ")]
    doc = json.loads(result.read_text())
    roofline, metrics = doc["roofline"], doc["metrics"]
    check_peaks(doc["provenance"]["machine_peaks"])
    assert roofline["cap"] == 2 and roofline["format"] == metrics["engine"]["dtype"]
    assert roofline["output_tokens"] == metrics["total_output_tokens"] == 12 and roofline["decode_steps"] == 6
    assert roofline["measured_output_throughput"] == pytest.approx(metrics["output_throughput"])
    assert roofline["fraction"] == pytest.approx(roofline["bound_s"] / metrics["elapsed_s"])
    assert roofline["bound_output_throughput"] == pytest.approx(12 / roofline["bound_s"])
    assert roofline["fraction"] > 0 and roofline["reason"] is None and roofline["assumed"] == []
    assert len(line) == 1 and f"= {roofline['fraction']:.2f} of the bound" in line[0]
    # the bound recorded is the one of the requests as served, in the engine's format and peaks
    peaks = doc["provenance"]["machine_peaks"]
    from kvserve.bench.machine_probe import MachinePeaks
    from kvserve.model.arch_config import ModelArchConfig

    fmt = ServingFormat(metrics["engine"]["dtype"])
    bound = workload_bound(model_cost(ModelArchConfig.from_file(tiny_llama / "config.json"), fmt),
                           MachinePeaks(**{**peaks, "matmul_shape": tuple(peaks["matmul_shape"])}), fmt.dtype,
                           [(8, 4)] * 3, 2)
    assert roofline["bound_s"] == pytest.approx(bound.bound_s, rel=1e-12)


def test_no_roofline_skips_the_probe(tiny_llama, tmp_path, monkeypatch, capsys):
    result = tmp_path / "t.json"
    args = ["throughput", "--model", str(tiny_llama), "--input-len", "8", "--output-len", "2", "--num-prompts", "2",
            "--ignore-eos", "--no-roofline", "--result-file", str(result)]
    assert run_cli(monkeypatch, args) == 0
    assert "Roofline: not computed: --no-roofline" in capsys.readouterr().out.splitlines()
    doc = json.loads(result.read_text())
    assert doc["roofline"]["fraction"] is None and doc["roofline"]["reason"] == "--no-roofline"
    assert doc["provenance"]["machine_peaks"] is None


def test_serve_against_a_local_server_with_a_local_model(server, tiny_llama, tokenizer_dir, tmp_path, monkeypatch,
                                                         capsys):
    """The scripted server reports no engine facts: the bound assumes them and says so."""
    result = tmp_path / "s.json"
    args = ["serve", "--base-url", server.base_url, "--model", str(tiny_llama), "--served-model-name", MODEL,
            "--tokenizer", tokenizer_dir, "--input-len", "8", "--output-len", "3", "--num-prompts", "4",
            "--max-concurrency", "2", "--disable-tqdm", "--result-file", str(result)]
    assert run_cli(monkeypatch, args) == 0
    doc = json.loads(result.read_text())
    roofline = doc["roofline"]
    check_peaks(doc["provenance"]["machine_peaks"])
    assert roofline["assumed"] == ["dtype", "kv_cache_dtype", "max_num_seqs", "quantization"]
    assert roofline["cap"] == 2 and roofline["input_tokens"] == 4 * PROMPT_TOKENS  # the server's usage counts
    assert roofline["output_tokens"] == doc["total_output_tokens"] == 12
    assert roofline["fraction"] == pytest.approx(roofline["bound_s"] / doc["duration"])
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("Roofline: ")]
    assert len(line) == 1 and "assumed dtype, kv_cache_dtype, max_num_seqs, quantization" in line[0]


def test_serve_without_a_local_config_says_why(server, tokenizer_dir, tmp_path, monkeypatch, capsys):
    result = tmp_path / "s.json"
    args = ["serve", "--base-url", server.base_url, "--tokenizer", tokenizer_dir, "--input-len", "8",
            "--output-len", "2", "--num-prompts", "2", "--disable-tqdm", "--result-file", str(result)]
    assert run_cli(monkeypatch, args) == 0
    doc = json.loads(result.read_text())
    assert doc["roofline"]["fraction"] is None and "config.json is not local" in doc["roofline"]["reason"]
    assert doc["provenance"]["machine_peaks"] is None
    assert any(x.startswith("Roofline: not computed: the model's config.json") for x in
               capsys.readouterr().out.splitlines())


def test_sweep_table_has_a_roofline_column(server, tiny_llama, tokenizer_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "200")  # the table in full width
    result = tmp_path / "sweep.json"
    args = ["sweep", "--base-url", server.base_url, "--model", str(tiny_llama), "--served-model-name", MODEL,
            "--tokenizer", tokenizer_dir, "--input-len", "8", "--output-len", "2", "--num-prompts", "2",
            "--concurrency", "1,2", "--disable-tqdm", "--result-file", str(result)]
    assert run_cli(monkeypatch, args) == 0
    doc = json.loads(result.read_text())
    assert [r["roofline"]["cap"] for r in doc["runs"]] == [1, 2]
    assert all(r["roofline"]["fraction"] > 0 for r in doc["runs"])
    check_peaks(doc["provenance"]["machine_peaks"])
    header = next(x for x in capsys.readouterr().out.splitlines() if "out tok/s" in x)
    columns = [c.strip() for c in re.split("[│┃]", header)]
    assert columns[columns.index("out tok/s") + 1] == "roofline"


def test_a_remote_server_has_no_bound(tiny_llama):
    reason = server_engine("http://10.11.12.13:8000", {"version": "x"}, str(tiny_llama))
    assert reason == ("the server at 10.11.12.13 is not on this machine (its bandwidth and matmul peak cannot be "
                      "measured from here)")


def test_a_kvserve_server_reports_its_engine(tiny_llama):
    facts = {"model": str(tiny_llama), "dtype": "bfloat16", "quantization": "int4-g64+lm_head",
             "kv_cache_dtype": "int8", "max_num_seqs": 7, "device": "cpu"}
    engine = server_engine("http://127.0.0.1:8000", {"version": "1", "engine": facts}, None)
    assert engine == RunEngine(str(tiny_llama), ServingFormat("bfloat16", QuantizationConfig("int4", 64, True), "int8"),
                               7, "cpu", ())
