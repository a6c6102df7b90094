"""bad_words (vLLM): tokenization with and without a leading space, and the ban of a sequence's
last token when the generated tokens end with the rest of it."""

from __future__ import annotations

import pytest
import torch

from kvserve.engine.param_validation import validate_sampling_params
from kvserve.errors import InvalidRequestError
from kvserve.request import Request
from kvserve.sample.bad_words import banned_token_ids, tokenize_bad_words
from kvserve.sample.sampler import Sampler
from kvserve.sampling_params import SamplingParams

V = 16


class DictTokenizer:
    """``encode`` from a fixed table, to state the tokenization rules with known ids."""

    TABLE = {
        "dog": [1], " dog": [2],  # same length, other first token: both kept
        "big dog": [3, 1], " big dog": [4, 1],
        "xy": [5, 6], " xy": [7],  # the spaced form is shorter: dropped
        "same": [8], " same": [8],  # the space changes nothing: kept once
        "far": [9, 10], " far": [99, 10],  # kept, and out of the vocabulary
        "": [],
    }

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        assert add_special_tokens is False
        return self.TABLE[text]


def test_tokenization_rules():
    tokenizer = DictTokenizer()
    assert tokenize_bad_words(tokenizer, ["dog", " big dog", "xy", "same"], V) == [
        [1], [2], [3, 1], [4, 1], [5, 6], [8]]
    with pytest.raises(InvalidRequestError) as info:
        tokenize_bad_words(tokenizer, ["far"], V)
    assert info.value.param == "bad_words" and "99" in info.value.message
    with pytest.raises(InvalidRequestError, match="encodes to no token"):
        tokenize_bad_words(tokenizer, [""], V)


def test_real_tokenizer_variants(tiny_llama):
    from kvserve.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tiny_llama)
    vocab = len(tokenizer)
    for word in ["hello", "Paris", "the model"]:
        plain = tokenizer.encode(word, add_special_tokens=False)
        spaced = tokenizer.encode(" " + word, add_special_tokens=False)
        expected = [plain] + ([spaced] if spaced[0] != plain[0] and len(spaced) == len(plain) else [])
        assert tokenize_bad_words(tokenizer, [word], vocab) == expected
        assert tokenize_bad_words(tokenizer, ["  " + word], vocab) == expected  # leading spaces go


def test_ban_needs_the_generated_prefix():
    sequences = [[1], [3, 1], [4, 5, 6]]
    assert banned_token_ids(sequences, []) == [1]  # one-token words: always
    assert banned_token_ids(sequences, [9, 3]) == [1]
    assert banned_token_ids(sequences, [9, 4]) == [1]
    assert banned_token_ids(sequences, [4, 5]) == [1, 6]
    assert banned_token_ids(sequences, [4, 5, 7]) == [1]
    assert banned_token_ids([[2, 2, 2]], [2]) == []
    assert banned_token_ids([[2, 2, 2]], [0, 2, 2]) == [2]


def test_sampler_bans_per_row_from_output_tokens_only(build):
    logits = torch.zeros(3, V)
    logits[:, 6] = 9.0  # everyone's favourite
    logits[:, 11] = 8.0
    logits[:, 12] = 7.0

    def request(prompt, output, sequences):
        r = Request.of("r", prompt, SamplingParams(temperature=0.0, bad_words=["unused"]),
                       bad_words_token_ids=sequences)
        r.append_output_token_ids(output)
        return r

    requests = [
        request([1, 2, 4, 5], [], [[4, 5, 6]]),  # the prompt ends with 4, 5: not a generated prefix
        request([1], [4, 5], [[4, 5, 6]]),  # generated 4, 5: 6 is banned
        request([1], [3], [[6], [11]]),  # one-token words: banned at once
    ]
    metadata = build(requests, V)
    processed = Sampler._process_logits(logits, metadata)
    banned = [(r, t) for r in range(3) for t in range(V) if processed[r, t] == float("-inf")]
    assert banned == [(1, 6), (2, 6), (2, 11)]
    assert Sampler()(logits, metadata).sampled_token_ids.tolist() == [6, 11, 12]


def test_validation():
    with pytest.raises(InvalidRequestError) as info:
        validate_sampling_params(SamplingParams(bad_words=["ok", "  "]), V)
    assert info.value.param == "bad_words"
    assert SamplingParams(bad_words="word").bad_words == ["word"]
