"""The ``bench compare`` workload spec: good specs load with their defaults, bad ones are refused
with one line per problem naming the field and what is allowed; length distributions draw exactly
what numpy draws with the same seed."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from kvserve.bench.compare.distributions import FromFile
from kvserve.bench.compare.spec import CompareSpec, load_spec, parse_spec
from kvserve.errors import InvalidRequestError

REPO = Path(__file__).resolve().parents[2]

GOOD = {
    "name": "good",
    "requests": {"datasets": [{"name": "a", "input_len": {"dist": "fixed", "value": 64},
                               "output_len": {"dist": "uniform", "low": 8, "high": 16}}]},
    "load": {"concurrency": [1, 4]},
    "slos": {"ttft": {"limit_ms": 500}},
    "engines": [{"name": "kv", "base_url": "http://127.0.0.1:8000/"}],
}


def with_change(path: str, value) -> dict:
    """GOOD with one field set (``value=...`` deletes it when it is the string ``DELETE``)."""
    spec = copy.deepcopy(GOOD)
    *parents, last = path.split(".")
    node = spec
    for key in parents:
        node = node[int(key)] if key.isdigit() else node[key]
    if value == "DELETE":
        del node[last]
    elif last.isdigit():
        node[int(last)] = value
    else:
        node[last] = value
    return spec


def refusal(data) -> list[str]:
    with pytest.raises(InvalidRequestError) as info:
        parse_spec(data, "spec.yaml")
    lines = info.value.message.splitlines()
    assert lines[0] == "invalid compare spec spec.yaml:" or len(lines) == 1
    return [line.strip() for line in lines[1:]] or lines


def test_good_spec_and_defaults():
    spec = parse_spec(GOOD)
    assert isinstance(spec, CompareSpec)
    assert spec.engines[0].base_url == "http://127.0.0.1:8000"  # trailing slash dropped
    assert (spec.load.axis, spec.load.levels, spec.load.requests_per_level, spec.load.warmup_requests) == (
        "concurrency", [1.0, 4.0], 100, 2)
    assert spec.slos.items()["ttft"].percentile == 99.0 and spec.load.arrival.shape == 1.0
    assert spec.requests.ignore_eos is True and spec.requests.temperature == 0.0
    assert spec.probes.cache_exhaustion.requests == 32 and spec.probes.restart.enabled is True
    assert spec.capacity is None and spec.engines[0].count_output_tokens == "usage"


def test_example_spec_in_the_repo_loads():
    spec = load_spec(REPO / "benchmarks" / "compare" / "qwen_shaped.yaml")
    assert [e.name for e in spec.engines] == ["kvserve-prefix-on", "kvserve-prefix-off", "llama.cpp", "vllm-cpu"]
    assert "--enable-prefix-caching" in spec.engines[0].start and "--no-enable-prefix-caching" in spec.engines[1].start
    assert spec.engines[2].only_if and spec.engines[2].count_output_tokens == "max_tokens"
    assert spec.engines[3].only_if and "VLLM_CPU_NUM_OF_RESERVED_CPU=0" in spec.engines[3].start
    assert spec.model.tokenizer == "/tmp/qwen-shaped" and spec.load.levels == [1.0, 4.0, 8.0, 16.0]


@pytest.mark.parametrize("path, value, expected", [
    ("name", "DELETE", "name: Field required"),
    ("engines", [], "engines: List should have at least 1 item after validation, not 0"),
    ("engines.0.base_url", "localhost:8000", "engines[0].base_url: 'localhost:8000' must be an http:// or https:// URL"),
    ("engines.0.name", "a/b", "engines[0].name: 'a/b' must be letters, digits, '.', '_' or '-' (it names files)"),
    ("engines.0.restart", "stop-start", "engines[0]: restart: stop-start needs a start command"),
    ("engines.0.typo", 1, "engines[0].typo: unknown field (check its spelling; docs/bench_compare.md lists the fields)"),
    ("load.concurrency", [4, 1], "load: load levels must be strictly increasing, got [4, 1]"),
    ("load.request_rates", [1.0], "load: give exactly one of concurrency (a list of levels) or request_rates (a list "
                                  "of requests/s); the knee is found along one axis"),
    ("load.concurrency", [0, 1], "load.concurrency[0]: Input should be greater than 0"),
    ("load.arrival", {"process": "gamma"}, "load.arrival: process: gamma needs burstiness (the gamma shape, > 0; 1 "
                                           "is Poisson)"),
    ("slos", {}, "slos: give at least one SLO (ttft, tpot, itl, e2el): goodput is defined by them"),
    ("slos.ttft", {"limit_ms": 500, "percentile": 100}, "slos.ttft.percentile: Input should be less than 100"),
    ("requests.datasets.0.input_len", {"dist": "uniform", "low": 9, "high": 3},
     "requests.datasets[0].input_len: high (3) must be >= low (9)"),
    ("requests.datasets.0.input_len", {"dist": "zipf"},
     "requests.datasets[0].input_len: Input tag 'zipf' found using 'dist' does not match any of the expected tags: "
     "'fixed', 'uniform', 'normal', 'lognormal', 'file'"),
    ("requests.datasets.0.tool_calls", {"share": 0.5},
     "requests.datasets[0]: tool_calls need api: chat (tools are a chat completions feature)"),
    ("requests.datasets.0.shared_prefix", {"share": 1.5, "prefix_len": 8},
     "requests.datasets[0].shared_prefix.share: Input should be less than or equal to 1"),
])
def test_bad_specs_name_the_field_and_the_rule(path, value, expected):
    assert refusal(with_change(path, value)) == [expected]


def test_every_problem_is_listed():
    data = with_change("load.concurrency", [2, 1])
    data["engines"].append({"name": "kv", "base_url": "ftp://x"})
    assert refusal(data) == ["load: load levels must be strictly increasing, got [2, 1]",
                             "engines[1].base_url: 'ftp://x' must be an http:// or https:// URL"]
    data["engines"][1]["base_url"] = "http://x"
    assert refusal(data)[1] == "engines: engine names must be unique, repeated: kv"


def test_top_level_and_yaml_errors(tmp_path):
    assert refusal(["a"]) == ["invalid compare spec spec.yaml: the top level must be a mapping of fields (name, "
                              "requests, load, slos, engines, ...), got list"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nload: [1, 2\n")
    with pytest.raises(InvalidRequestError, match=r"(?s)is not valid YAML: .*line 2, column 7"):
        load_spec(bad)
    with pytest.raises(InvalidRequestError, match="cannot read compare spec .*missing.yaml: No such file"):
        load_spec(tmp_path / "missing.yaml")


def test_length_file_is_read_from_the_spec_folder(tmp_path):
    (tmp_path / "lens.txt").write_text("10, 20\n30\n")
    data = with_change("requests.datasets.0.input_len", {"dist": "file", "path": "lens.txt"})
    spec_file = tmp_path / "spec.yaml"
    import yaml

    spec_file.write_text(yaml.safe_dump(data))
    dist = load_spec(spec_file).requests.datasets[0].input_len
    assert dist.values == (10, 20, 30) and dist.upper_bound() == 30.0
    picks = np.random.default_rng(5).integers(0, 3, size=6)
    assert dist.sample(np.random.default_rng(5), 6) == [(10, 20, 30)[i] for i in picks]
    (tmp_path / "bad.txt").write_text("10 x")
    data["requests"]["datasets"][0]["input_len"]["path"] = "bad.txt"
    assert refusal_in(data, tmp_path) == ["requests.datasets[0].input_len: length file "
                                          f"{tmp_path / 'bad.txt'} must hold integers only"]


def refusal_in(data, base) -> list[str]:
    with pytest.raises(InvalidRequestError) as info:
        parse_spec(data, "spec.yaml", base)
    return [line.strip() for line in info.value.message.splitlines()[1:]]


def test_distributions_draw_what_numpy_draws():
    from pydantic import TypeAdapter

    from kvserve.bench.compare.distributions import LengthDistribution

    make = TypeAdapter(LengthDistribution).validate_python
    assert make({"dist": "fixed", "value": 7}).sample(np.random.default_rng(0), 3) == [7, 7, 7]
    assert make({"dist": "uniform", "low": 5, "high": 9}).sample(np.random.default_rng(1), 5) == \
        np.random.default_rng(1).integers(5, 10, size=5).tolist()
    normal = make({"dist": "normal", "mean": 10, "std": 30, "min": 4, "max": 40}).sample(np.random.default_rng(2), 50)
    expected = np.clip(np.rint(np.random.default_rng(2).normal(10, 30, size=50)), 4, 40).astype(int).tolist()
    assert normal == expected and min(normal) == 4 and max(normal) == 40
    lognormal = make({"dist": "lognormal", "median": 100, "sigma": 0.5}).sample(np.random.default_rng(3), 4)
    assert lognormal == np.rint(100 * np.exp(0.5 * np.random.default_rng(3).standard_normal(4))).astype(int).tolist()
    assert make({"dist": "lognormal", "median": 100, "sigma": 0}).sample(np.random.default_rng(3), 2) == [100, 100]
    assert isinstance(make({"dist": "file", "path": "x", "values": [3]}), FromFile)
