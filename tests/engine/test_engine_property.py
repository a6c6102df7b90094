"""Property test on the real model: random arrival steps, prompt lengths (with shared prefixes),
output lengths and aborts. Every request that is not aborted must produce exactly the tokens of
its solo run; the KV cache must be consistent after every step and empty at the end."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvserve import SamplingParams
from engine_helpers import assert_kv_clean, make_llm

SHARED_PREFIX = list(range(100, 140))  # 40 tokens: 2 full blocks of 16


@st.composite
def workloads(draw):
    requests = []
    for i in range(draw(st.integers(2, 7))):
        prefix = SHARED_PREFIX[: draw(st.sampled_from([0, 16, 40]))]
        body = draw(st.lists(st.integers(5, 900), min_size=1, max_size=40))
        requests.append({
            "id": f"r{i}",
            "prompt": prefix + body,
            "max_tokens": draw(st.integers(1, 12)),
            "arrival_step": draw(st.integers(0, 8)),
            "abort_step": draw(st.one_of(st.none(), st.integers(0, 12))),
        })
    config = draw(st.sampled_from([
        {"num_gpu_blocks_override": 12, "max_num_batched_tokens": 16},
        {"num_gpu_blocks_override": 64, "max_num_batched_tokens": 32},
        {"num_gpu_blocks_override": 16, "enable_prefix_caching": False},
    ]))
    return requests, config


@pytest.fixture(scope="module")
def solo_reference(model_dir):
    llm = make_llm(model_dir, enable_prefix_caching=False)
    cache: dict[tuple, list[int]] = {}

    def run(prompt: list[int], max_tokens: int) -> list[int]:
        key = (tuple(prompt), max_tokens)
        if key not in cache:
            params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
            cache[key] = llm.generate([prompt], params)[0].outputs[0].token_ids
        return cache[key]

    return run


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(workload=workloads())
def test_random_arrivals_and_aborts_match_solo(model_dir, solo_reference, workload):
    requests, config = workload
    llm = make_llm(model_dir, max_model_len=128, **config)
    engine = llm.llm_engine
    manager = engine.core.kv_cache_manager
    outputs: dict[str, list[int]] = {}
    finished: set[str] = set()
    aborted: set[str] = set()
    step = 0
    while step < 400:
        for r in requests:
            if r["arrival_step"] == step:
                params = SamplingParams(temperature=0, max_tokens=r["max_tokens"], ignore_eos=True)
                engine.add_request(r["id"], r["prompt"], params)
                outputs[r["id"]] = []
            if r["abort_step"] == step and r["id"] in outputs and r["id"] not in finished:
                engine.abort_request(r["id"])
                aborted.add(r["id"])
        for delta in engine.step().outputs:
            outputs[delta.request_id].extend(delta.outputs[0].token_ids)
            if delta.finished:
                finished.add(delta.request_id)
        manager.check_integrity()
        step += 1
        if step > 8 and not engine.has_unfinished_requests():
            break
    assert not engine.has_unfinished_requests()
    for r in requests:
        if r["id"] not in aborted:
            assert outputs[r["id"]] == solo_reference(r["prompt"], r["max_tokens"]), r
    assert_kv_clean(llm)
