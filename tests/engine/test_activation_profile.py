"""The largest-step profile that sizes a GPU's KV cache (``kvserve.engine.activation_profile``),
run on the CPU (where nothing is measured): every family's forward runs on its scratch cache, and
the engine's own cache and outputs are untouched by it."""

from __future__ import annotations

import pytest
import torch

from kvserve.engine.activation_profile import profile_step
from kvserve.model.loader import load_model
from kvserve.model.runner import ModelRunner


@pytest.mark.parametrize("architecture", ["LlamaForCausalLM", "DeepseekV3ForCausalLM", "GptOssForCausalLM",
                                          "Gemma3ForCausalLM", "Qwen3MoeForCausalLM"])
def test_the_largest_step_runs_on_a_scratch_cache(checkpoint_factory, architecture):
    loaded = load_model(checkpoint_factory(architecture))
    runner = ModelRunner(loaded, num_blocks=16, block_size=4)
    prompt, table = [5, 17, 3, 99, 41, 7], [3, 1]
    before = runner.forward([prompt], [table])[0]
    caches = [c.clone() for c in runner.kv_caches]
    # 37 tokens as requests of at most 16 (the scheduler packs several into a step), 5 logit rows
    profile_step(loaded, num_tokens=37, max_model_len=16, num_rows=5, block_size=4, kv_cache_dtype="auto",
                 device=torch.device("cpu"))
    assert all(torch.equal(a, b) for a, b in zip(caches, runner.kv_caches))
    assert torch.equal(runner.forward([prompt], [table])[0], before)
