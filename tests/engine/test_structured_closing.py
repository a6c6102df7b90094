"""Structured outputs finish within ``max_tokens`` with the defaults: a random-weight model (which
never closes a string by itself) and the built-in model under every kind of JSON constraint end
with valid, schema-conforming JSON and ``finish_reason`` ``stop``; the steering starts only at the
end of the budget, so what comes before is the unsteered output token for token."""

from __future__ import annotations

import json

import jsonschema
import pytest

from kvserve import SamplingParams
from kvserve.structured_output.closing import LOOKAHEAD
from kvserve.structured_output.params import StructuredOutputsParams

BOOK = {"type": "object", "properties": {
    "title": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
    "meta": {"type": "object", "properties": {"pages": {"type": "integer"}}, "required": ["pages"]}},
    "required": ["title", "tags", "meta"], "additionalProperties": False}
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
CASES = {"book": (StructuredOutputsParams(json=BOOK), BOOK), "person": (StructuredOutputsParams(json=PERSON), PERSON),
         "object": (StructuredOutputsParams(json_object=True), {"type": "object"}),
         "list": (StructuredOutputsParams(json={"type": "array", "items": {"type": "string"}, "minItems": 1}),
                  {"type": "array", "minItems": 1})}


@pytest.fixture(scope="module")
def llm(tiny_llama):
    from kvserve import LLM

    return LLM(str(tiny_llama), max_model_len=256, dtype="float32")


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("max_tokens, temperature", [(60, 0.0), (90, 1.0)])  # the book needs 42 tokens at least
def test_random_weights_end_with_valid_json(llm, case, max_tokens, temperature):
    params, schema = CASES[case]
    sampling = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=1, structured_outputs=params)
    outputs = llm.generate([f"write {case} {i}" for i in range(3)], sampling)
    for output in outputs:
        (choice,) = output.outputs
        assert choice.finish_reason == "stop" and len(choice.token_ids) <= max_tokens, choice
        jsonschema.validate(json.loads(choice.text), schema)


def test_the_output_is_unsteered_until_the_end_of_its_budget(llm):
    params = StructuredOutputsParams(json=PERSON)
    short, long = (llm.generate("a person", SamplingParams(max_tokens=n, temperature=0, structured_outputs=params,
                                                           logprobs=1))[0].outputs[0] for n in (100, 200))
    free = 100 - LOOKAHEAD
    assert short.token_ids[:free] == long.token_ids[:free]
    assert [lp.logprob for lp in short.logprobs[:free]] == [lp.logprob for lp in long.logprobs[:free]]
    assert short.token_ids != long.token_ids[:len(short.token_ids)]  # steered at the end: closed early
    # the forced tokens keep the grammar-masked model's logprobs (the steering is not in them)
    assert all(lp.logprob < 0 or lp.rank == 1 for lp in short.logprobs)


def test_ignore_eos_is_never_steered(llm):
    params = StructuredOutputsParams(json=PERSON)
    steered = SamplingParams(max_tokens=60, temperature=0, structured_outputs=params)
    plain = SamplingParams(max_tokens=60, temperature=0, structured_outputs=params, ignore_eos=True)
    a, b = (llm.generate("a person", p)[0].outputs[0] for p in (steered, plain))
    assert a.finish_reason == "stop" and b.finish_reason == "length" and len(b.token_ids) == 60
