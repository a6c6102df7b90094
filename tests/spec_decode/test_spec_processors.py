"""Logits processors, penalties and structured outputs apply at every verified position: each
position sees the output extended by the drafts before it. With drafts forced from the plain
run's output (all of them, or random prefixes), a request gives the plain run's tokens and logprob
bits, and a greedy request accepts every draft of the "all" mode (a processor that did not see
the drafts would have chosen another token somewhere)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from kvserve import SamplingParams
from kvserve.structured_output.params import StructuredOutputsParams
from kvserve.testing.spec_decode import ForcedProposer, reference_drafts
from spec_helpers import NGRAM, copy_prompts, generate_checked, make_llm, results, spec_stats

PROMPTS = copy_prompts(4, seed=5)
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[a-z]{1,8}$"},
                                           "n": {"type": "integer"}},
          "required": ["name", "n"], "additionalProperties": False}
PROCESSED = {
    "penalties": dict(repetition_penalty=1.3, frequency_penalty=0.7, presence_penalty=0.4),
    "bad_words": dict(bad_words=["the", "and", "of"]),
    "min_tokens": dict(min_tokens=12, ignore_eos=False, stop_token_ids=[5, 6, 7, 8]),
    "logit_bias": dict(logit_bias={5: 3.0, 9: -100.0, 17: 2.5}),
    "allowed_token_ids": dict(allowed_token_ids=list(range(5, 60))),
    "json": dict(structured_outputs=StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True),
                 ignore_eos=False),
    "regex": dict(structured_outputs=StructuredOutputsParams(regex=r"[a-c]{2,5}-[0-9]{1,3}"), ignore_eos=False),
}


def params_for(case: str, temperature: float) -> SamplingParams:
    values = dict(temperature=temperature, max_tokens=20, ignore_eos=True, logprobs=1)
    values.update(PROCESSED[case])
    if temperature > 0:
        values["seed"] = 9
    return SamplingParams(**values)


@pytest.fixture(scope="module")
def engines(tiny_llama):
    return make_llm(tiny_llama), make_llm(tiny_llama, speculative_config=NGRAM)


@pytest.mark.parametrize("temperature", [0.0, 0.9], ids=["greedy", "seeded"])
@pytest.mark.parametrize("case", list(PROCESSED))
def test_processed_requests_equal_plain_with_forced_drafts(engines, case, temperature):
    plain_llm, llm = engines
    params = params_for(case, temperature)
    reference = results(plain_llm.generate(PROMPTS, params))
    mapping = {tuple(p): r[0][0] for p, r in zip(PROMPTS, reference)}
    for mode in ("all", "prefix"):
        before = spec_stats(llm)
        llm.llm_engine.core.proposer = ForcedProposer(reference_drafts(mapping, 4, mode, seed=3))
        got = generate_checked(llm, PROMPTS, params) if mode == "prefix" else llm.generate(PROMPTS, params)
        assert results(got) == reference, mode
        stats = spec_stats(llm).minus(before)
        assert stats.num_draft_tokens > 0
        if mode == "all":
            assert stats.num_accepted_tokens == stats.num_draft_tokens
    if case == "json":
        for r in reference:
            if r[0][2] == "stop":
                jsonschema.validate(json.loads(r[0][3]), SCHEMA)
