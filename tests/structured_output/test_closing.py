"""Finishing within ``max_tokens`` (``kvserve.structured_output.closing``): from states a weak
model leaves (inside a string value, an array, an object missing required keys), the plan is a
way out the grammar allows, and what it writes parses and validates (``json`` + ``jsonschema``);
the matcher is left as it was."""

from __future__ import annotations

import json

import jsonschema
import pytest

from kvserve.structured_output import StructuredOutputsParams
from kvserve.structured_output.closing import SLACK, CLOSING_CHARACTERS, closing_alphabet, closing_plan, closing_token

BOOK = {"type": "object", "properties": {
    "title": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
    "meta": {"type": "object", "properties": {"pages": {"type": "integer"}}, "required": ["pages"]},
    "answer": {"enum": ["yes", "no"]}}, "required": ["title", "tags", "meta"], "additionalProperties": False}
PREFIXES = ['{"title": "a long title that goes on and on', '{"title": "t", "tags": ["x", "y',
            '{"title": "t", "tags": [', '{"title": "t", "tags": [], "meta": {', '{"title": "t", "tags": [], "meta": {"pages": 1}, "answer": "y',
            '{\n  "title": "t",\n  "tags": ["a"],\n  "meta": {"pages": 12']


def tokens_inside_a_text(tokenizer, text: str) -> list[int]:
    """``text``'s tokens as a model writes them after other text (SentencePiece puts a space
    before a text's first word when it encodes the text alone)."""
    anchor = tokenizer.encode("x", add_special_tokens=False)
    ids = tokenizer.encode("x" + text, add_special_tokens=False)
    assert ids[:len(anchor)] == anchor and tokenizer.decode(ids) == "x" + text
    return ids[len(anchor):]


@pytest.mark.parametrize("kind", ["bpe", "sentencepiece", "tekken"])
@pytest.mark.parametrize("name", ["xgrammar", "guidance"])
@pytest.mark.parametrize("prefix", PREFIXES)
def test_plans_finish_valid_json(backend_for, kind, name, prefix):
    backend = backend_for(kind, name)
    grammar = backend.compile(StructuredOutputsParams(json=BOOK)).new_grammar()
    ids = tokens_inside_a_text(backend.tokenizer, prefix)
    assert grammar.accept_tokens(ids), prefix
    alphabet = closing_alphabet(backend.tokenizer)
    plan = closing_plan(grammar, alphabet, backend.stop_token_ids)
    assert plan is not None and plan[-1] in backend.stop_token_ids
    assert grammar.num_processed_tokens == len(ids) and not grammar.is_terminated()  # left as it was
    assert grammar.accept_tokens(plan) and grammar.is_terminated()
    text = backend.tokenizer.decode(ids + plan[:-1], skip_special_tokens=True)
    jsonschema.validate(json.loads(text), BOOK)
    assert len(plan) <= 40  # e.g. ","tags":[""],"meta":{"pages":0}} and the stop token


@pytest.mark.parametrize("name", ["xgrammar", "guidance"])
def test_the_shortest_way_is_found_when_it_is_short(backend_for, name):
    backend = backend_for("bpe", name)
    tokenizer = backend.tokenizer
    for params, prefix, rest in ((StructuredOutputsParams(json_object=True), "{", "}"),
                                 (StructuredOutputsParams(json_object=True), '{"a": "text', '"}'),
                                 (StructuredOutputsParams(json={"type": "array"}), "[1, [2", "]]")):
        grammar = backend.compile(params).new_grammar()
        assert grammar.accept_tokens(tokenizer.encode(prefix, add_special_tokens=False))
        plan = closing_plan(grammar, closing_alphabet(tokenizer), backend.stop_token_ids)
        assert tokenizer.decode(plan[:-1]) == rest


@pytest.mark.parametrize("kind", ["bpe", "sentencepiece", "tekken"])
def test_the_alphabet_is_single_character_tokens(backend_for, kind):
    """Each token writes its character and nothing else after other text: SentencePiece encodes
    ``"}"`` alone as ``"▁}"`` (a space and the brace after other text), which is not taken."""
    tokenizer = backend_for(kind, "xgrammar").tokenizer
    alphabet = closing_alphabet(tokenizer)
    anchor = tokenizer.encode("x", add_special_tokens=False)
    written = [tokenizer.decode([*anchor, t])[len(tokenizer.decode(anchor)):] for t in alphabet]
    assert "".join(written) == CLOSING_CHARACTERS  # every character, in order, one token each


@pytest.mark.parametrize("prefix", PREFIXES)
def test_the_closing_token_comes_once_the_budget_needs_the_plan(backend_for, prefix):
    """``closing_token`` gives the plan's first token exactly when no more than its length plus
    ``SLACK`` tokens remain, and None before; the matcher is left as it was."""
    backend = backend_for("bpe", "xgrammar")
    grammar = backend.compile(StructuredOutputsParams(json=BOOK)).new_grammar()
    ids = tokens_inside_a_text(backend.tokenizer, prefix)
    assert grammar.accept_tokens(ids)
    alphabet = closing_alphabet(backend.tokenizer)
    plan = closing_plan(grammar, alphabet, backend.stop_token_ids)
    tokens = [closing_token(grammar, alphabet, backend.stop_token_ids, remaining) for remaining in range(1, 65)]
    assert tokens == [plan[0] if remaining <= len(plan) + SLACK else None for remaining in range(1, 65)]
    assert grammar.num_processed_tokens == len(ids) and not grammar.is_terminated()
