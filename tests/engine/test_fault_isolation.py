"""A failure while processing one request finishes that request only: faults injected at each stage
(the runner taking it into its batch, the forward pass, sampling, detokenization) leave every
other request's tokens and logprob bits exactly as in a run without the fault, and free every KV
block. A failure no request explains stops the engine (``EngineDeadError``)."""

from __future__ import annotations

import numpy as np
import pytest

from kvserve import SamplingParams
from kvserve.errors import EngineDeadError
from kvserve.faults import STAGES
from engine_helpers import assert_kv_clean, make_llm, random_prompts

PROMPTS = random_prompts(5, seed=41)
PARAMS = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=1),
          SamplingParams(temperature=1.0, seed=5, max_tokens=12, ignore_eos=True, logprobs=1)]


def results(outputs):
    """(token ids, logprob of each token, finish reason) per prompt."""
    return [(o.outputs[0].token_ids, [lp.logprob for lp in o.outputs[0].logprobs or []], o.outputs[0].finish_reason)
            for o in outputs]


def faults_of(llm, stage):
    engine = llm.llm_engine
    return engine.output_processor.faults if stage == "detokenize" else engine.core.runner.faults


@pytest.fixture(scope="module")
def reference(model_dir):
    llm = make_llm(model_dir)
    return {i: results(llm.generate(PROMPTS, params)) for i, params in enumerate(PARAMS)}


@pytest.mark.parametrize("params_index", [0, 1], ids=["greedy", "seeded"])
@pytest.mark.parametrize("stage", STAGES)
def test_a_failing_request_finishes_alone(model_dir, reference, stage, params_index):
    llm = make_llm(model_dir)
    faults_of(llm, stage).fail(stage, "2")  # a new LLM names its requests "0", "1", ...
    outputs = llm.generate(PROMPTS, PARAMS[params_index])
    got = results(outputs)
    expected = reference[params_index]
    for i, (out, want) in enumerate(zip(got, expected)):
        if i == 2:
            assert out[2] == "error" and outputs[i].error and "injected fault" in outputs[i].error
        else:
            assert out == want, f"request {i} changed by another request's fault at {stage}"
    assert_kv_clean(llm)
    faults_of(llm, stage).clear()
    assert results(llm.generate(PROMPTS, PARAMS[params_index])) == expected  # and the engine goes on


def test_a_fault_mid_generation_keeps_the_tokens_sent_before(model_dir, reference):
    """A request that fails after some steps has streamed its first tokens; it ends with error."""
    llm = make_llm(model_dir)
    engine = llm.llm_engine
    engine.add_request("late", PROMPTS[0], PARAMS[0])
    seen = []
    for _ in range(4):
        for delta in engine.step().outputs:
            seen += delta.outputs[0].token_ids
    engine.core.runner.faults.fail("sample", "late")
    final = None
    while engine.has_unfinished_requests():
        for delta in engine.step().outputs:
            final = delta
    assert final.finished and final.outputs[0].finish_reason == "error"
    assert seen == reference[0][0][0][: len(seen)] and len(seen) >= 3
    assert_kv_clean(llm)


def test_a_failure_no_request_explains_stops_the_engine(model_dir):
    llm = make_llm(model_dir)
    llm.llm_engine.core.runner.faults.fail("forward", "*")
    with pytest.raises(EngineDeadError, match="every request of the step failed alone|failed alone, none succeeded"):
        llm.generate(PROMPTS[:3], PARAMS[0])


def test_scheduler_failure_is_unattributable(model_dir, monkeypatch):
    llm = make_llm(model_dir)
    scheduler = llm.llm_engine.core.scheduler

    def broken():
        raise RuntimeError("scheduler bug")

    monkeypatch.setattr(scheduler, "schedule", broken)
    with pytest.raises(EngineDeadError, match="the scheduler failed: RuntimeError: scheduler bug"):
        llm.generate(PROMPTS[:1], PARAMS[0])


def test_three_steps_in_a_row_where_everything_failed_stop_the_engine(model_dir):
    """Requests arriving one per step cannot show a broken engine by comparison: after three
    steps in a row in which every request failed, the engine stops."""
    llm = make_llm(model_dir)
    engine = llm.llm_engine
    engine.core.runner.faults.fail("forward", "*")
    for i in range(2):
        engine.add_request(f"r{i}", PROMPTS[i], PARAMS[0])
        assert engine.step().outputs[0].outputs[0].finish_reason == "error"
    engine.add_request("r2", PROMPTS[2], PARAMS[0])
    with pytest.raises(EngineDeadError, match="3 steps in a row failed for every request"):
        engine.step()


@pytest.mark.parametrize("enforce_eager", [False, True], ids=["decoder-loop", "modules"])
@pytest.mark.parametrize("bad_block", [10**6, -3])
def test_a_block_table_outside_the_cache_fails_that_request_alone(model_dir, reference, monkeypatch, enforce_eager,
                                                                 bad_block):
    """A request whose block table names a block outside the KV cache (a scheduler or runner bug)
    where its context is read, not written: the attention kernel refuses it (it read outside the
    cache and killed the process with a segfault), so that request fails and the others keep
    their bits, in the decoder layers' C++ loop and in the modules."""
    llm = make_llm(model_dir, enforce_eager=enforce_eager)
    runner = llm.llm_engine.core.runner
    assert (runner.fused_decoder is None) == enforce_eager
    flat_batch = runner._flat_batch

    def corrupted(rows, num_scheduled, samples, num_logits=None):
        flat = flat_batch(rows, num_scheduled, samples, num_logits)
        for i, row in enumerate(np.asarray(rows).tolist()):
            if runner.input_batch.req_ids[row] == "2":
                flat.block_tables[i, 0] = bad_block  # the slot mapping (the write) is already made
        return flat

    monkeypatch.setattr(runner, "_flat_batch", corrupted)
    outputs = llm.generate(PROMPTS, PARAMS[1])
    got = results(outputs)
    assert got[2][2] == "error" and "paged_attention: request" in outputs[2].error
    assert [g for i, g in enumerate(got) if i != 2] == [w for i, w in enumerate(reference[1]) if i != 2]
    monkeypatch.undo()
    assert_kv_clean(llm)
    assert results(llm.generate(PROMPTS, PARAMS[1])) == reference[1]
