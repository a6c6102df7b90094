"""Float32 logits of our models in flat, paged batches against transformers on the same weights."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from model_fixtures import VARIANTS, flat_prompt_logits, hf_logits, relative_error, sequential_block_tables

from kvserve.model.loader import load_model
from kvserve.model.runner import ModelRunner

TOLERANCE = 1e-4  # max abs diff relative to the largest reference logit
PROMPTS = [
    [(7 * i + 3) % 256 for i in range(19)],
    [(11 * i + 5) % 256 for i in range(7)],
    [(13 * i + 1) % 256 for i in range(33)],
    [42],
]


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_flat_batch_logits_match_transformers(tiny_checkpoint, variant, block_size):
    path, hf_model = tiny_checkpoint(variant)
    loaded = load_model(path)
    assert loaded.dtype == torch.float32
    runner = ModelRunner(loaded, num_blocks=64, block_size=block_size)
    tables = sequential_block_tables([len(p) for p in PROMPTS], block_size, start=1, reverse=True)
    ours = flat_prompt_logits(runner, PROMPTS, tables)
    for prompt, logits in zip(PROMPTS, ours):
        ref = hf_logits(hf_model, prompt)
        assert logits.shape == ref.shape and logits.dtype == torch.float32
        assert relative_error(logits, ref) < TOLERANCE


def test_chunked_prefill_mixed_with_decode_gives_same_logits(tiny_checkpoint):
    path, hf_model = tiny_checkpoint("qwen2")
    runner = ModelRunner(load_model(path), num_blocks=32, block_size=4)
    long_prompt, short_prompt = PROMPTS[2], PROMPTS[1]
    b_tokens = short_prompt + [9]  # prompt + one already generated token
    blocks_a, blocks_b = [3, 9, 1, 30, 12, 7, 20, 21, 22], [5, 0]
    # Step 1: a's first 10-token chunk, b's prompt; step 2: b's decode token, the rest of a.
    out1 = runner.forward([long_prompt[:10], b_tokens[:7]], [blocks_a, blocks_b])
    out2 = runner.forward([b_tokens, long_prompt], [blocks_b, blocks_a], num_computed=[7, 10])
    chunked = torch.cat([out1[0], out2[1]])
    assert relative_error(chunked, hf_logits(hf_model, long_prompt)) < TOLERANCE
    assert out2[0].shape == (1, 256)
    assert relative_error(out2[0][-1], hf_logits(hf_model, b_tokens)[-1]) < TOLERANCE


def test_sliding_window_is_applied(tiny_checkpoint, tmp_path):
    """Read the Mistral weights as plain Llama (no window): logits agree only before the window."""
    path, _ = tiny_checkpoint("mistral_window")
    shutil.copytree(path, tmp_path, dirs_exist_ok=True)
    config = json.loads((tmp_path / "config.json").read_text())
    config.update(architectures=["LlamaForCausalLM"], sliding_window=None)
    (tmp_path / "config.json").write_text(json.dumps(config))
    prompt, window = PROMPTS[0], VARIANTS["mistral_window"][1]["sliding_window"]
    windowed, full = (
        flat_prompt_logits(ModelRunner(load_model(p), 16, 4), [prompt], [list(range(5))])[0] for p in (path, tmp_path)
    )
    torch.testing.assert_close(windowed[:window], full[:window])
    assert (windowed[window:] - full[window:]).abs().amax(dim=-1).min() > 1e-3
