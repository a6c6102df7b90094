"""Both grammar backends on the three test tokenizers: what random walks through the allowed
tokens produce is checked by independent references (``json`` + ``jsonschema``, the ``regex``
module with partial matching for prefixes, ``lark`` for the grammar), and the matcher API."""

from __future__ import annotations

import json

import jsonschema
import lark
import pytest
import regex

from kvserve.structured_output import StructuredOutputError, StructuredOutputsParams

from kvserve.testing.grammar_walk import allowed_ids, random_walk

KINDS = ("bpe", "sentencepiece", "tekken")
BACKENDS = ("xgrammar", "guidance")
WALKS = 6

TOOL_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "São Paulo", "東京", 'say "hi"']},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "code": {"type": "string", "pattern": "^[a-z]{2,4}$"},
        "flags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
    },
    "required": ["city", "unit", "days", "code"],
    "additionalProperties": False,
}
REGEX = r"(\+|-)?[0-9]{1,3}(\.[0-9]{1,2})? ?(°C|°F|K)"
CHOICES = ("positive", "negative", "neutral", "ça va", 'a"b\\c')
GBNF = """root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= [0-9]+ | "(" expr ")"
"""
LARK_REFERENCE = lark.Lark(r"""
start: expr
expr: term (("+"|"-") term)*
term: factor (("*"|"/") factor)*
factor: /[0-9]+/ | "(" expr ")"
""", parser="earley")


def _decode(backend, tokens):
    return backend.tokenizer.decode(tokens, skip_special_tokens=False)


