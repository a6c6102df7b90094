"""The built-in model's trained draft (``builtin_model/draft``): a small model with the built-in
model's tokenizer, and greedy speculation with it on the built-in model gives the plain engine's
tokens and logprob bits (float32), K/V checked after every step."""

from __future__ import annotations

import json

import pytest

from kvserve import SamplingParams
from kvserve.bench.copy_dataset import SENTENCES
from kvserve.builtin import BUILTIN_DRAFT_MODEL_FILES, builtin_draft_model_path, builtin_model_path
from kvserve.tokenizer import load_tokenizer
from spec_helpers import generate_checked, make_llm, results, spec_stats

GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, logprobs=2)


def test_draft_folder_is_small_and_shares_the_tokenizer():
    draft, target = builtin_draft_model_path(), builtin_model_path()
    for name in BUILTIN_DRAFT_MODEL_FILES + ("training_log.json",):
        assert (draft / name).is_file(), name
    assert sum(f.stat().st_size for f in draft.iterdir() if f.is_file()) < 5 * 2**20
    assert (draft / "tokenizer.json").read_bytes() == (target / "tokenizer.json").read_bytes()
    config, target_config = (json.loads((d / "config.json").read_text()) for d in (draft, target))
    for key in ("vocab_size", "bos_token_id", "eos_token_id", "max_position_embeddings"):
        assert config[key] == target_config[key], key
    log = json.loads((draft / "training_log.json").read_text())
    assert log["parameters"] < target_config["hidden_size"] * target_config["vocab_size"]  # < the target's embedding
    assert log["corpus"]["package"] == "r-cran-janeaustenr" and log["args"]["tokenizer"].endswith("builtin_model")
    assert log["val_curve"][-1]["val_loss"] < log["loss_curve"][0]["loss"] - 3.0


@pytest.fixture(scope="module")
def prompts():
    tokenizer = load_tokenizer(builtin_model_path())
    passage = " ".join(SENTENCES[18:22])
    texts = ["It was a fine morning, and Elizabeth", "\"My dear,\" said he, \"I",
             passage + "\n\n" + SENTENCES[18] + " "]  # a quoted document (copy-edit's continue kind)
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


def test_trained_draft_greedy_equals_plain_on_the_builtin_model(prompts):
    plain = results(make_llm(builtin_model_path()).generate(prompts, GREEDY))
    config = {"method": "draft_model", "model": str(builtin_draft_model_path()), "num_speculative_tokens": 3,
              "min_acceptance_rate": 0}
    spec = make_llm(builtin_model_path(), speculative_config=config)
    assert results(generate_checked(spec, prompts, GREEDY)) == plain
    stats = spec_stats(spec)
    assert stats.num_draft_tokens > 0 and stats.acceptance_rate > 0.4  # 59% measured (docs/benchmarks.md section 5.3)
