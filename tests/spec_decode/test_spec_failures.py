"""Failures and aborts while speculating: a fault injected into one speculating request (taking
it into the batch, the forward, the verification, proposing its drafts, detokenizing several
tokens at once) finishes that request alone; the others keep their plain tokens and logprob bits.
A verification that fails after accepting drafts takes them back before the group is retried.
Requests aborted while holding drafts leave no block behind."""

from __future__ import annotations

import pytest

from kvserve import SamplingParams
from kvserve.faults import SPECULATIVE_STAGES, STAGES
from kvserve.sample.rejection_sampler import RejectionSampler
from kvserve.testing.spec_decode import ForcedProposer, check_kv_integrity, reference_drafts
from spec_helpers import NGRAM, copy_prompts, make_llm, results, spec_stats

PROMPTS = copy_prompts(5, seed=13)
PARAMS = [SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=1),
          SamplingParams(temperature=1.0, seed=4, max_tokens=16, ignore_eos=True, logprobs=1)]


@pytest.fixture(scope="module")
def reference(tiny_llama):
    llm = make_llm(tiny_llama)
    return {i: results(llm.generate(PROMPTS, params)) for i, params in enumerate(PARAMS)}


def speculating_llm(model_dir, ref):
    llm = make_llm(model_dir, speculative_config=NGRAM)
    mapping = {tuple(p): r[0][0] for p, r in zip(PROMPTS, ref)}
    llm.llm_engine.core.proposer = ForcedProposer(reference_drafts(mapping, 4, "prefix", seed=1))
    return llm


def assert_kv_clean(llm):
    manager = llm.llm_engine.core.kv_cache_manager
    manager.check_integrity()
    assert manager.usage == 0.0 and manager.num_free_blocks == manager.block_pool.num_usable_blocks
    assert not llm.llm_engine.has_unfinished_requests()


def faults_of(llm, stage):
    engine = llm.llm_engine
    return engine.output_processor.faults if stage == "detokenize" else engine.core.runner.faults


@pytest.mark.parametrize("params_index", [0, 1], ids=["greedy", "seeded"])
@pytest.mark.parametrize("stage", STAGES + SPECULATIVE_STAGES)
def test_a_failing_speculating_request_finishes_alone(tiny_llama, reference, stage, params_index):
    expected = reference[params_index]
    llm = speculating_llm(tiny_llama, expected)
    llm.generate(PROMPTS[:1], PARAMS[params_index])  # warm: ids from here on are "1", "2", ...
    faults_of(llm, stage).fail(stage, "3")  # the third prompt of the next call
    outputs = llm.generate(PROMPTS, PARAMS[params_index])
    for i, (out, want) in enumerate(zip(results(outputs), expected)):
        if i == 2:
            assert out[0][2] == "error" and "injected fault" in outputs[i].error
        else:
            assert out == want, f"request {i} changed by another request's fault at {stage}"
    assert_kv_clean(llm)
    faults_of(llm, stage).clear()
    assert results(llm.generate(PROMPTS, PARAMS[params_index])) == expected
    assert spec_stats(llm).num_accepted_tokens > 0


def test_a_verification_failing_after_accepted_drafts_takes_them_back(tiny_llama, reference, monkeypatch):
    """Position 1 of request "3" raises, after the group's position 0 accepted drafts of every
    request: they are taken back, the halves are run again, and only "3" fails."""
    expected = reference[0]
    llm = speculating_llm(tiny_llama, expected)
    llm.llm_engine.core.proposer = ForcedProposer(
        reference_drafts({tuple(p): r[0][0] for p, r in zip(PROMPTS, expected)}, 4, "all"))
    llm.generate(PROMPTS[:1], PARAMS[0])
    batch = llm.llm_engine.core.runner.input_batch
    original = RejectionSampler._sample_position

    def failing(self, logits, rows, drafts, batch_, uniforms, position, alive, *rest):
        bad = batch.req_id_to_index.get("3")
        if position >= 1 and bad is not None and bad in rows[alive].tolist():
            raise RuntimeError("injected failure at draft position 1")
        return original(self, logits, rows, drafts, batch_, uniforms, position, alive, *rest)

    monkeypatch.setattr(RejectionSampler, "_sample_position", failing)
    outputs = llm.generate(PROMPTS, PARAMS[0])
    for i, (out, want) in enumerate(zip(results(outputs), expected)):
        if i == 2:
            assert out[0][2] == "error" and "draft position 1" in outputs[i].error
        else:
            assert out == want
    assert_kv_clean(llm)


def test_aborts_while_holding_drafts_leave_no_block(tiny_llama, reference):
    expected = reference[0]
    llm = speculating_llm(tiny_llama, expected)
    engine = llm.llm_engine
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"r{i}", {"prompt_token_ids": prompt}, PARAMS[0])
    tokens = {f"r{i}": [] for i in range(len(PROMPTS))}
    aborted = set()
    step = 0
    while engine.has_unfinished_requests():
        for delta in engine.step().outputs:
            tokens[delta.request_id] += delta.outputs[0].token_ids
        check_kv_integrity(engine.core)
        step += 1
        holding = [r.request_id for r in engine.core.scheduler.running if r.spec_token_ids]
        if step in (2, 3) and holding:
            engine.abort_request(holding[0])
            aborted.add(holding[0])
    assert len(aborted) == 2
    for i in range(len(PROMPTS)):
        if f"r{i}" not in aborted:
            assert tokens[f"r{i}"] == expected[i][0][0]
    assert_kv_clean(llm)