def _walks(backend, params):
    compiled = backend.compile(params)
    big = backend.vocab_size > 100_000  # Tekken: fewer, shorter walks keep the test quick
    walks, steps = (WALKS // 2, 80) if big else (WALKS, 120)
    return [random_walk(backend, compiled, seed, steps) for seed in range(walks)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", BACKENDS)
def test_json_schema_walks_validate(backend_for, kind, name):
    backend = backend_for(kind, name)
    walks = _walks(backend, StructuredOutputsParams(json=TOOL_SCHEMA, disable_any_whitespace=True))
    finished = [_decode(backend, tokens) for tokens, done in walks if done]
    assert len(finished) >= 2
    for text in finished:
        jsonschema.validate(json.loads(text), TOOL_SCHEMA)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", BACKENDS)
def test_json_object_walks_parse_as_objects(backend_for, kind, name):
    backend = backend_for(kind, name)
    walks = _walks(backend, StructuredOutputsParams(json_object=True, disable_any_whitespace=True))
    finished = [_decode(backend, tokens) for tokens, done in walks if done]
    assert finished
    for text in finished:
        assert isinstance(json.loads(text), dict)


def _valid_regex_prefix(text: str) -> bool:
    text = text.rstrip("\ufffd")  # a multi-byte character cut by the walk
    return regex.fullmatch(REGEX, text, partial=True) is not None


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", BACKENDS)
def test_regex_walks_are_prefixes_and_match_when_done(backend_for, kind, name):
    backend = backend_for(kind, name)
    walks = _walks(backend, StructuredOutputsParams(regex=REGEX))
    assert any(done for _, done in walks)
    for tokens, done in walks:
        text = _decode(backend, tokens)
        if done:
            assert regex.fullmatch(REGEX, text), text
        else:
            assert _valid_regex_prefix(text), text


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", BACKENDS)
def test_choice_walks_end_on_a_choice(backend_for, kind, name):
    backend = backend_for(kind, name)
    walks = _walks(backend, StructuredOutputsParams(choice=list(CHOICES)))
    for tokens, done in walks:
        text = _decode(backend, tokens)
        assert done, text
        assert text in CHOICES


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", BACKENDS)
def test_gbnf_grammar_walks_parse_with_lark(backend_for, kind, name):
    backend = backend_for(kind, name)
    walks = _walks(backend, StructuredOutputsParams(grammar=GBNF))
    finished = [_decode(backend, tokens) for tokens, done in walks if done]
    assert finished
    for text in finished:
        LARK_REFERENCE.parse(text)


@pytest.mark.parametrize("name", BACKENDS)
def test_lark_grammar_is_accepted(backend_for, name):
    backend = backend_for("bpe", name)
    grammar = 'start: "yes" | "no" | "maybe " NUMBER\nNUMBER: /[0-9]+/\n'
    for tokens, done in _walks(backend, StructuredOutputsParams(grammar=grammar)):
        text = _decode(backend, tokens)
        assert regex.fullmatch(r"yes|no|maybe [0-9]+", text) if done else regex.fullmatch(
            r"yes|no|maybe [0-9]+", text, partial=True), text


@pytest.mark.parametrize("name", BACKENDS)
def test_eos_only_where_the_grammar_may_end(backend_for, name):
    backend = backend_for("bpe", name)
    tokenizer = backend.tokenizer
    grammar = backend.compile(StructuredOutputsParams(choice=["positive", "negative"])).new_grammar()
    bitmask = backend.allocate_token_bitmask(2)
    eos = set(backend.stop_token_ids)
    ids = tokenizer.encode("positive", add_special_tokens=False)
    for token in ids:
        backend.fill_bitmasks([(grammar, 1)], bitmask)
        allowed = set(allowed_ids(bitmask, 1, backend.vocab_size))
        assert token in allowed and not allowed & eos
        assert grammar.accept_tokens([token])
    backend.fill_bitmasks([(grammar, 1)], bitmask)
    assert set(allowed_ids(bitmask, 1, backend.vocab_size)) == eos
    assert allowed_ids(bitmask, 0, backend.vocab_size) == list(range(backend.vocab_size))
    assert not grammar.is_terminated()
    assert grammar.accept_tokens([backend.stop_token_ids[0]]) and grammar.is_terminated()


@pytest.mark.parametrize("name", BACKENDS)
def test_padding_rows_beyond_the_tokenizer_are_never_allowed(name):
    from kvserve.structured_output import StructuredOutputsConfig, create_backend
    from kvserve.testing import build_tokenizer

    tokenizer = build_tokenizer("bpe")
    vocab = len(tokenizer) + 70  # e.g. Qwen2.5: 151,665 tokens, 151,936 logits
    backend = create_backend(tokenizer, vocab, [1], StructuredOutputsConfig(backend=name))
    assert backend.allocate_token_bitmask(1).shape == (1, (vocab + 31) // 32)
    grammar = backend.compile(StructuredOutputsParams(json_object=True)).new_grammar()
    bitmask = backend.allocate_token_bitmask(1)
    backend.fill_bitmasks([(grammar, 0)], bitmask)
    grammar.accept_tokens(tokenizer.encode('{"a', add_special_tokens=False))
    backend.fill_bitmasks([(grammar, 0)], bitmask)
    allowed = allowed_ids(bitmask, 0, vocab)
    assert allowed and max(allowed) < len(tokenizer)


@pytest.mark.parametrize("name", BACKENDS)
def test_accept_validate_rollback_reset(backend_for, name):
    backend = backend_for("bpe", name)
    tokenizer = backend.tokenizer
    compiled = backend.compile(StructuredOutputsParams(regex="[a-z]+ [0-9]+"))
    good = tokenizer.encode("hello 42", add_special_tokens=False)
    bad = tokenizer.encode("hello x", add_special_tokens=False)
    grammar = compiled.new_grammar()
    assert grammar.validate_tokens(good) == good and grammar.num_processed_tokens == 0
    assert grammar.validate_tokens(bad) == bad[: len(grammar.validate_tokens(bad))]
    assert len(grammar.validate_tokens(bad)) < len(bad)
    assert grammar.accept_tokens(good) and grammar.num_processed_tokens == len(good)
    grammar.rollback(2)
    assert grammar.num_processed_tokens == len(good) - 2
    assert grammar.accept_tokens(good[-2:])
    assert grammar.accept_tokens([backend.stop_token_ids[0]]) and grammar.is_terminated()
    grammar.rollback(1)  # the EOS
    assert not grammar.is_terminated() and grammar.accept_tokens([backend.stop_token_ids[0]])
    grammar.reset()
    assert grammar.num_processed_tokens == 0 and not grammar.is_terminated()
    assert not grammar.accept_tokens(tokenizer.encode("42", add_special_tokens=False)[:1])


REJECTED = [
    (StructuredOutputsParams(json={"type": "objekt"}), "invalid JSON schema"),
    (StructuredOutputsParams(json={"type": "object", "properties": {"a": {"minimum": "x"}}}),
     "invalid JSON schema"),
    (StructuredOutputsParams(regex="([a-z"), "regex"),
    (StructuredOutputsParams(grammar="root ::= ( undefined_rule"), "grammar"),
    (StructuredOutputsParams(json='{"type": "object"', source="guided_json"), "not valid JSON"),
]


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("params,words", REJECTED, ids=["type", "keyword", "regex", "gbnf", "text"])
def test_rejected_specs_are_400s_naming_the_field(backend_for, name, params, words):
    backend = backend_for("bpe", name)
    with pytest.raises(StructuredOutputError) as info:
        backend.compile(params)
    assert info.value.param == params.source
    assert words in info.value.message
    assert info.value.message.startswith(params.source + ":")


def test_xgrammar_refuses_keywords_it_would_ignore_and_auto_routes_them(backend_for):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 5},
                                               "s": {"type": "string", "maxLength": 3}},
              "required": ["n", "s"], "additionalProperties": False}
    params = StructuredOutputsParams(json=schema, disable_any_whitespace=True)
    with pytest.raises(StructuredOutputError) as info:
        backend_for("bpe", "xgrammar").compile(params)
    assert "maxLength" in info.value.message and "multipleOf" in info.value.message
    auto = backend_for("bpe", "auto")
    for tokens, done in _walks(auto, params):
        if done:
            value = json.loads(_decode(auto, tokens))
            jsonschema.validate(value, schema)


