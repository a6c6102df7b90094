"""Encode-then-decode round trips and ids against independent tokenizer implementations."""

from __future__ import annotations

import random
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from kvserve.testing.tokenizer_kinds import sentencepiece_model_path

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
def test_load_tokenizer_round_trips_non_ascii(checkpoint_factory, loaded_tokenizer, kind):
    tokenizer = loaded_tokenizer(checkpoint_factory("LlamaForCausalLM", tokenizer_kind=kind))
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text
        with_specials = tokenizer.encode(text)
        assert tokenizer.decode(with_specials, skip_special_tokens=True) == text


def _architecture_kind_pairs():
    # Tekken loads take seconds (17 MB tokenizer.json): Llama and Qwen3 rows run as slow tests;
    # Mistral (its real pairing) and Qwen2 (the class substitution) always run.
    for architecture in ARCHITECTURES:
        for kind in KINDS:
            slow = kind == "tekken" and architecture in ("LlamaForCausalLM", "Qwen3ForCausalLM")
            marks = [pytest.mark.slow] if slow else []
            yield pytest.param(architecture, kind, marks=marks, id=f"{architecture}-{kind}")


@pytest.mark.parametrize(("architecture", "kind"), list(_architecture_kind_pairs()))
def test_each_architectures_tokenizer_round_trips(checkpoint_factory, loaded_tokenizer, architecture, kind):
    """Both paths, load_tokenizer and the plain AutoTokenizer (what transformers, guidellm and
    xgrammar use), give the ids of the Llama folder's tokenizer (same files) and round trip;
    the plain path is exempt for qwen2 + sentencepiece (see the next test)."""
    folder = checkpoint_factory(architecture, tokenizer_kind=kind)
    reference = loaded_tokenizer(checkpoint_factory("LlamaForCausalLM", tokenizer_kind=kind))
    tokenizers = [loaded_tokenizer(folder)]
    if (architecture, kind) != ("Qwen2ForCausalLM", "sentencepiece"):
        tokenizers.append(AutoTokenizer.from_pretrained(folder))
    for tokenizer in tokenizers:
        for text in TEXTS:
            ids = tokenizer.encode(text, add_special_tokens=False)
            assert ids == reference.encode(text, add_special_tokens=False), type(tokenizer)
            assert tokenizer.decode(ids) == text


def test_load_tokenizer_undoes_qwen2_class_substitution(checkpoint_factory, loaded_tokenizer):
    folder = checkpoint_factory("Qwen2ForCausalLM", tokenizer_kind="sentencepiece")
    forced = AutoTokenizer.from_pretrained(folder)
    assert type(forced).__name__ == "Qwen2Tokenizer"
    text = TEXTS[1]
    reference = loaded_tokenizer(checkpoint_factory("LlamaForCausalLM", tokenizer_kind="sentencepiece"))
    tokenizer = loaded_tokenizer(folder)
    assert forced.encode(text, add_special_tokens=False) != reference.encode(text, add_special_tokens=False)
    assert tokenizer.encode(text, add_special_tokens=False) == reference.encode(text, add_special_tokens=False)
    assert len(tokenizer) == 32768


def test_sentencepiece_ids_match_the_sentencepiece_library(tiny_llama_sentencepiece, loaded_tokenizer):
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=str(sentencepiece_model_path()))
    tokenizer = loaded_tokenizer(tiny_llama_sentencepiece)
    for text in TEXTS + _random_texts(300):
        expected = processor.encode(text)
        assert tokenizer.encode(text, add_special_tokens=False) == expected, repr(text)
        assert tokenizer.encode(text) == [1] + expected  # BOS, as Llama/Mistral tokenizers
        assert tokenizer.decode(expected) == processor.decode(expected) == text


def test_tekken_ids_match_mistral_common(tiny_mistral_tekken, loaded_tokenizer, mistral_common_tokenizer):
    tekkenizer = mistral_common_tokenizer("tekken").instruct_tokenizer.tokenizer
    tokenizer = loaded_tokenizer(tiny_mistral_tekken)
    for text in TEXTS + _random_texts(300):
        expected = tekkenizer.encode(text, bos=False, eos=False)
        assert tokenizer.encode(text, add_special_tokens=False) == expected
        assert tokenizer.decode(expected) == tekkenizer.decode(expected) == text


def test_bpe_tokenizes_cjk_and_emoji_into_merged_tokens(tiny_llama, loaded_tokenizer):
    """The trained vocabulary holds merges for the corpus' scripts, not only single bytes."""
    tokenizer = loaded_tokenizer(tiny_llama)
    for text in ["你好", "世界", "😀"]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert len(ids) < len(text.encode("utf-8")), text


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_bpe_round_trips_any_nfc_text(tiny_llama, loaded_tokenizer, text):
    """Byte-level BPE covers every string; its NFC normalizer (Qwen2's) maps text to NFC first."""
    tokenizer = loaded_tokenizer(tiny_llama)
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == unicodedata.normalize("NFC", text)
