"""--load-format dummy (vLLM's): a folder with only config.json and a tokenizer serves, with every
parameter drawn from [-1e-3, 1e-3], seeded (two loads are equal); a GGUF file and -tp are refused."""

from __future__ import annotations

import shutil

import pytest
import torch

from kvserve import LLM, SamplingParams
from kvserve.errors import ConfigError


@pytest.fixture()
def config_only(tiny_llama, tmp_path):
    for path in tiny_llama.iterdir():
        if not path.name.endswith(".safetensors") and path.is_file():
            shutil.copy(path, tmp_path / path.name)
    return tmp_path


def test_a_folder_without_weights_serves_random_ones(config_only):
    llm = LLM(str(config_only), load_format="dummy", dtype="float32", max_model_len=128, num_gpu_blocks_override=32)
    params = list(llm.llm_engine.core.loaded.model.parameters())
    assert params and all(p.abs().max() <= 1e-3 for p in params)
    assert any(p.abs().max() > 5e-4 for p in params)  # drawn, not zeros
    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4
    again = LLM(str(config_only), load_format="dummy", dtype="float32", max_model_len=128, num_gpu_blocks_override=32)
    for a, b in zip(params, again.llm_engine.core.loaded.model.parameters()):
        assert torch.equal(a, b)


def test_without_dummy_the_missing_weights_are_named(config_only):
    with pytest.raises(Exception, match="safetensors"):
        LLM(str(config_only), dtype="float32", max_model_len=128)


def test_dummy_with_tensor_parallelism_is_refused(config_only):
    from kvserve.engine.arg_utils import engine_config_from_kwargs

    with pytest.raises(ConfigError, match="--load-format dummy runs one process"):
        engine_config_from_kwargs(str(config_only), load_format="dummy", tensor_parallel_size=2)
