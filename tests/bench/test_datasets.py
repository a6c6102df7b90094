"""Workload generators give exact token lengths under a real tokenizer loaded by AutoTokenizer."""

from __future__ import annotations

import json
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest

from kvserve.bench.datasets import DATASETS, RandomDataset, SharedPrefixDataset, get_dataset
from kvserve.bench.file_datasets import JsonlDataset, ShareGPTDataset
from kvserve.bench.prompts import ExactLengthPrompter
from kvserve.errors import InvalidRequestError


def reencode(tokenizer, text: str) -> list[int]:
    # Independent of kvserve.bench.prompts.encode: the tokenizer's own call.
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_registry_names():
    assert set(DATASETS) == {"random", "shared-prefix", "sharegpt", "jsonl"}
    with pytest.raises(InvalidRequestError, match="choose one of"):
        get_dataset(SimpleNamespace(dataset_name="nope"))


@pytest.mark.parametrize("length", [1, 2, 5, 31, 128])
def test_exact_length_texts(tokenizer, length):
    prompter = ExactLengthPrompter(tokenizer, np.random.default_rng(length))
    for _ in range(5):
        text, ids = prompter.text(length)
        assert reencode(tokenizer, text) == ids and len(ids) == length


def test_random_dataset_exact_lengths_and_seeded(tokenizer):
    samples = RandomDataset(48, 16).sample(tokenizer, 12, np.random.default_rng(0))
    assert len(samples) == 12
    for s in samples:
        assert len(reencode(tokenizer, s.prompt)) == 48 == s.prompt_len
        assert s.expected_output_len == 16
    again = RandomDataset(48, 16).sample(tokenizer, 12, np.random.default_rng(0))
    assert [s.prompt for s in again] == [s.prompt for s in samples]
    other = RandomDataset(48, 16).sample(tokenizer, 12, np.random.default_rng(1))
    assert [s.prompt for s in other] != [s.prompt for s in samples]


def test_random_dataset_range_ratio(tokenizer):
    samples = RandomDataset(40, 20, range_ratio=0.5).sample(tokenizer, 30, np.random.default_rng(2))
    assert all(20 <= s.prompt_len <= 60 and 10 <= s.expected_output_len <= 30 for s in samples)
    assert all(len(reencode(tokenizer, s.prompt)) == s.prompt_len for s in samples)
    assert len({s.prompt_len for s in samples}) > 5
    with pytest.raises(InvalidRequestError, match=r"\[0, 1\)"):
        RandomDataset(40, 20, range_ratio=1.0)


def test_shared_prefix_groups(tokenizer):
    ds = SharedPrefixDataset(num_groups=3, prompts_per_group=4, system_prompt_len=20, question_len=7, output_len=5)
    samples = ds.sample(tokenizer, None, np.random.default_rng(0))
    assert len(samples) == 12
    for s in samples:
        assert reencode(tokenizer, s.prompt) == s.prompt_token_ids and s.prompt_len == 27
    groups = Counter(tuple(s.prompt_token_ids[:20]) for s in samples)
    assert sorted(groups.values()) == [4, 4, 4]
    assert len({tuple(s.prompt_token_ids) for s in samples}) == 12  # every question differs
    assert len(ds.sample(tokenizer, 30, np.random.default_rng(0))) == 30  # cycles the set


def test_sharegpt_file(tokenizer, tmp_path):
    long_reply = "the engine schedules requests in blocks of tokens " * 2
    data = [
        {"conversations": [{"from": "human", "value": "what does the cache keep for every layer"},
                           {"from": "gpt", "value": long_reply}]},
        {"conversations": [{"role": "user", "content": "prefix caching reuses full blocks of tokens"},
                           {"role": "assistant", "content": "throughput latency goodput and more words"}]},
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello there friend"}]},
        {"conversations": [{"from": "human", "value": "only one turn"}]},
    ]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data))
    samples = ShareGPTDataset(str(path)).sample(tokenizer, None, np.random.default_rng(0))
    expected = {}
    for conv in data[:2]:
        prompt, reply = (t.get("value", t.get("content")) for t in conv["conversations"])
        expected[prompt] = (reencode(tokenizer, prompt), len(reencode(tokenizer, reply)))
    assert len(reencode(tokenizer, "hi")) < 4  # so the third conversation is filtered out
    assert {s.prompt: (s.prompt_token_ids, s.expected_output_len) for s in samples} == expected
    fixed = ShareGPTDataset(str(path), output_len=9).sample(tokenizer, 2, np.random.default_rng(0))
    assert [s.expected_output_len for s in fixed] == [9, 9]
    with pytest.raises(InvalidRequestError, match="3 usable prompts but 5"):
        ShareGPTDataset(str(path), output_len=9).sample(tokenizer, 5, np.random.default_rng(0))


def test_jsonl_file(tokenizer, tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('"plain string prompt"\n\n{"prompt": "with a length", "output_len": 7}\n'
                    '{"prompt": "max tokens name", "max_tokens": 3}\n')
    samples = JsonlDataset(str(path), output_len=11).sample(tokenizer, None, np.random.default_rng(0))
    assert [(s.prompt, s.expected_output_len) for s in samples] == [
        ("plain string prompt", 11), ("with a length", 7), ("max tokens name", 3)]
    assert all(s.prompt_token_ids == reencode(tokenizer, s.prompt) for s in samples)
    path.write_text('{"prompt": "ok"}\n{"text": "wrong key"}\n')
    with pytest.raises(InvalidRequestError, match="line 2"):
        JsonlDataset(str(path), 4).sample(tokenizer, None, np.random.default_rng(0))
    with pytest.raises(InvalidRequestError, match="cannot read dataset file"):
        JsonlDataset(str(tmp_path / "missing.jsonl"), 4).sample(tokenizer, None, np.random.default_rng(0))


@pytest.mark.slow
def test_exact_lengths_with_tekken(tmp_path):
    """A production tokenizer (Mistral's Tekken, shipped in mistral_common), converted to a
    Hugging Face folder: ~15 s to convert and load."""
    import os

    import mistral_common
    from transformers.integrations.mistral import convert_tekken_tokenizer

    from kvserve.bench.prompts import load_tokenizer

    convert_tekken_tokenizer(os.path.join(os.path.dirname(mistral_common.__file__), "data", "tekken_240718.json")
                             ).save_pretrained(tmp_path)
    tok = load_tokenizer(str(tmp_path))
    samples = RandomDataset(64, 8, range_ratio=0.5).sample(tok, 10, np.random.default_rng(0))
    assert all(len(reencode(tok, s.prompt)) == s.prompt_len for s in samples)
    shared = SharedPrefixDataset(2, 3, 40, 10, 4).sample(tok, None, np.random.default_rng(0))
    assert all(reencode(tok, s.prompt) == s.prompt_token_ids and s.prompt_len == 50 for s in shared)
