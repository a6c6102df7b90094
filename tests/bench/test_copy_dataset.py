"""The copy-edit workload: prompts that hold their expected answer (repeated, or with a light
edit), seeded, with the answer's token length as the output length."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from kvserve.bench.cli import apply_length_flags
from kvserve.bench.copy_dataset import KINDS, SENTENCES, CopyEditDataset, copy_prompt
from kvserve.bench.datasets import get_dataset
from kvserve.bench.flags import add_dataset_args
from kvserve.errors import InvalidRequestError


def test_each_kind_holds_its_answer():
    rng = np.random.default_rng(0)
    sentences = list(SENTENCES[:3])
    passage = " ".join(sentences)
    prompt, answer = copy_prompt("repeat", sentences, rng)
    assert answer == passage and prompt.index(passage) < prompt.index("Repeated passage:")
    prompt, answer = copy_prompt("replace", sentences, rng)
    a, b = prompt.split('"')[1], prompt.split('"')[3]
    assert f" {a} " in passage and answer == passage.replace(f" {a} ", f" {b} ") and answer != passage
    prompt, answer = copy_prompt("spelling", sentences, rng)
    shown = prompt.split("\n\n")[1]
    assert answer == passage and shown != passage and len(shown) == len(passage)
    assert sum(x != y for x, y in zip(shown.split(), passage.split())) == 3
    prompt, answer = copy_prompt("continue", sentences, rng)
    assert prompt == passage + "\n\n" + sentences[0] + " " and answer == " ".join(sentences[1:])


def test_samples_are_seeded_long_enough_and_sized_by_the_answer(tokenizer):
    samples = CopyEditDataset(passage_len=60).sample(tokenizer, 16, np.random.default_rng(3))
    again = CopyEditDataset(passage_len=60).sample(tokenizer, 16, np.random.default_rng(3))
    assert samples == again
    assert samples != CopyEditDataset(passage_len=60).sample(tokenizer, 16, np.random.default_rng(4))
    for s in samples:
        assert s.prompt_token_ids == tokenizer(s.prompt, add_special_tokens=False)["input_ids"]
        assert s.expected_output_len >= 30  # the answer: a passage of >= 60 tokens (continue: all but one sentence)
    assert {s.prompt.split("\n")[0][:6] for s in samples} >= {"Repeat", "Rewrit", "Correc"}
    fixed = CopyEditDataset(passage_len=60, output_len=7, kinds=("repeat",)).sample(tokenizer, 4, np.random.default_rng(0))
    assert [s.expected_output_len for s in fixed] == [7] * 4 and all(s.prompt.startswith("Repeat") for s in fixed)


def test_flags_and_refusals(tokenizer):
    import argparse

    parser = argparse.ArgumentParser()
    add_dataset_args(parser)
    args = parser.parse_args(["--dataset-name", "copy-edit", "--copy-passage-len", "40", "--copy-kinds",
                              "repeat,spelling", "--output-len", "9"])
    apply_length_flags(args)
    dataset = get_dataset(args)
    assert (dataset.passage_len, dataset.output_len, dataset.kinds) == (40, 9, ("repeat", "spelling"))
    assert len(dataset.sample(tokenizer, None, np.random.default_rng(0))) == 64
    with pytest.raises(InvalidRequestError, match="copy_kinds"):
        CopyEditDataset(kinds=("repeat", "poem"))
    with pytest.raises(InvalidRequestError, match="copy_passage_len"):
        get_dataset(SimpleNamespace(dataset_name="copy-edit", copy_passage_len=0, copy_kinds="repeat", output_len=None))
    assert set(KINDS) == {"repeat", "replace", "spelling", "continue"}
