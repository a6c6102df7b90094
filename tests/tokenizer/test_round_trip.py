"""Encode-then-decode round trips and ids against independent tokenizer implementations."""

from __future__ import annotations

import random

import pytest
from transformers import AutoTokenizer

from kvserve.testing.tokenizer_kinds import sentencepiece_model_path, tekken_json_path
from kvserve.tokenizer import load_tokenizer

ARCHITECTURES = ["LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"]
KINDS = ["bpe", "sentencepiece", "tekken"]
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Café naïve façade, crème brûlée, Łódź, smörgåsbord: Größe & Straße!",
    "你好，世界。今天天气很好。こんにちは世界。안녕하세요",
    "Emoji 😀🚀🎉 family 👨‍👩‍👧‍👦 flag 🇫🇷 done",
    "Mixed: déjà vu 東京 🐍 code:\n    x = 1  # two  spaces\n\nend",
    "   leading spaces, trailing spaces  ",
]


def _random_texts(count: int, seed: int = 0) -> list[str]:
    """Strings mixing spaces, tabs, newlines, accents, CJK and emoji (runs of whitespace are
    where converted SentencePiece tokenizers usually disagree with the original)."""
    rng = random.Random(seed)
    alphabet = list("  \n\tabcxyzé你好😀#.,")
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))) for _ in range(count)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_load_tokenizer_round_trips_non_ascii(checkpoint_factory, architecture, kind):
    tokenizer = load_tokenizer(checkpoint_factory(architecture, tokenizer_kind=kind))
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text
        with_specials = tokenizer.encode(text)
        assert tokenizer.decode(with_specials, skip_special_tokens=True) == text


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_auto_tokenizer_gives_the_files_ids(checkpoint_factory, architecture, kind):
    """The plain AutoTokenizer path (what transformers, guidellm and xgrammar use) agrees with
    the tokenizer.json as written, except for qwen2 + sentencepiece (see the next test)."""
    if (architecture, kind) == ("Qwen2ForCausalLM", "sentencepiece"):
        pytest.skip("transformers forces Qwen2Tokenizer here; covered below")
    from tokenizers import Tokenizer

    folder = checkpoint_factory(architecture, tokenizer_kind=kind)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    reference = Tokenizer.from_file(str(folder / "tokenizer.json"))
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert ids == reference.encode(text, add_special_tokens=False).ids
        assert tokenizer.decode(ids) == text


def test_load_tokenizer_undoes_qwen2_class_substitution(checkpoint_factory):
    folder = checkpoint_factory("Qwen2ForCausalLM", tokenizer_kind="sentencepiece")
    forced = AutoTokenizer.from_pretrained(folder)
    assert type(forced).__name__ == "Qwen2Tokenizer"
    text = TEXTS[1]
    reference = load_tokenizer(checkpoint_factory("LlamaForCausalLM", tokenizer_kind="sentencepiece"))
    tokenizer = load_tokenizer(folder)
    assert forced.encode(text, add_special_tokens=False) != reference.encode(text, add_special_tokens=False)
    assert tokenizer.encode(text, add_special_tokens=False) == reference.encode(text, add_special_tokens=False)
    assert len(tokenizer) == 32768


def test_sentencepiece_ids_match_the_sentencepiece_library(tiny_llama_sentencepiece):
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=str(sentencepiece_model_path()))
    tokenizer = load_tokenizer(tiny_llama_sentencepiece)
    for text in TEXTS + _random_texts(300):
        expected = processor.encode(text)
        assert tokenizer.encode(text, add_special_tokens=False) == expected, repr(text)
        assert tokenizer.encode(text) == [1] + expected  # BOS, as Llama/Mistral tokenizers
        assert tokenizer.decode(expected) == processor.decode(expected) == text


def test_tekken_ids_match_mistral_common(tiny_mistral_tekken):
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    tekkenizer = Tekkenizer.from_file(tekken_json_path())
    tokenizer = load_tokenizer(tiny_mistral_tekken)
    for text in TEXTS + _random_texts(300):
        expected = tekkenizer.encode(text, bos=False, eos=False)
        assert tokenizer.encode(text, add_special_tokens=False) == expected
        assert tokenizer.decode(expected) == tekkenizer.decode(expected) == text


def test_bpe_tokenizes_cjk_and_emoji_into_merged_tokens(tiny_llama):
    """The trained vocabulary holds merges for the corpus' scripts, not only single bytes."""
    tokenizer = load_tokenizer(tiny_llama)
    for text in ["你好", "世界", "😀"]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert len(ids) < len(text.encode("utf-8")), text
