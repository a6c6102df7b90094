"""Structured outputs through the whole engine on random-weight models: sampled at temperature 1,
every output that finishes on its own (``stop``) satisfies its constraint, checked by an
independent parser (json + jsonschema, re.fullmatch, the choices, lark); and a constrained request
gives the same tokens and logprob bits alone, in a busy batch, under preemption and from the
prefix cache."""

from __future__ import annotations

import json
import re

import jsonschema
import lark
import pytest

from kvserve import LLM, SamplingParams
from kvserve.errors import InvalidRequestError
from kvserve.structured_output.params import StructuredOutputsParams
from engine_helpers import assert_kv_clean, random_prompts

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "pattern": "^[a-z]{1,8}$"}, "n": {"type": "integer"},
                   "ok": {"type": "boolean"}, "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
    "required": ["name", "n"],
    "additionalProperties": False,
}
REGEX = r"[a-c]{2,5}-[0-9]{1,3}"
CHOICES = ("alpha", "beta", "gamma delta")
GBNF = 'root ::= item (", " item)*\nitem ::= "x" | "y" [0-9]'
LARK = 'start: item (", " item)*\nitem: "x" | "y" /[0-9]/'


def valid_json_schema(text: str) -> bool:
    try:
        jsonschema.validate(json.loads(text), SCHEMA)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


def valid_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False


def valid_grammar(text: str, parser=lark.Lark(LARK, parser="lalr")) -> bool:
    try:
        parser.parse(text)
    except lark.exceptions.LarkError:
        return False
    return True


CASES = {
    "json": (StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True), valid_json_schema),
    "json_object": (StructuredOutputsParams(json_object=True, disable_any_whitespace=True), valid_json_object),
    "regex": (StructuredOutputsParams(regex=REGEX), lambda text: re.fullmatch(REGEX, text) is not None),
    "choice": (StructuredOutputsParams(choice=CHOICES), lambda text: text in CHOICES),
    "grammar": (StructuredOutputsParams(grammar=GBNF), valid_grammar),
}


@pytest.fixture(scope="module", params=["bpe", "sentencepiece", "tekken"])
def llm(request, checkpoint_factory):
    return LLM(str(checkpoint_factory("LlamaForCausalLM", request.param)), dtype="float32", max_model_len=256,
               num_gpu_blocks_override=256, seed=0)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_finished_output_satisfies_its_constraint(llm, case):
    spec, valid = CASES[case]
    params = SamplingParams(n=50, temperature=1.0, seed=11, max_tokens=64, structured_outputs=spec,
                            skip_special_tokens=True)
    outputs = llm.generate(["Tell me something"], params)[0].outputs
    finished = [o.text for o in outputs if o.finish_reason == "stop"]
    assert len(finished) >= 45, f"only {len(finished)} of 50 {case} outputs finished within 64 tokens"
    bad = [text for text in finished if not valid(text)]
    assert not bad, f"{case} outputs that break the constraint: {bad[:3]}"
    assert_kv_clean(llm)


def results(outputs):
    return [(o.outputs[0].token_ids, [lp.logprob for lp in o.outputs[0].logprobs], o.outputs[0].finish_reason)
            for o in outputs]


@pytest.mark.slow
@pytest.mark.parametrize("engine_kwargs", [
    pytest.param({}, id="busy-batch"),
    pytest.param({"num_gpu_blocks_override": 14, "block_size": 4}, id="preemption"),
    pytest.param({"max_num_batched_tokens": 8}, id="chunked-prefill"),
], )
def test_constrained_outputs_equal_solo(checkpoint_factory, engine_kwargs):
    """Seeded, constrained requests beside unconstrained ones: each equals its solo run."""
    model = str(checkpoint_factory("LlamaForCausalLM", "bpe"))
    prompts = random_prompts(6, seed=3, min_len=5, max_len=30)
    specs = [CASES[name][0] for name in ("json", "regex", "choice", "grammar")] + [None, None]
    params = [SamplingParams(temperature=1.0, seed=20 + i, max_tokens=24, logprobs=0, structured_outputs=spec)
              for i, spec in enumerate(specs)]
    solo_llm = LLM(model, dtype="float32", max_model_len=256, num_gpu_blocks_override=256)
    solo = [results(solo_llm.generate([prompt], p))[0] for prompt, p in zip(prompts, params)]
    llm = LLM(model, dtype="float32", max_model_len=256, **{"num_gpu_blocks_override": 256, **engine_kwargs})
    assert results(llm.generate(prompts, params)) == solo
    assert results(llm.generate(prompts, params)) == solo  # again: prefix-cache hits
    if "block_size" in engine_kwargs:
        assert llm.llm_engine.core.scheduler.num_preemptions > 0
    assert_kv_clean(llm)


def test_a_spec_the_backend_refuses_is_a_400_and_the_engine_goes_on(checkpoint_factory):
    llm = LLM(str(checkpoint_factory("LlamaForCausalLM", "bpe")), dtype="float32", max_model_len=256,
              num_gpu_blocks_override=64)
    for spec, message in (
        (StructuredOutputsParams(json={"type": "object", "properties": {"a": {"type": "nonsense"}}}), "schema"),
        (StructuredOutputsParams(regex="(unclosed"), "regex"),
        (StructuredOutputsParams(grammar="root ::= missing_rule"), "grammar"),
    ):
        with pytest.raises(InvalidRequestError) as info:
            llm.generate(["x"], SamplingParams(max_tokens=4, structured_outputs=spec))
        assert info.value.param == "structured_outputs" and message in str(info.value).lower()
    out = llm.generate(["x"], SamplingParams(max_tokens=4, ignore_eos=True))[0]
    assert len(out.outputs[0].token_ids) == 4
    assert_kv_clean(llm)


def test_constraints_that_leave_no_token_end_those_requests_alone(checkpoint_factory):
    """A grammar that allows none of ``allowed_token_ids`` empties the row while sampling: each
    such request ends with the client's error (no token emitted; HTTP 400 over the API), a request
    beside them gives its solo tokens and logprob bits, and the engine goes on, also when six of
    them (more than the runner's limit on requests failing alone) fill a step by themselves
    (four of them used to stop the engine)."""
    llm = LLM(str(checkpoint_factory("LlamaForCausalLM", "bpe")), dtype="float32", max_model_len=256,
              num_gpu_blocks_override=256)
    eos = min(llm.llm_engine.eos_token_ids)
    prompts = random_prompts(7, seed=8, min_len=4, max_len=12)
    contradictory = [SamplingParams(temperature=t, seed=i, max_tokens=8, allowed_token_ids=[eos],
                                    structured_outputs=StructuredOutputsParams(choice=list(CHOICES)))
                     for i, t in enumerate([0.0, 1.0] * 3)]
    fine = SamplingParams(temperature=1.0, seed=5, max_tokens=8, logprobs=0, ignore_eos=True)
    solo = results(llm.generate([prompts[6]], fine))
    outputs = llm.generate(prompts, contradictory + [fine])
    for out in outputs[:6]:
        assert out.client_error and "no token can be generated" in out.error
        assert out.outputs[0].finish_reason == "error" and out.outputs[0].token_ids == []
    assert results(outputs[6:]) == solo
    alone = llm.generate(prompts[:6], contradictory)
    assert all(out.client_error for out in alone)
    assert results(llm.generate([prompts[6]], fine)) == solo
    assert_kv_clean(llm)
