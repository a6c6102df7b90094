"""deepseek_r1 and qwen3 reasoning parsers on outputs written from the models' documented formats
(DeepSeek-R1 and Qwen3 model cards and chat templates), whole and streamed at every split, token
by token with a BPE tokenizer that has <think>/</think> as special tokens, and the token-id
checks that gate structured outputs."""

from __future__ import annotations

import random

import pytest
from reasoning_streams import stream
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from kvserve.reasoning import get_reasoning_parser
from kvserve.testing import build_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    base = build_tokenizer("bpe")
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(base.backend_tokenizer.to_str()),
                                  eos_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    return tok


R1 = "deepseek_r1"
QWEN3 = "qwen3"
# (parser, chat_template_kwargs, output, reasoning_content, content)
CASES = [
    (R1, None, "<think>\nThe user wants 2+2. That is 4.\n</think>\n\nThe answer is **4**.",
     "\nThe user wants 2+2. That is 4.\n", "\n\nThe answer is **4**."),
    (R1, None, "Okay, the template opened the block.</think>Paris est la capitale. 東京?",
     "Okay, the template opened the block.", "Paris est la capitale. 東京?"),
    (R1, None, "<think>Still thinking when max_tokens hit </thi", "Still thinking when max_tokens hit </thi",
     None),
    (R1, None, "<think></think>No thought.", None, "No thought."),
    (QWEN3, None, "<think>\nLet me think about <tags> and </ things.\n</think>\n\nDone 😀",
     "\nLet me think about <tags> and </ things.\n", "\n\nDone 😀"),
    (QWEN3, {"enable_thinking": True}, "thinking only", "thinking only", None),
    (QWEN3, {"enable_thinking": False}, "Just the answer.", None, "Just the answer."),
    (QWEN3, {"enable_thinking": False}, "<think>x</think>y", None, "<think>x</think>y"),
    (R1, {"enable_thinking": False}, "r</think>c", "r", "c"),
]


def make(name, tokenizer, kwargs):
    return get_reasoning_parser(name)(tokenizer, chat_template_kwargs=kwargs)


@pytest.mark.parametrize("name,kwargs,text,reasoning,content", CASES)
def test_whole_output(tokenizer, name, kwargs, text, reasoning, content):
    assert make(name, tokenizer, kwargs).extract_reasoning(text) == (reasoning, content)


@pytest.mark.parametrize("name,kwargs,text,reasoning,content", CASES)
def test_every_split_streams_the_whole_split(tokenizer, name, kwargs, text, reasoning, content):
    expected = (reasoning or "", content or "")
    for cut in range(len(text) + 1):
        assert stream(make(name, tokenizer, kwargs), [text[:cut], text[cut:]]) == expected, cut
    for seed in range(100):
        rng = random.Random(seed)
        cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(1, 10))))
        pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
        assert stream(make(name, tokenizer, kwargs), pieces) == expected, pieces


@pytest.mark.parametrize("name,kwargs,text,reasoning,content", CASES[:5])
def test_token_by_token(tokenizer, name, kwargs, text, reasoning, content):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.convert_tokens_to_ids("</think>") in ids or "</think>" not in text
    pieces, sent = [], ""
    for k in range(1, len(ids) + 1):
        decoded = tokenizer.decode(ids[:k], skip_special_tokens=False)
        if decoded.endswith("\ufffd") and k < len(ids):
            continue
        pieces.append(decoded[len(sent):])
        sent = decoded
    assert "".join(pieces) == text
    assert stream(make(name, tokenizer, kwargs), pieces) == (reasoning or "", content or "")


def test_reasoning_end_from_token_ids(tokenizer):
    parser = make(QWEN3, tokenizer, None)
    encode = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    opened = encode("<|im_start|>assistant\n<think>\n")
    closed = encode("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not parser.is_reasoning_end(opened) and parser.is_reasoning_end(closed)
    assert not parser.is_reasoning_end(encode("no tags at all"))
    history = encode("<think>old</think>answer<|im_start|>assistant\n<think>\n")
    assert not parser.is_reasoning_end(history)
    output = encode("I should answer in JSON.</think>{\"a\": 1}")
    assert parser.is_reasoning_end(opened + output)
    assert tokenizer.decode(parser.content_token_ids(opened + output)) == '{"a": 1}'
    assert parser.content_token_ids(opened + encode("still thinking")) == []
    off = make(QWEN3, tokenizer, {"enable_thinking": False})
    assert off.is_reasoning_end([]) and off.content_token_ids([5, 6]) == [5, 6]
    assert not make(R1, tokenizer, {"enable_thinking": False}).is_reasoning_end(opened)


def test_reasoning_token_count_as_vllm(tokenizer):
    """vLLM's BaseThinkingReasoningParser.count_reasoning_tokens: tokens between the first <think>
    (or the start) and the first </think> (or the end), tags excluded."""
    encode = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    thought, answer = encode("2+2 is 4, so"), encode(" four")
    think, end = encode("<think>"), encode("</think>")
    parser = make(QWEN3, tokenizer, None)
    assert parser.count_reasoning_tokens(think + thought + end + answer) == len(thought)
    assert parser.count_reasoning_tokens(thought + end + answer) == len(thought)
    assert parser.count_reasoning_tokens(thought) == len(thought)  # cut while thinking
    assert make(QWEN3, tokenizer, {"enable_thinking": False}).count_reasoning_tokens(thought + end) == 0


def test_a_vocabulary_without_think_tokens_is_a_configuration_error():
    plain = build_tokenizer("bpe")
    with pytest.raises(ValueError, match="needs <think> and </think>"):
        make(R1, plain, None)
    assert make(QWEN3, plain, {"enable_thinking": False}).extract_reasoning("a") == (None, "a")
    with pytest.raises(ValueError, match="allowed: deepseek_r1, openai_gptoss, qwen3"):
        get_reasoning_parser("r1")
