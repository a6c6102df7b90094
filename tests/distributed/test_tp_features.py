"""Engine features under tensor parallelism, TP 2 against TP 1 on the same checkpoint and flags:

- chunked prefill (``max_num_batched_tokens=8`` splits every prompt into chunks): the same greedy
  tokens, and sampled / prompt logprobs within 1e-5;
- structured outputs (a JSON schema and a regex, greedy and seeded sampling, in one batch with an
  unconstrained request): the same text and tokens. Rank 0 applies the grammar bitmask to the
  gathered logits, so the other ranks never see a grammar.
"""

from __future__ import annotations

import re

import pytest

from kvserve import SamplingParams
from kvserve.engine.llm import LLM
from kvserve.structured_output.params import StructuredOutputsParams

COMMON = dict(max_model_len=256, block_size=16, seed=0, dtype="float32", dist_timeout=60.0,
              num_gpu_blocks_override=64, max_num_batched_tokens=8)
PROMPTS = [[5, 17, 29, 41, 53, 65, 77, 89, 101, 113, 125, 137, 149, 161, 173, 185, 197, 209, 221],
           [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17], [300, 200, 100, 50, 25, 12, 6, 3, 400]]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[a-z]{1,6}$"},
                                           "n": {"type": "integer"}},
          "required": ["name", "n"], "additionalProperties": False}
REGEX = r"[a-c]{2,5}-[0-9]{1,3}"


@pytest.fixture(scope="module")
def engines(tiny_llama):
    """(TP 1, TP 2) with chunked prefill of 8 tokens per step."""
    reference = LLM(str(tiny_llama), tensor_parallel_size=1, **COMMON)
    sharded = LLM(str(tiny_llama), tensor_parallel_size=2, **COMMON)
    yield reference, sharded
    sharded.shutdown()


def run(llm: LLM, prompts, params) -> list[tuple[list[int], list[float], str, list[float]]]:
    outputs = llm.generate(prompts, params)
    return [(o.outputs[0].token_ids, [lp.logprob for lp in o.outputs[0].logprobs], o.outputs[0].text,
             [lp.logprob for lp in (o.prompt_logprobs or [])[1:]]) for o in outputs]


def assert_same(got, want) -> None:
    for (ids, lps, text, prompt_lps), (want_ids, want_lps, want_text, want_prompt_lps) in zip(got, want, strict=True):
        assert ids == want_ids and text == want_text
        assert lps == pytest.approx(want_lps, rel=1e-5, abs=1e-5)
        assert prompt_lps == pytest.approx(want_prompt_lps, rel=1e-5, abs=1e-5)


@pytest.mark.slow
def test_tp2_chunked_prefill_matches_tp1(engines):
    reference, sharded = engines
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=1, prompt_logprobs=1)
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    want = run(reference, prompts, params)
    got = run(sharded, prompts, params)
    assert all(len(ids) == 24 and len(prompt_lps) == len(p) - 1
               for (ids, _, _, prompt_lps), p in zip(got, PROMPTS, strict=True))
    assert_same(got, want)
    sharded.llm_engine.core.kv_cache_manager.check_integrity()


@pytest.mark.slow
def test_tp2_structured_outputs_match_tp1(engines):
    reference, sharded = engines
    json_spec = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)
    regex_spec = StructuredOutputsParams(regex=REGEX)
    params = [SamplingParams(temperature=0.0, max_tokens=32, logprobs=0, structured_outputs=json_spec),
              SamplingParams(temperature=0.0, max_tokens=16, logprobs=0, structured_outputs=regex_spec),
              SamplingParams(temperature=1.0, seed=5, max_tokens=16, logprobs=0, structured_outputs=regex_spec),
              SamplingParams(temperature=0.0, max_tokens=16, logprobs=0, ignore_eos=True)]
    prompts = ["Tell me something", "A name and a number:", "Pick", "Go on"]
    want = run(reference, prompts, params)
    got = run(sharded, prompts, params)
    assert_same(got, want)
    assert re.fullmatch(REGEX, got[1][2]) and re.fullmatch(REGEX, got[2][2])
    assert got[0][2].startswith('{"name"')
