"""Incremental detokenization against ``tokenizer.decode`` of the whole output, with a byte-level
BPE, a SentencePiece (byte fallback) and the Tekken tokenizer."""

from __future__ import annotations

import random

import pytest

from kvserve.engine.detokenizer import IncrementalDetokenizer, TokenDetokenizer, detokenize_token
from kvserve.testing.tokenizer_kinds import build_tokenizer

KINDS = ["bpe", "sentencepiece", "tekken"]
# CJK (common and rare: rare ones fall back to bytes), emoji with ZWJ and skin tone, accents.
TEXTS = [
    "你好，世界！今天天气很好。",
    "龘靐齉 𠀋𪚥 — rare characters",
    "Emoji: 🎉🚀 👩🏽‍💻 🇫🇷 and ❤️ mixed with text",
    "naïve café résumé, こんにちは、カタカナ and 한국어 텍스트",
    "  leading spaces, tabs\tand\nnewlines\n\n",
]


@pytest.fixture(scope="module", params=KINDS)
def tokenizer(request):
    return build_tokenizer(request.param)


def feed(detokenizer: IncrementalDetokenizer, token_ids: list[int], rng: random.Random) -> list[str]:
    """Feed tokens in random chunks of 1-3; return every delta including the final flush."""
    deltas, position = [], 0
    while position < len(token_ids):
        size = rng.randint(1, 3)
        deltas.append(detokenizer.add_tokens(token_ids[position:position + size]))
        position += size
    deltas.append(detokenizer.flush())
    return deltas


@pytest.mark.parametrize("text", TEXTS)
def test_text_deltas_join_to_decode_and_never_split_a_character(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    expected = tokenizer.decode(ids, skip_special_tokens=True)
    for seed in range(3):
        deltas = feed(IncrementalDetokenizer(tokenizer, []), ids, random.Random(seed))
        assert "".join(deltas) == expected
        assert not any("\ufffd" in delta for delta in deltas)


def test_texts_really_split_characters_across_tokens(tokenizer):
    """Guard for the test above: some token of these texts decodes alone to a broken character."""
    ids = [t for text in TEXTS for t in tokenizer.encode(text, add_special_tokens=False)]
    assert any("\ufffd" in tokenizer.decode([t]) for t in ids)


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_random_token_sequences_join_to_decode(tokenizer, skip_special_tokens):
    rng = random.Random(1)
    vocab_size = len(tokenizer)
    special = sorted(tokenizer.added_tokens_decoder)[:4]
    for _ in range(30):
        ids = [rng.randrange(vocab_size) for _ in range(rng.randint(1, 40))]
        ids[rng.randrange(len(ids))] = rng.choice(special)
        detokenizer = IncrementalDetokenizer(tokenizer, [], skip_special_tokens=skip_special_tokens)
        deltas = feed(detokenizer, ids, rng)
        assert "".join(deltas) == tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


@pytest.mark.parametrize("text", TEXTS[:3])
def test_output_after_prompt_is_decoded_in_context(tokenizer, text):
    prompt = tokenizer.encode("The answer is", add_special_tokens=True)
    # SentencePiece (Metaspace, prepend "first") writes the word-initial space itself as "▁".
    metaspace = tokenizer.convert_ids_to_tokens(tokenizer.encode("a", add_special_tokens=False))[0] == "▁a"
    output = tokenizer.encode(text if metaspace else " " + text, add_special_tokens=False)
    deltas = feed(IncrementalDetokenizer(tokenizer, prompt), output, random.Random(0))
    prompt_text = tokenizer.decode(prompt, skip_special_tokens=True)
    full_text = tokenizer.decode(prompt + output, skip_special_tokens=True)
    assert full_text.startswith(prompt_text)
    assert "".join(deltas) == full_text[len(prompt_text):]
    assert "".join(deltas).startswith(" ")  # the leading space survives (SentencePiece too)


class CountingTokenizer:
    """Wraps a tokenizer and records the length of every ``decode`` call."""

    def __init__(self, inner):
        self.inner = inner
        self.added_tokens_decoder = inner.added_tokens_decoder
        self.backend_tokenizer = inner.backend_tokenizer
        self.convert_ids_to_tokens = inner.convert_ids_to_tokens
        self.decode_lengths: list[int] = []

    def decode(self, ids, **kwargs):
        self.decode_lengths.append(len(ids))
        return self.inner.decode(ids, **kwargs)


def test_work_per_call_is_bounded(tokenizer):
    """Decode calls see a short window: its longest size is the same for one copy of the texts
    and for eight (it depends on the text, e.g. runs of byte tokens, not on its length)."""

    def longest_decode(copies: int) -> int:
        counting = CountingTokenizer(tokenizer)
        ids = tokenizer.encode(" ".join(TEXTS * copies), add_special_tokens=False)
        detokenizer = IncrementalDetokenizer(counting, list(range(100)))
        text = "".join(detokenizer.add_tokens([t]) for t in ids) + detokenizer.flush()
        assert text == tokenizer.decode(ids)
        return max(counting.decode_lengths)

    assert longest_decode(8) == longest_decode(1) <= 24


def test_token_bytes_rebuild_the_text(tokenizer):
    table = TokenDetokenizer(tokenizer)
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        joined = b"".join(table(t)[1] for t in ids)
        # SentencePiece prepends "▁" to the first word; its own text keeps that space.
        assert joined in (text.encode(), b" " + text.encode())


def test_token_text_and_bytes_examples():
    spm = build_tokenizer("sentencepiece")
    hello = spm.convert_tokens_to_ids("▁Hello")
    assert detokenize_token(spm, hello) == (" Hello", b" Hello")
    assert detokenize_token(spm, spm.convert_tokens_to_ids("<0xE9>")) == ("\ufffd", b"\xe9")
    assert detokenize_token(spm, spm.eos_token_id) == ("</s>", b"</s>")
    bpe = build_tokenizer("bpe")
    ni = bpe.encode("你", add_special_tokens=False)
    assert b"".join(detokenize_token(bpe, t)[1] for t in ni) == "你".encode()
    space_the = bpe.encode(" the", add_special_tokens=False)
    assert len(space_the) == 1 and detokenize_token(bpe, space_the[0]) == (" the", b" the")
    assert detokenize_token(bpe, bpe.convert_tokens_to_ids("<|im_end|>")) == ("<|im_end|>", b"<|im_end|>")
