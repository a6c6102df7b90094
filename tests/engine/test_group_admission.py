"""Several prompts of one call are admitted together (``LLMEngine.add_requests``): the waiting
queue is checked for all their choices first, so a call is queued whole or not at all."""

from __future__ import annotations

import pytest

from kvserve import SamplingParams
from kvserve.engine.engine_request import EngineRequest
from kvserve.errors import InvalidRequestError, RequestRejectedError
from engine_helpers import assert_kv_clean, make_llm


@pytest.fixture(scope="module")
def llm(model_dir):
    # 2 running slots + 3 queue places: at most 5 requests accepted at once into an idle engine.
    return make_llm(model_dir, max_num_seqs=2, max_num_waiting=3)


def items(llm, prefix: str, count: int, max_tokens: int = 2, **params) -> list[EngineRequest]:
    sampling = SamplingParams(max_tokens=max_tokens, ignore_eos=True, **params)
    return [llm.llm_engine.process_inputs(f"{prefix}-{i}", [5 + i, 6, 7], sampling) for i in range(count)]


def queued(llm) -> int:
    return llm.llm_engine.core.scheduler.get_num_unfinished_requests()


def test_a_call_larger_than_the_queue_is_refused_whole(llm):
    engine = llm.llm_engine
    with pytest.raises(InvalidRequestError) as info:
        engine.add_requests(items(llm, "big", 6))
    assert info.value.param == "prompt" and "at most 5" in info.value.message
    with pytest.raises(InvalidRequestError) as info:
        engine.add_requests(items(llm, "wide", 1, n=6))
    assert info.value.param == "n"
    assert queued(llm) == 0 and engine.output_processor.requests == {}
    engine.add_requests(items(llm, "fits", 5))  # exactly the bound
    assert queued(llm) == 5
    llm._run([f"fits-{i}" for i in range(5)])
    assert_kv_clean(llm)


def test_a_call_that_does_not_fit_now_is_429_with_nothing_queued(llm):
    engine = llm.llm_engine
    engine.add_requests(items(llm, "first", 3))
    with pytest.raises(RequestRejectedError) as info:
        engine.add_requests(items(llm, "second", 3))
    assert info.value.reason == "queue_full"
    assert queued(llm) == 3 and sorted(engine.output_processor.requests) == ["first-0", "first-1", "first-2"]
    engine.add_requests(items(llm, "third", 2))  # what is left still fits
    # Requests with nothing to compute take no queue place.
    engine.add_requests(items(llm, "free", 4, max_tokens=0))
    assert queued(llm) == 5
    llm._run(["first-0", "first-1", "first-2", "third-0", "third-1"] + [f"free-{i}" for i in range(4)])
    assert_kv_clean(llm)


def test_an_invalid_prompt_anywhere_queues_nothing(llm):
    engine = llm.llm_engine
    with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
        llm.generate([[5, 6, 7], [8, 9], [10**6]], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="new and distinct"):
        engine.add_requests(items(llm, "dup", 1) + items(llm, "dup", 1))
    assert queued(llm) == 0 and engine.output_processor.requests == {}
