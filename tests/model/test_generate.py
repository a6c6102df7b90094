"""Greedy continuations of the paged runtime against ``transformers.generate(do_sample=False)``."""

from __future__ import annotations

import math

import pytest
import torch
from model_fixtures import VARIANTS

from kvserve.errors import InvalidRequestError
from kvserve.generate import generate

PROMPTS = [
    [(5 * i + 2) % 256 for i in range(21)],
    [(3 * i + 7) % 256 for i in range(6)],
    [(17 * i + 4) % 256 for i in range(12)],
]


def hf_greedy_with_logits(hf_model, prompt: list[int], max_tokens: int) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy tokens and its logits at each step, float32 [max_tokens, vocab]."""
    with torch.no_grad():
        out = hf_model.generate(
            torch.tensor([prompt]), do_sample=False, max_new_tokens=max_tokens, min_new_tokens=max_tokens,
            pad_token_id=0, output_logits=True, return_dict_in_generate=True,
        )
    return out.sequences[0, len(prompt):].tolist(), torch.stack([step[0] for step in out.logits]).float()


def assert_same_greedy_up_to_a_bf16_tie(ours: list[int], theirs: list[int], logits: torch.Tensor) -> None:
    """Equal tokens, except that from a step where ours is within bfloat16 rounding of
    transformers' best logit (gap <= 2 bf16 ulps of the best logit: each side rounds once, and a
    different float32 summation order may land on either side; of exactly tied logits either may
    come first), ours may differ; the continuations differ from there. A divergence anywhere else
    fails."""
    step = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b), None)
    if step is None:
        return
    best = logits[step].max().item()
    gap = best - logits[step][ours[step]].item()
    ulp = 2.0 ** (math.floor(math.log2(abs(best))) - 7)
    assert gap <= 2 * ulp, f"step {step}: ours {ours[step]}, transformers {theirs[step]}, gap {gap} > 2 ulp {ulp}"


def hf_greedy(hf_model, prompt: list[int], max_tokens: int) -> list[int]:
    with torch.no_grad():
        out = hf_model.generate(
            torch.tensor([prompt]), do_sample=False, max_new_tokens=max_tokens, min_new_tokens=max_tokens,
            pad_token_id=0,
        )
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("variant", ["llama", "mistral_window", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe",
                                     "granite", "smollm3", "olmo2", "phi3_longrope", "phi3_partial", "gemma3", "gemma3_capped", "gemma2", "gpt_oss", "qwen3_yarn",
                                     "deepseek_v3", "deepseek_v3_plain", "deepseek_v2"])
def test_float32_greedy_matches_transformers(tiny_checkpoint, variant):
    path, hf_model = tiny_checkpoint(variant)
    ours = generate(path, PROMPTS, max_tokens=16, block_size=4, ignore_eos=True)
    assert ours == [hf_greedy(hf_model, p, 16) for p in PROMPTS]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_bfloat16_greedy_matches_transformers(tiny_checkpoint, variant):
    """bfloat16 rounds every layer's output, and kvserve's linears sum in another order than
    transformers' (oneDNN / MKL): tokens agree except at a genuine near-tie of transformers'
    logits (``assert_same_greedy_up_to_a_bf16_tie``)."""
    path, hf_model = tiny_checkpoint(variant, torch.bfloat16)
    ours = generate(path, PROMPTS, max_tokens=32, block_size=16, ignore_eos=True)  # dtype auto = bf16
    for prompt, tokens in zip(PROMPTS, ours, strict=True):
        assert_same_greedy_up_to_a_bf16_tie(tokens, *hf_greedy_with_logits(hf_model, prompt, 32))


def test_float16_requested_on_a_float32_checkpoint(tiny_checkpoint):
    from transformers import AutoModelForCausalLM

    path, _ = tiny_checkpoint("qwen3")
    hf_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float16).eval()
    ours = generate(path, PROMPTS, max_tokens=16, dtype="float16", ignore_eos=True)
    assert ours == [hf_greedy(hf_model, p, 16) for p in PROMPTS]


def test_stops_at_eos_from_generation_config(tiny_checkpoint, tmp_path):
    import json
    import shutil

    path, _ = tiny_checkpoint("llama")
    full = generate(path, PROMPTS[:1], max_tokens=12, ignore_eos=True)[0]
    shutil.copytree(path, tmp_path, dirs_exist_ok=True)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [full[4]]}))
    stopped = generate(tmp_path, PROMPTS[:1], max_tokens=12)[0]
    assert stopped == full[: full.index(full[4]) + 1]


def test_prompt_too_long_is_rejected(tiny_checkpoint):
    path, _ = tiny_checkpoint("llama")
    with pytest.raises(InvalidRequestError, match="at most 512 including max_tokens=20"):
        generate(path, [[1] * 500], max_tokens=20)
    with pytest.raises(InvalidRequestError, match="max_tokens must be >= 1"):
        generate(path, [[1, 2]], max_tokens=0)


def test_string_prompts_with_real_tokenizer(checkpoint_factory):
    """A project checkpoint with a BPE tokenizer: strings are tokenized with AutoTokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = checkpoint_factory("Qwen2ForCausalLM", "bpe", "float32")
    prompts = ["The quick brown fox", "Hello"]
    ours = generate(path, prompts, max_tokens=8, ignore_eos=True)
    tokenizer = AutoTokenizer.from_pretrained(path)
    hf_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert ours == [hf_greedy(hf_model, tokenizer(p)["input_ids"], 8) for p in prompts]
