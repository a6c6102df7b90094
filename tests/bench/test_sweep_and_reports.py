"""Sweeps (one JSON with every run, a PNG), the result writer's provenance guard, and the
offline throughput command with a stand-in engine."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import types

import pytest
from bench_sse_server import ScriptedServer

from kvserve.bench.cli import main
from kvserve.bench.provenance import collect_provenance
from kvserve.bench.report import write_result
from kvserve.bench.sweep import SweepPoint, sweep_points
from kvserve.errors import InvalidRequestError
from kvserve.outputs import CompletionOutput, RequestOutput


def test_sweep_writes_runs_and_plot(tokenizer_dir, tmp_path, monkeypatch):
    result = tmp_path / "sweep.json"
    with ScriptedServer() as server:
        argv = ["bench", "sweep", "--base-url", server.base_url, "--tokenizer", tokenizer_dir,
                "--concurrency", "1,3", "--request-rates", "inf", "--input-len", "6", "--output-len", "3",
                "--num-prompts", "6", "--disable-tqdm", "--result-file", str(result)]
        monkeypatch.setattr(sys, "argv", ["kvserve", *argv])
        assert main(argv) == 0
        assert len(server.received) == 12
        first, second = ({b["prompt"] for b in server.received[i:i + 6]} for i in (0, 6))
        assert len(first) == len(second) == 6 and not first & second  # fresh prompts per point
    doc = json.loads(result.read_text())
    assert doc["kind"] == "sweep" and doc["provenance"]["server"]["model"] == "scripted-model"
    assert [r["point"]["max_concurrency"] for r in doc["runs"]] == [1, 3]
    assert doc["runs"][0]["metrics"]["peak_concurrency"] == 1
    assert doc["runs"][1]["metrics"]["peak_concurrency"] <= 3
    for run in doc["runs"]:
        assert run["metrics"]["completed"] == 6 and run["metrics"]["total_output_tokens"] == 18
        assert {"50.0", "99.0"} <= set(run["metrics"]["tpot_ms"]["percentiles"])
    png = tmp_path / "sweep.png"
    assert doc["plot_file"] == str(png) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_without_matplotlib_keeps_its_results(tokenizer_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now raises ImportError
    result = tmp_path / "sweep.json"
    with ScriptedServer() as server:
        argv = ["bench", "sweep", "--base-url", server.base_url, "--tokenizer", tokenizer_dir, "--concurrency", "2",
                "--input-len", "4", "--output-len", "2", "--num-prompts", "2", "--disable-tqdm",
                "--result-file", str(result)]
        monkeypatch.setattr(sys, "argv", ["kvserve", *argv])
        assert main(argv) == 0
    out = capsys.readouterr().out
    assert "plot skipped: matplotlib is not installed (pip install matplotlib)" in out
    assert json.loads(result.read_text())["runs"][0]["metrics"]["completed"] == 2
    assert not (tmp_path / "sweep.png").exists()


def test_sweep_points():
    assert sweep_points([1, 8], []) == [SweepPoint(1, math.inf), SweepPoint(8, math.inf)]
    assert sweep_points([], [2.0, 4.0]) == [SweepPoint(None, 2.0), SweepPoint(None, 4.0)]
    assert [p.label for p in sweep_points([4], [2.0])] == ["c=4 rate=2"]
    for bad in (([0], []), ([], [0.0]), ([], [])):
        with pytest.raises(InvalidRequestError):
            sweep_points(*bad)


def test_write_result_requires_provenance(tmp_path):
    with pytest.raises(TypeError, match="Provenance"):
        write_result(tmp_path / "x.json", "throughput", {}, {"command": ["x"]})  # type: ignore[arg-type]
    offline = collect_provenance(None)
    with pytest.raises(ValueError, match="server"):
        write_result(tmp_path / "x.json", "serve", {}, offline)
    with pytest.raises(ValueError, match="command"):
        write_result(tmp_path / "x.json", "throughput", {}, dataclasses.replace(offline, command=[]))
    path = write_result(tmp_path / "x.json", "throughput", {"metrics": {"rate": math.inf}}, offline)
    assert json.loads(path.read_text())["metrics"] == {"rate": "inf"}


def test_git_outside_a_repository_is_explained(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    prov = collect_provenance(None)
    assert prov.git_commit is None and prov.git_dirty is None and "not a git repository" in prov.git_error
    write_result(tmp_path / "ok.json", "throughput", {}, prov)  # the reason is recorded: allowed


class FakeLLM:
    """Stands in for kvserve.engine.llm.LLM: returns exactly max_tokens tokens per prompt."""

    calls: list = []

    def __init__(self, model: str, **engine_kwargs):
        FakeLLM.calls.append((model, engine_kwargs))

    def generate(self, prompts, sampling_params):
        return [RequestOutput(str(i), None, list(p), None,
                              [CompletionOutput(0, "", list(range(sp.max_tokens)), finish_reason="length")], True)
                for i, (p, sp) in enumerate(zip(prompts, sampling_params))]


def test_throughput_command_with_stand_in_engine(tokenizer_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "kvserve.engine.llm", types.SimpleNamespace(LLM=FakeLLM))
    result = tmp_path / "t.json"
    argv = ["bench", "throughput", "--model", tokenizer_dir, "--input-len", "10", "--output-len", "4",
            "--random-range-ratio", "0.5", "--num-prompts", "5", "--engine-kwargs", '{"max_num_seqs": 2}',
            "--result-file", str(result)]
    monkeypatch.setattr(sys, "argv", ["kvserve", *argv])
    assert main(argv) == 0
    assert FakeLLM.calls[-1] == (tokenizer_dir, {"max_num_seqs": 2})
    doc = json.loads(result.read_text())
    m = doc["metrics"]
    assert m["num_requests"] == 5 and m["total_output_tokens"] == m["expected_output_tokens"]
    assert 25 <= m["total_input_tokens"] <= 75 and m["elapsed_s"] > 0
    assert m["output_throughput"] == pytest.approx(m["total_output_tokens"] / m["elapsed_s"])
    assert doc["provenance"]["server"] is None and doc["provenance"]["command"] == ["kvserve", *argv]


def test_throughput_defaults_to_the_builtin_model_and_prints_a_summary(tmp_path, monkeypatch, capsys):
    from kvserve.builtin import builtin_model_path

    monkeypatch.setitem(sys.modules, "kvserve.engine.llm", types.SimpleNamespace(LLM=FakeLLM))
    argv = ["bench", "throughput", "--input-len", "10", "--output-len", "4", "--num-prompts", "3"]
    monkeypatch.setattr(sys, "argv", ["kvserve", *argv])
    assert main(argv) == 0
    assert FakeLLM.calls[-1] == (str(builtin_model_path()), {})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Throughput: ") and lines[0].endswith(" output tokens/s")
    assert lines[1] == "Total num prompt tokens:  30"
    assert lines[2] == "Total num output tokens:  12 (asked for 12)"
    assert not any("ThroughputResult(" in line for line in lines)


@pytest.mark.slow
def test_throughput_with_the_real_engine(tiny_llama):
    """``run_throughput`` through ``kvserve.engine.llm.LLM`` on a tiny random-weight Llama
    (prefix caching off: see the bench report on the engine's block-hash assertion)."""
    import numpy as np

    from kvserve.bench.datasets import RandomDataset
    from kvserve.bench.prompts import load_tokenizer
    from kvserve.bench.throughput import run_throughput

    samples = RandomDataset(12, 6, range_ratio=0.5).sample(load_tokenizer(str(tiny_llama)), 6,
                                                           np.random.default_rng(0))
    result = run_throughput(str(tiny_llama), samples, {"max_num_seqs": 4, "enable_prefix_caching": False},
                            ignore_eos=True)
    assert result.num_requests == 6
    assert result.total_input_tokens == sum(s.prompt_len for s in samples)
    assert result.total_output_tokens == result.expected_output_tokens == sum(s.expected_output_len for s in samples)


def test_throughput_reports_the_acceptance_of_a_speculating_engine(tiny_llama):
    """With ``--engine-kwargs '{"speculative_config": ...}'`` the summary adds the acceptance (the
    engine's spec_decode counters over the run)."""
    import numpy as np

    from kvserve.bench.copy_dataset import CopyEditDataset
    from kvserve.bench.prompts import load_tokenizer
    from kvserve.bench.throughput import format_throughput, run_throughput

    samples = CopyEditDataset(passage_len=24, output_len=12).sample(load_tokenizer(str(tiny_llama)), 3,
                                                                   np.random.default_rng(0))
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "min_acceptance_rate": 0}
    result = run_throughput(str(tiny_llama), samples, {"speculative_config": spec}, ignore_eos=True)
    figures = result.spec_decoding
    assert figures["num_drafts"] > 0 and figures["acceptance_rate"] == figures["num_accepted_tokens"] / figures[
        "num_draft_tokens"]
    assert result.total_output_tokens == 36
    assert format_throughput(result).splitlines()[-1].startswith("Spec decode acceptance: ")
    plain = run_throughput(str(tiny_llama), samples, {}, ignore_eos=True)
    assert plain.spec_decoding is None and "Spec decode" not in format_throughput(plain)
