"""The shipped built-in model: complete folder, loads with transformers, writes English words, and
our runtime's greedy continuation equals transformers' token for token."""

from __future__ import annotations

import json
import re

import pytest
import torch

from kvserve.builtin import BUILTIN_MODEL_FILES, BUILTIN_MODEL_NAME, builtin_model_path

PROMPTS = [
    "It was a fine morning, and Elizabeth",
    "Mrs. Bennet was very glad to",
    "\"My dear,\" said he, \"I",
]


@pytest.fixture(scope="module")
def hf_model():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = builtin_model_path()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path)


def _greedy_reference(model, ids: list[int], n: int) -> list[int]:
    """Argmax continuation by full re-forward of the whole sequence each step (no KV cache)."""
    seq = list(ids)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(ids):]


def test_folder_complete_and_small():
    path = builtin_model_path()
    assert BUILTIN_MODEL_NAME.startswith("kvserve-builtin-")
    for name in BUILTIN_MODEL_FILES + ("training_log.json", "corpus_words.txt"):
        assert (path / name).is_file(), name
    total = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    assert total < 25 * 2**20, total


def test_config_and_training_log():
    path = builtin_model_path()
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["num_key_value_heads"] < config["num_attention_heads"]  # GQA
    assert config["tie_word_embeddings"] is True
    log = json.loads((path / "training_log.json").read_text())
    assert 5_000_000 <= log["parameters"] <= 20_000_000
    assert log["corpus"]["package"] == "r-cran-janeaustenr"
    assert log["tokens_seen"] == log["steps"] * log["args"]["batch_size"] * log["args"]["context"]
    assert log["val_curve"][-1]["val_loss"] < log["loss_curve"][0]["loss"] - 3.0


def test_tokenizer_and_chat_template(hf_model):
    _, tok = hf_model
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<s>", "</s>", "<pad>")
    for marker in ("<|user|>", "<|assistant|>", "<|system|>"):
        assert len(tok(marker)["input_ids"]) == 1, marker
    text = tok.apply_chat_template([{"role": "user", "content": "Good day."}],
                                   add_generation_prompt=True, tokenize=False)
    assert text == "<s><|user|>\nGood day.</s>\n<|assistant|>\n"
    sample = "It is a truth universally acknowledged."
    assert tok.decode(tok(sample)["input_ids"]) == sample


def test_greedy_continuation_is_mostly_corpus_words(hf_model):
    model, tok = hf_model
    vocabulary = set((builtin_model_path() / "corpus_words.txt").read_text().split())
    words = []
    for prompt in PROMPTS:
        ids = tok(prompt)["input_ids"]
        out = model.generate(torch.tensor([ids]), max_new_tokens=40, do_sample=False)
        text = tok.decode(out[0, len(ids):], skip_special_tokens=True)
        words += re.findall(r"[a-z]+(?:'[a-z]+)*", text.lower())
    assert len(words) >= 30, words
    known = sum(w in vocabulary for w in words) / len(words)
    assert known > 0.8, (known, words)


def test_kvserve_greedy_matches_transformers(hf_model):
    from kvserve.generate import generate  # the runtime under test; imported here on purpose

    model, tok = hf_model
    token_prompts = [tok(p)["input_ids"] for p in PROMPTS]
    ours = generate(builtin_model_path(), token_prompts, max_tokens=24, dtype="float32",
                    ignore_eos=True)
    expected = [_greedy_reference(model, ids, 24) for ids in token_prompts]
    assert ours == expected
