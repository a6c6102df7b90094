"""Sampling defaults from generation_config.json, resolved by vLLM's rule
(``ModelConfig.get_diff_sampling_param``: the file's temperature, top_p, top_k, min_p,
repetition_penalty and max_new_tokens -> max_tokens; ``vllm`` = none; the override laid over)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from kvserve.generation_config import (GenerationConfigError, SamplingDefaults, default_sampling_values,
                                       parse_override)

# Qwen2.5-0.5B-Instruct's generation_config.json as published on the Hugging Face Hub.
QWEN25_INSTRUCT = {
    "bos_token_id": 151643, "pad_token_id": 151643, "do_sample": True, "eos_token_id": [151645, 151643],
    "repetition_penalty": 1.1, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "transformers_version": "4.37.0",
}
# Llama-3.1-8B-Instruct's.
LLAMA31_INSTRUCT = {"bos_token_id": 128000, "do_sample": True, "eos_token_id": [128001, 128008, 128009],
                    "temperature": 0.6, "top_p": 0.9, "transformers_version": "4.42.3"}


def folder(tmp_path, name: str, config: dict | None):
    path = tmp_path / name
    path.mkdir()
    if config is not None:
        (path / "generation_config.json").write_text(json.dumps(config))
    return path


def test_auto_takes_the_models_sampling_values(tmp_path):
    qwen = default_sampling_values(folder(tmp_path, "qwen", QWEN25_INSTRUCT))
    assert qwen.as_dict() == {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.1}
    assert qwen.source.endswith("qwen/generation_config.json")
    llama = default_sampling_values(folder(tmp_path, "llama", LLAMA31_INSTRUCT), "auto")
    assert llama.as_dict() == {"temperature": 0.6, "top_p": 0.9}
    assert llama.top_k is None and llama.max_tokens is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        llama.temperature = 1.0  # type: ignore[misc]


def test_vllm_mode_no_file_and_special_tokens_only_give_nothing(tmp_path):
    qwen = folder(tmp_path, "qwen", QWEN25_INSTRUCT)
    assert default_sampling_values(qwen, "vllm") == SamplingDefaults(source="vllm")
    assert default_sampling_values(folder(tmp_path, "none", None)).as_dict() == {}
    tokens_only = folder(tmp_path, "eos", {"bos_token_id": 1, "eos_token_id": 2, "do_sample": True})
    assert default_sampling_values(tokens_only).as_dict() == {}


def test_override_is_laid_over_the_file_and_over_vllm(tmp_path):
    qwen = folder(tmp_path, "qwen", QWEN25_INSTRUCT)
    override = parse_override('{"temperature": 0.2, "max_new_tokens": 64}')
    assert default_sampling_values(qwen, "auto", override).as_dict() == {
        "temperature": 0.2, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.1, "max_tokens": 64}
    only = default_sampling_values(qwen, "vllm", {"min_p": 0.05})
    assert only.as_dict() == {"min_p": 0.05} and only.source == "vllm + --override-generation-config"


def test_generation_config_as_a_folder(tmp_path):
    model = folder(tmp_path, "model", QWEN25_INSTRUCT)
    other = folder(tmp_path, "other", LLAMA31_INSTRUCT)
    assert default_sampling_values(model, str(other)).as_dict() == {"temperature": 0.6, "top_p": 0.9}
    with pytest.raises(GenerationConfigError, match="no generation_config.json in that folder"):
        default_sampling_values(model, str(folder(tmp_path, "empty", None)))


def test_value_and_cap():
    defaults = SamplingDefaults(temperature=0.7, top_k=20, max_tokens=64)
    assert defaults.value("temperature", None) == 0.7 and defaults.value("temperature", 0.0) == 0.0
    assert defaults.value("top_p", None) is None and defaults.value("top_k", 5) == 5
    assert defaults.cap_max_tokens(None) == 64 and defaults.cap_max_tokens(16) == 16
    assert defaults.cap_max_tokens(100) == 64 and SamplingDefaults().cap_max_tokens(None) is None
    with pytest.raises(KeyError):
        defaults.value("max_tokens", None)


@pytest.mark.parametrize("text, message", [
    ("{temperature: 1}", "not valid JSON"),
    ("[1]", "must be a JSON object, got list"),
    ('{"temperature": 0.5, "eos_token_id": 2, "foo": 1}', "unknown key\\(s\\) eos_token_id, foo; allowed: temperature"),
])
def test_bad_override_is_refused(text, message):
    with pytest.raises(GenerationConfigError, match=message):
        parse_override(text)


@pytest.mark.parametrize("config, message", [
    ({"temperature": -0.5}, "temperature in .*generation_config.json: temperature must be >= 0, got -0.5"),
    ({"top_p": 1.5}, "top_p in .*: top_p must be in \\(0, 1\\], got 1.5"),
    ({"top_k": 2.5}, "top_k in .* must be an integer, got 2.5"),
    ({"max_new_tokens": 0}, "max_new_tokens in .* must be an integer >= 1, got 0"),
    ({"temperature": "hot"}, "temperature in .* must be a number, got 'hot'"),
])
def test_out_of_range_file_values_name_the_key_and_file(tmp_path, config, message):
    with pytest.raises(GenerationConfigError, match=message):
        default_sampling_values(folder(tmp_path, "bad", config))


@pytest.mark.slow
def test_served_requests_get_the_models_defaults(tiny_llama, tmp_path):
    """Through a live server: generation_config.json's max_new_tokens caps a request that omits
    max_tokens (vLLM: min(16, context left, 3) = 3 for a completion); ``vllm`` mode keeps 16."""
    import shutil

    import httpx

    from kvserve.testing.live_server import start_live_server

    model = tmp_path / "model"
    shutil.copytree(tiny_llama, model)
    config = json.loads((model / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps({**config, "max_new_tokens": 3}))
    body = {"model": "tiny", "prompt": "Once upon a time", "ignore_eos": True, "temperature": 0}
    for mode, expected in (("auto", 3), ("vllm", 16)):
        server = start_live_server(str(model), served_model_name="tiny", api_key="", max_model_len=256,
                                   num_gpu_blocks_override=64, generation_config=mode)
        try:
            usage = httpx.post(server.base_url + "/v1/completions", json=body, timeout=60).json()["usage"]
            assert usage["completion_tokens"] == expected, mode
        finally:
            server.stop()
