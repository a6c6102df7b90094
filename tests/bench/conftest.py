"""Fixtures of the bench tests: a real byte-level BPE tokenizer trained here, saved as a Hugging
Face tokenizer folder and loaded back through ``AutoTokenizer`` (as ``--tokenizer DIR`` is)."""

from __future__ import annotations

import random

import pytest

WORDS = ("the engine schedules requests in blocks of tokens while the cache keeps keys and values "
         "for every layer so that decoding one more token costs one step instead of the whole "
         "prompt again; prefix caching reuses full blocks; throughput latency goodput ünïcödé 東京 "
         "naïve café 123 456 7890 {json: [1, 2]} <tag/> tab\tnewline").split(" ")


def _corpus(n_lines: int = 400) -> list[str]:
    rng = random.Random(0)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 30))) for _ in range(n_lines)]


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    path = tmp_path_factory.mktemp("bpe_tokenizer")
    hf.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir):
    from kvserve.bench.prompts import load_tokenizer

    return load_tokenizer(tokenizer_dir)
