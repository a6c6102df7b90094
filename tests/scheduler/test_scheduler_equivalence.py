"""Batching must not change results: every request's tokens equal its solo, cache-free reference,
whatever else runs, however prompts are chunked, with caching on or off, and under preemption."""

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fake_model_runner import FakeModelRunner, reference_generate, run_steps

from scheduler_helpers import build_request, build_scheduler

from kvserve.sampling_params import SamplingParams

EOS = frozenset({0})
SHARED = [list(range(100, 118)), list(range(200, 209))]


def workload():
    """(arrival step, prompt, max_tokens): shared prefixes, one exact repeat, EOS possible."""
    specs = [
        (0, SHARED[0] + [1, 2, 3], 12),
        (0, SHARED[0] + [4], 9),
        (1, SHARED[1] + list(range(30, 50)), 7),
        (2, SHARED[0] + [1, 2, 3], 12),
        (3, [5, 6], 15),
        (5, SHARED[1] + [9], 10),
        (5, list(range(60, 95)), 5),
        # same tokens as r0's 2nd..4th blocks (size 4) after another first block: a hit only with
        # an unchained hash, and then on K/V computed for another prefix
        (6, SHARED[1][:4] + SHARED[0][4:16] + [1], 4),
        (6, SHARED[0][:4] + SHARED[1][4:8] + [2], 4),
    ]
    arrivals = {}
    for index, (arrival, prompt, max_tokens) in enumerate(specs):
        request = build_request(
            f"r{index}", prompt, max_tokens=max_tokens, eos_token_ids=EOS, arrival_time=float(index)
        )
        arrivals.setdefault(arrival, []).append(request)
    return arrivals


def expected_tokens(arrivals):
    return {
        r.request_id: reference_generate(r.prompt_token_ids, r.max_tokens, EOS) for rs in arrivals.values() for r in rs
    }


CONFIGS = {
    "together": dict(num_blocks=200, block_size=4),
    "small_chunks": dict(num_blocks=200, block_size=4, max_num_batched_tokens=5, long_prefill_token_threshold=3),
    "caching_off": dict(num_blocks=200, block_size=4, enable_caching=False),
    "block_size_16": dict(num_blocks=40, block_size=16),
    "tiny_cache": dict(num_blocks=16, block_size=4, max_model_len=60),
    "tiny_cache_priority": dict(num_blocks=16, block_size=4, max_model_len=60, policy="priority"),
    "one_seq": dict(num_blocks=200, block_size=4, max_num_seqs=1),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_outputs_equal_solo_reference(name):
    config = dict(CONFIGS[name])
    block_size = config["block_size"]
    scheduler = build_scheduler(**config)
    arrivals = workload()
    tokens, reasons, _, _ = run_steps(scheduler, FakeModelRunner(block_size), arrivals)
    assert tokens == expected_tokens(arrivals)
    assert set(reasons.values()) <= {"stop", "length"} and len(reasons) == 9
    stats = scheduler.make_stats()
    assert scheduler.kv_cache_manager.num_free_blocks == scheduler.kv_cache_manager.block_pool.num_usable_blocks
    if name.startswith("tiny_cache"):
        assert stats.num_preemptions > 0
    if config.get("enable_caching", True) and name != "tiny_cache_priority":
        assert stats.prefix_cache_hits > 0
    if not config.get("enable_caching", True):
        assert stats.prefix_cache_queries == 0


request_spec = st.tuples(
    st.integers(0, 8),  # arrival step
    st.sampled_from([0, 1, 1, 2, 2]),  # shared prefix: none, SHARED[0], SHARED[1]
    st.lists(st.integers(1, 50), min_size=0, max_size=10),  # own suffix
    st.integers(1, 10),  # max_tokens
    st.one_of(st.none(), st.integers(0, 14)),  # abort step
    st.integers(0, 2),  # priority
    st.booleans(),  # prompt_logprobs
)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=st.lists(request_spec, min_size=2, max_size=8),
    block_size=st.sampled_from([2, 4]),
    extra_blocks=st.integers(0, 12),
    budget=st.integers(2, 24),
    threshold=st.integers(0, 5),
    caching=st.sampled_from([True, True, False]),
    policy=st.sampled_from(["fcfs", "priority"]),
)
def test_random_workloads_match_solo_runs(specs, block_size, extra_blocks, budget, threshold, caching, policy):
    max_model_len = 40
    num_blocks = max_model_len // block_size + 1 + extra_blocks  # the largest request always fits
    scheduler = build_scheduler(
        num_blocks=num_blocks, block_size=block_size, enable_caching=caching, max_model_len=max_model_len,
        max_num_batched_tokens=budget, long_prefill_token_threshold=threshold, policy=policy,
    )
    arrivals, aborts, requests = {}, {}, []
    for index, (arrival, prefix, suffix, max_tokens, abort, priority, prompt_logprobs) in enumerate(specs):
        prompt = ([] if prefix == 0 else SHARED[prefix - 1]) + suffix or [7]
        params = SamplingParams(max_tokens=max_tokens, prompt_logprobs=0 if prompt_logprobs else None)
        request = build_request(
            f"r{index}", prompt, max_tokens=max_tokens, eos_token_ids=EOS, priority=priority,
            arrival_time=float(index), sampling_params=params,
        )
        requests.append(request)
        arrivals.setdefault(arrival, []).append(request)
        if abort is not None:
            aborts.setdefault(abort, []).append(request.request_id)
    tokens, reasons, _, prompt_logprob_ids = run_steps(scheduler, FakeModelRunner(block_size), arrivals, aborts)
    for request in requests:
        request_id = request.request_id
        expected = reference_generate(request.prompt_token_ids, request.max_tokens, EOS)
        expected_prompt = request.prompt_token_ids[1:] if request.sampling_params.prompt_logprobs is not None else []
        got, got_prompt = tokens[request_id], prompt_logprob_ids[request_id]
        if request_id in reasons:  # finished on its own
            assert (got, got_prompt) == (expected, expected_prompt), request_id
        else:  # aborted: what it produced so far is still right
            assert got == expected[: len(got)] and got_prompt == expected_prompt[: len(got_prompt)], request_id
    stats = scheduler.make_stats()
    event(f"preempted: {stats.num_preemptions > 0}")
    event(f"prefix hits: {stats.prefix_cache_hits > 0}")
    event(f"aborted: {len(reasons) < len(requests)}")
    logprob_preempted = any(r.num_preemptions and r.sampling_params.prompt_logprobs is not None for r in requests)
    event(f"prompt logprobs preempted: {logprob_preempted}")
    kv = scheduler.kv_cache_manager
    assert not scheduler.has_unfinished_requests() and kv.req_to_blocks == {}
    assert kv.num_free_blocks == kv.block_pool.num_usable_blocks
