"""Requests that generate no token (``max_tokens=0``): with ``prompt_logprobs`` the engine scores
the prompt and finishes without sampling; without, it finishes at once without a model step.
Either way nothing stays in the KV cache."""

from __future__ import annotations

import math

import pytest

from kvserve import SamplingParams
from engine_helpers import assert_kv_clean, make_llm, random_prompts


@pytest.fixture(scope="module")
def llm(model_dir):
    return make_llm(model_dir)


def test_prompt_logprobs_without_generating(llm):
    prompt = random_prompts(1, seed=41, min_len=37, max_len=37)[0]
    before = llm.llm_engine.core.make_stats()
    scored = llm.generate([prompt], SamplingParams(max_tokens=0, prompt_logprobs=3))[0]
    after = llm.llm_engine.core.make_stats()
    choice = scored.outputs[0]
    assert (choice.token_ids, choice.text, choice.finish_reason) == ([], "", "length")
    assert scored.finished
    assert after.num_generated_tokens == before.num_generated_tokens
    assert after.num_scheduled_tokens - before.num_scheduled_tokens == 37  # the prompt, once
    # The same scores as a request that also generates one token.
    reference = llm.generate([prompt], SamplingParams(max_tokens=1, prompt_logprobs=3, temperature=0))[0]
    assert len(scored.prompt_logprobs) == len(reference.prompt_logprobs) == 37
    assert scored.prompt_logprobs[0] is None
    for ours, theirs in zip(scored.prompt_logprobs[1:], reference.prompt_logprobs[1:]):
        assert (ours.token_id, ours.rank, ours.top_token_ids) == (theirs.token_id, theirs.rank, theirs.top_token_ids)
        assert math.isclose(ours.logprob, theirs.logprob, abs_tol=1e-5)
    assert_kv_clean(llm)


def test_no_work_finishes_without_a_step(llm):
    before = llm.llm_engine.core.make_stats()
    out = llm.generate([[5, 6, 7], "hello"], SamplingParams(max_tokens=0, n=2))
    after = llm.llm_engine.core.make_stats()
    assert [[(c.index, c.token_ids, c.finish_reason) for c in o.outputs] for o in out] == [
        [(0, [], "length"), (1, [], "length")]] * 2
    assert after.num_steps == before.num_steps and after.num_scheduled_tokens == before.num_scheduled_tokens
    assert_kv_clean(llm)


def test_scoring_beside_generation_changes_no_output(llm):
    prompts = random_prompts(4, seed=42)
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    alone = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy)]
    scoring = [SamplingParams(max_tokens=0, prompt_logprobs=1), SamplingParams(max_tokens=0)]
    mixed = llm.generate(prompts[:2] + prompts[:2] + prompts[2:], scoring + [greedy] * 4)
    assert [o.outputs[0].token_ids for o in mixed[2:]] == alone
    assert [o.outputs[0].finish_reason for o in mixed[:2]] == ["length", "length"]
    assert mixed[0].prompt_logprobs is not None and len(mixed[0].prompt_logprobs) == len(prompts[0])
    assert_kv_clean(llm)


def test_abort_before_the_step_reports_nothing(llm):
    engine = llm.llm_engine
    engine.add_request("gone", [5, 6, 7], SamplingParams(max_tokens=0))
    engine.add_request("kept", [5, 6, 7], SamplingParams(max_tokens=0))
    engine.abort_request("gone")
    outputs = engine.step().outputs
    assert [(o.request_id, o.finished) for o in outputs] == [("kept", True)]
    assert not engine.has_unfinished_requests()
    assert_kv_clean(llm)
