"""Workload generators give exact token lengths under a real tokenizer loaded by AutoTokenizer."""

from __future__ import annotations

import json
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest

from kvserve.bench.datasets import (DATASETS, PrefixRepetitionDataset, RandomDataset, SharedPrefixDataset,
                                    get_dataset, parse_range_ratio)
from kvserve.bench.file_datasets import CustomDataset, JsonlDataset, ShareGPTDataset, SpecBenchDataset
from kvserve.bench.prompts import ExactLengthPrompter
from kvserve.errors import InvalidRequestError


def reencode(tokenizer, text: str) -> list[int]:
    # Independent of kvserve.bench.prompts.encode: the tokenizer's own call.
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_registry_names():
    assert set(DATASETS) == {"random", "shared-prefix", "sharegpt", "jsonl", "prefix_repetition", "custom",
                             "spec_bench", "copy-edit"}
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


def test_random_dataset_vllm_bounds_prefix_and_ratio_object(tokenizer):
    # vLLM: input in [floor(40 * 0.75), ceil(40 * 1.25)] = [30, 50], output in [floor(10 * 0.5), ceil(10 * 1.5)]
    ds = RandomDataset(40, 10, range_ratio='{"input": 0.25, "output": 0.5}', prefix_len=6)
    samples = ds.sample(tokenizer, 40, np.random.default_rng(3))
    prefix = samples[0].prompt_token_ids[:6]
    for s in samples:
        assert s.prompt_token_ids[:6] == prefix  # one fixed random prefix
        assert 6 + 30 <= s.prompt_len <= 6 + 50 and 5 <= s.expected_output_len <= 15
        assert reencode(tokenizer, s.prompt) == s.prompt_token_ids
    assert {s.prompt_len for s in samples} > {36} and min(s.expected_output_len for s in samples) >= 5
    assert parse_range_ratio("0.3") == (0.3, 0.3) and parse_range_ratio('{"output": 0.5}') == (0.0, 0.5)
    for bad in ("1.0", '{"inputs": 0.1}', "x"):
        with pytest.raises(InvalidRequestError, match="random_range_ratio"):
            parse_range_ratio(bad)
    assert RandomDataset(1, 1, 0.0).sample(tokenizer, 2, np.random.default_rng(0))[0].expected_output_len == 1
    with pytest.raises(InvalidRequestError, match="random-input-len"):
        RandomDataset(1, 1, 0.5).sample(tokenizer, 2, np.random.default_rng(0))  # floor(0.5) = 0 tokens


def test_prefix_repetition_is_vllm_shaped(tokenizer):
    # vLLM: num_prefixes prefixes x (num_requests // num_prefixes) suffixes, shuffled
    samples = PrefixRepetitionDataset(12, 5, 3, 7).sample(tokenizer, 10, np.random.default_rng(0))
    assert len(samples) == 9 and all(s.prompt_len == 17 and s.expected_output_len == 7 for s in samples)
    assert sorted(Counter(tuple(s.prompt_token_ids[:12]) for s in samples).values()) == [3, 3, 3]
    ordered = PrefixRepetitionDataset(12, 5, 3, 7, shuffle=False).sample(tokenizer, 6, np.random.default_rng(0))
    assert [s.prompt_token_ids[:12] for s in ordered][::2] == [s.prompt_token_ids[:12] for s in ordered][1::2]
    with pytest.raises(InvalidRequestError, match="num-prefixes"):
        PrefixRepetitionDataset(12, 5, 3, 7).sample(tokenizer, 2, np.random.default_rng(0))


def test_custom_and_spec_bench_files(tokenizer, tmp_path, monkeypatch):
    template = "{% for m in messages %}<s>user: {{ m['content'] }}\n{% endfor %}assistant:"
    monkeypatch.setattr(tokenizer, "chat_template", template, raising=False)
    path = tmp_path / "data.jsonl"
    path.write_text('{"prompt": "what does the cache keep"}\n{"prompt": "prefix caching reuses blocks"}\n')
    plain = CustomDataset(str(path), 5, skip_chat_template=True, shuffle=False).sample(tokenizer, 0,
                                                                                      np.random.default_rng(0))
    assert [(s.prompt, s.expected_output_len) for s in plain] == [("what does the cache keep", 5),
                                                                   ("prefix caching reuses blocks", 5)]
    templated = CustomDataset(str(path), 5, shuffle=False).sample(tokenizer, 3, np.random.default_rng(0))
    assert templated[0].prompt == "<s>user: what does the cache keep\nassistant:"
    assert templated[0].prompt_token_ids == tokenizer(templated[0].prompt)["input_ids"]  # vLLM's count
    assert len(templated) == 3 and templated[2].prompt in {t.prompt for t in templated[:2]}  # oversampled
    spec = tmp_path / "question.jsonl"
    spec.write_text('{"category": "math", "turns": ["two plus two", "and three"]}\n'
                    '{"category": "qa", "turns": ["who wrote it"]}\n')
    math_only = SpecBenchDataset(str(spec), 9, skip_chat_template=True, category="math", oversample=False)
    assert [s.prompt for s in math_only.sample(tokenizer, -1, np.random.default_rng(0))] == ["two plus two"]
    path.write_text('{"text": "no prompt"}\n')
    with pytest.raises(InvalidRequestError, match='"prompt"'):
        CustomDataset(str(path), 5).sample(tokenizer, 1, np.random.default_rng(0))
    with pytest.raises(InvalidRequestError, match="-1"):
        CustomDataset(str(path), -1)


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
    # vLLM filters short prompts even with a fixed output length ("hi" stays out); fewer usable
    # prompts than asked: its oversampling repeats seeded random ones, unless turned off
    five = ShareGPTDataset(str(path), output_len=9).sample(tokenizer, 5, np.random.default_rng(0))
    assert len(five) == 5 and {s.prompt for s in five} == set(expected) and five[:2] == fixed
    assert len(ShareGPTDataset(str(path), 9, oversample=False).sample(tokenizer, 5, np.random.default_rng(0))) == 2
    in_order = ShareGPTDataset(str(path), shuffle=False).sample(tokenizer, None, np.random.default_rng(0))
    assert [s.prompt for s in in_order] == list(expected)  # file order


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