@pytest.mark.parametrize("name", BACKENDS)
def test_structural_tag_legacy_format(backend_for, name):
    backend = backend_for("bpe", name)
    tag = {
        "type": "structural_tag",
        "structures": [{"begin": "call[", "schema": {"type": "object", "properties": {
            "x": {"type": "integer"}}, "required": ["x"]}, "end": "]"}],
        "triggers": ["call["],
    }
    compiled = backend.compile(StructuredOutputsParams(structural_tag=json.dumps(tag)))
    grammar = compiled.new_grammar()
    text = 'hi call[{"x": 1}] bye'
    for token in backend.tokenizer.encode(text, add_special_tokens=False):
        assert grammar.accept_tokens([token]), text


@pytest.mark.parametrize("name", BACKENDS)
def test_disable_any_whitespace_gives_compact_json(backend_for, name):
    backend = backend_for("bpe", name)
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]}
    compiled = backend.compile(StructuredOutputsParams(json=schema, disable_any_whitespace=True))
    grammar = compiled.new_grammar()
    spaced = backend.tokenizer.encode('{ "a":true}', add_special_tokens=False)
    assert len(grammar.validate_tokens(spaced)) < len(spaced)


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("spec", ["json_schema", "json_object"])
def test_json_whitespace_is_bounded_by_default(backend_for, name, spec):
    """llama.cpp's rule between JSON tokens: nothing, one space, or a newline and up to
    MAX_JSON_WHITESPACE spaces or tabs (pretty printing); anything more is not allowed, so a weak
    model cannot write newlines until max_tokens."""
    from kvserve.structured_output.config import MAX_JSON_WHITESPACE

    backend = backend_for("bpe", name)
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]}
    params = StructuredOutputsParams(json=schema) if spec == "json_schema" else StructuredOutputsParams(json_object=True)
    compiled = backend.compile(params)
    tokenizer = backend.tokenizer
    for run, allowed in (("", True), (" ", True), ("\n" + " " * MAX_JSON_WHITESPACE, True), ("\n\t\t", True),
                         ("\n" + " " * (MAX_JSON_WHITESPACE + 1), False), ("\n\n", False), ("  ", False),
                         ("\r\n", False), ("\t", False)):
        text = '{"a":' + run + "true" + run + "}"
        ids = tokenizer.encode(text, add_special_tokens=False)
        grammar = compiled.new_grammar()
        assert (len(grammar.validate_tokens(ids)) == len(ids)) == allowed, (repr(run), name)


