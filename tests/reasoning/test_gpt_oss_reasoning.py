"""openai_gptoss: GPT-OSS's harmony channels as reasoning and content, on outputs written from
OpenAI's harmony guide (analysis then final, preambles, calls whose header puts ``to=`` before or
after the channel) and broken ones; whole and streamed at every split (markers cut in two
included), at random splits, and token by token through the engine's detokenizer with a
tokenizer that has harmony's markers as special tokens; the token-id checks that gate structured
outputs and count reasoning tokens, against ids found independently."""

from __future__ import annotations

import random

import pytest
from reasoning_streams import stream

from kvserve.engine.detokenizer import IncrementalDetokenizer
from kvserve.reasoning import get_reasoning_parser
from kvserve.testing import build_tokenizer
from kvserve.testing.harmony_tokenizer import build_harmony_tokenizer

NAME = "openai_gptoss"
CALL = ("<|channel|>commentary to=functions.get_weather <|constrain|>json"
        '<|message|>{"location":"Paris, 東京"}<|call|>')

# (output, reasoning_content, content)
CASES = [
    ("<|channel|>analysis<|message|>Let me think... 2+2 is 4.<|end|>"
     "<|start|>assistant<|channel|>final<|message|>The answer is **4**. Café 😀<|return|>",
     "Let me think... 2+2 is 4.", "The answer is **4**. Café 😀"),
    ("<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant" + CALL, "Need weather.", None),
    ("<|channel|>analysis<|message|>Need weather.<|end|>"  # a preamble, then the call
     "<|start|>assistant<|channel|>commentary<|message|>Checking the forecast.<|end|>"
     "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{}",
     "Need weather.", "Checking the forecast."),
    ("<|channel|>analysis<|message|>one<|end|><|start|>assistant<|channel|>analysis<|message|>two<|end|>"
     "<|start|>assistant<|channel|>final<|message|>done",
     "one\ntwo", "done"),
    ("<|channel|>analysis to=python<|message|>print(1)<|call|>", "print(1)", None),  # a built-in tool
    ("<|channel|>final<|message|>No thinking <|this is text|> < | here.", None,
     "No thinking <|this is text|> < | here."),
    ("<|channel|>analysis<|message|>cut off while thinki", "cut off while thinki", None),
    ("<|channel|>analysis<|message|>r<|end|><|start|>assistant<|channel|>fin", "r", None),  # header cut
    ("<|channel|>analysis<|message|>r<|end|>stray text<|start|>assistant<|channel|>final<|message|>a<|constrain|>b",
     "r", "ab"),
    ("<|channel|>analysis<|message|>r<|channel|>final<|message|>skipped the end", "r", "skipped the end"),
    ("<|channel|>final<|message|>ends in half a marker <|ret", None, "ends in half a marker <|ret"),
    ("Plain text from a model that writes no harmony", None, "Plain text from a model that writes no harmony"),
    ("", None, None),
]


@pytest.fixture(scope="module")
def tokenizer():
    return build_harmony_tokenizer()


def make(tokenizer):
    return get_reasoning_parser(NAME)(tokenizer)


@pytest.mark.parametrize("text,reasoning,content", CASES)
def test_whole_output(tokenizer, text, reasoning, content):
    assert make(tokenizer).extract_reasoning(text) == (reasoning, content)


@pytest.mark.parametrize("text,reasoning,content", CASES)
def test_every_split_streams_the_whole_split(tokenizer, text, reasoning, content):
    expected = (reasoning or "", content or "")
    for cut in range(len(text) + 1):  # every marker is also cut in two somewhere
        assert stream(make(tokenizer), [text[:cut], text[cut:]]) == expected, cut
    for seed in range(60):
        rng = random.Random(seed)
        if len(text) < 2:
            break
        cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(1, 12))))
        pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
        assert stream(make(tokenizer), pieces) == expected, pieces
    assert stream(make(tokenizer), list(text)) == expected


@pytest.mark.parametrize("text,reasoning,content", CASES[:5])
def test_token_by_token_through_the_detokenizer(tokenizer, text, reasoning, content):
    ids = tokenizer.encode(text, add_special_tokens=False)
    detokenizer = IncrementalDetokenizer(tokenizer, tokenizer.encode("<|start|>assistant", add_special_tokens=False),
                                         skip_special_tokens=False)
    pieces = [detokenizer.add_tokens([t]) for t in ids] + [detokenizer.flush()]
    assert "".join(pieces) == text
    assert stream(make(tokenizer), pieces) == (reasoning or "", content or "")


def test_markers_are_special_tokens_the_parser_names(tokenizer):
    parser = make(tokenizer)
    markers = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"]
    ids = {tokenizer.convert_tokens_to_ids(m) for m in markers}
    assert parser.marker_token_ids() == ids and ids <= set(tokenizer.all_special_ids)


def test_reasoning_end_and_content_ids_gate_the_grammar(tokenizer):
    parser = make(tokenizer)

    def encode(text):
        return tokenizer.encode(text, add_special_tokens=False)

    earlier_turn = ("<|start|>user<|message|>hi<|end|><|start|>assistant<|channel|>final<|message|>hello<|end|>"
                    "<|start|>user<|message|>2+2?<|end|><|start|>assistant")
    prompt = encode(earlier_turn)
    assert not parser.is_reasoning_end(prompt)  # the earlier turn's final message is over
    thinking = encode("<|channel|>analysis<|message|>Let me think")
    assert not parser.is_reasoning_end(prompt + thinking)
    opened = encode("<|channel|>analysis<|message|>Let me think<|end|><|start|>assistant<|channel|>final<|message|>")
    assert parser.is_reasoning_end(prompt + opened) and parser.content_token_ids(opened) == []
    answer = encode('{"n": 4}')
    assert parser.is_reasoning_end(prompt + opened + answer) and parser.content_token_ids(opened + answer) == answer
    preamble = encode("<|channel|>commentary<|message|>Checking.")  # content, but not the final answer
    assert not parser.is_reasoning_end(prompt + preamble)
    assert parser.content_token_ids(opened + answer + encode("<|return|>")) == []
    assert parser.is_reasoning_end(encode("<|start|>assistant<|channel|>final<|message|>"))


def test_reasoning_tokens_are_the_analysis_bodies(tokenizer):
    parser = make(tokenizer)
    bodies = ["Let me think... 2+2 is 4.", "print(1)", "Second thought, Café 😀"]
    text = (f"<|channel|>analysis<|message|>{bodies[0]}<|end|>"
            f"<|start|>assistant<|channel|>analysis to=python<|message|>{bodies[1]}<|call|>"
            "<|start|>assistant<|channel|>commentary<|message|>A preamble.<|end|>"
            f"<|start|>assistant<|channel|>analysis<|message|>{bodies[2]}<|end|>"
            '<|start|>assistant<|channel|>commentary to=functions.f json<|message|>{"a": 1}<|call|>'
            "<|start|>assistant<|channel|>final<|message|>Four.")
    expected = sum(len(tokenizer.encode(body, add_special_tokens=False)) for body in bodies)
    assert parser.count_reasoning_tokens(tokenizer.encode(text, add_special_tokens=False)) == expected


def test_a_vocabulary_without_the_markers_is_refused():
    with pytest.raises(ValueError, match=r"needs harmony's markers .* lacks <\|start\|>, <\|end\|>"):
        get_reasoning_parser(NAME)(build_tokenizer("bpe"))