@pytest.mark.parametrize("name", BACKENDS)
def test_a_spec_over_the_size_limit_is_refused(backend_for, name):
    backend = backend_for("bpe", name, max_spec_bytes=200)
    schema = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(40)}}
    with pytest.raises(StructuredOutputError) as info:
        backend.compile(StructuredOutputsParams(json=schema, source="response_format"))
    assert info.value.param == "response_format"
    assert "the limit is 200" in info.value.message


def test_auto_without_xgrammar_sends_every_spec_to_llguidance(monkeypatch):
    """A base install (``pip install kvserve``: no xgrammar, whose package requires triton) still
    constrains: ``auto`` compiles with llguidance; asking for xgrammar by name is a 400."""
    import kvserve.structured_output.backend_auto as backend_auto
    from kvserve.structured_output import StructuredOutputsConfig, create_backend
    from kvserve.structured_output.backend_guidance import GuidanceGrammar
    from kvserve.testing import build_tokenizer
    from kvserve.testing.tokenizer_kinds import tokenizer_spec

    monkeypatch.setattr(backend_auto, "xgrammar_installed", lambda: False)
    spec = tokenizer_spec("bpe")
    auto = create_backend(build_tokenizer("bpe"), spec.vocab_size, spec.generation_eos_token_ids,
                          StructuredOutputsConfig(backend="auto"))
    assert auto.xgrammar is None
    params = StructuredOutputsParams(json=TOOL_SCHEMA, disable_any_whitespace=True)
    assert isinstance(auto.compile(params).new_grammar(), GuidanceGrammar)
    for tokens, done in _walks(auto, params):
        if done:
            jsonschema.validate(json.loads(_decode(auto, tokens)), TOOL_SCHEMA)
    with pytest.raises(StructuredOutputError, match="'xgrammar' is not installed"):
        auto.compile(StructuredOutputsParams(json=TOOL_SCHEMA, backend="xgrammar"))


def test_the_xgrammar_backend_asked_for_without_xgrammar_is_refused_at_start(monkeypatch):
    import importlib.util

    from kvserve.errors import ConfigError
    from kvserve.structured_output import StructuredOutputsConfig
    from kvserve.structured_output.manager import StructuredOutputManager
    from kvserve.testing import build_tokenizer

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "xgrammar" else real(name, *a))
    with pytest.raises(ConfigError, match="backend 'xgrammar' needs the xgrammar package"):
        StructuredOutputManager(build_tokenizer("bpe"), 1024, [1], StructuredOutputsConfig(backend="xgrammar"))
    StructuredOutputManager(build_tokenizer("bpe"), 1024, [1], StructuredOutputsConfig(backend="auto"), build_now=False)


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("schema,words", [
    ({"$ref": "http://example.invalid/x.json"}, "points outside the schema"),
    ({"type": "object", "properties": {"a": {"$ref": "other.json#/x"}}}, "points outside the schema"),
    ({"$ref": "#"}, "no finite instance"),
    ({"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}, "no finite instance"),
    ({"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}, "minItems": 1}}, "$ref": "#/$defs/n"},
     "no finite instance"),
], ids=["remote", "remote-file", "self", "required-self", "non-empty-list-of-self"])
def test_schemas_no_backend_can_enforce_are_400s(backend_for, name, schema, words):
    with pytest.raises(StructuredOutputError, match=words):
        backend_for("bpe", name).compile(StructuredOutputsParams(json=schema))


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": {"$ref": "#"}}},
    {"$defs": {"n": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
                     "required": ["kids"]}}, "$ref": "#/$defs/n"},
    {"$defs": {"e": {"anyOf": [{"type": "integer"}, {"type": "object", "properties": {"l": {"$ref": "#/$defs/e"}},
                                                     "required": ["l"]}]}}, "$ref": "#/$defs/e"},
    {"$defs": {"x": {"$anchor": "foo", "type": "string"}}, "type": "object", "properties": {"a": {"$ref": "#foo"}},
     "required": ["a"]},
], ids=["optional-self", "tree", "expression", "anchor"])
def test_recursive_schemas_with_a_base_case_compile(backend_for, name, schema):
    backend_for("bpe", name).compile(StructuredOutputsParams(json=schema))
