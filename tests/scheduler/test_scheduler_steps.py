"""Step-by-step behaviour of the scheduler with the strict fake runner."""

from fake_model_runner import FakeModelRunner, check_all, reference_generate, run_steps

from kvserve.request import RequestStatus
from kvserve.sampling_params import SamplingParams


def plan_of(scheduler_output):
    return dict(scheduler_output.num_scheduled_tokens)


def computed_of(scheduler_output):
    """Request id -> tokens computed before the step (from new data and cached deltas)."""
    computed = {new.req_id: new.num_computed_tokens for new in scheduler_output.scheduled_new_reqs}
    cached = scheduler_output.scheduled_cached_reqs
    computed.update(zip(cached.req_ids, cached.num_computed_tokens))
    return computed


def step(scheduler, runner):
    scheduler_output = scheduler.schedule()
    outputs = scheduler.update_from_output(scheduler_output, runner.execute(scheduler_output))
    check_all(scheduler)
    return scheduler_output, outputs


def test_chunked_prefill_while_decodes_continue(make_scheduler, make_request):
    scheduler = make_scheduler(max_num_batched_tokens=8)
    runner = FakeModelRunner(4)
    scheduler.add_request(make_request("a", range(4), max_tokens=10))
    assert plan_of(step(scheduler, runner)[0]) == {"a": 4}
    b = make_request("b", range(100, 130), max_tokens=2)
    scheduler.add_request(b)
    plans = [plan_of(step(scheduler, runner)[0]) for _ in range(6)]
    assert plans == [{"a": 1, "b": 7}] * 4 + [{"a": 1, "b": 2}, {"a": 1, "b": 1}]
    assert b.output_token_ids == reference_generate(list(range(100, 130)), 2)
    assert b.status == RequestStatus.FINISHED_LENGTH_CAPPED and "b" not in scheduler.requests


def test_long_prefill_threshold_and_decodes_first(make_scheduler, make_request):
    scheduler = make_scheduler(max_num_batched_tokens=8, long_prefill_token_threshold=3)
    runner = FakeModelRunner(4)
    scheduler.add_request(make_request("long", range(10), max_tokens=3))
    scheduler.add_request(make_request("short", range(50, 52), max_tokens=3))
    assert plan_of(step(scheduler, runner)[0]) == {"long": 3, "short": 2}
    # "short" now decodes and goes first, though "long" was admitted first.
    out, _ = step(scheduler, runner)
    assert list(out.num_scheduled_tokens.items()) == [("short", 1), ("long", 3)]


def test_no_chunking_waits_for_budget(make_scheduler, make_request):
    scheduler = make_scheduler(max_num_batched_tokens=20, max_model_len=20, enable_chunked_prefill=False)
    runner = FakeModelRunner(4)
    scheduler.add_request(make_request("a", range(12), max_tokens=3))
    scheduler.add_request(make_request("b", range(12), max_tokens=3, cache_salt="x"))
    assert plan_of(step(scheduler, runner)[0]) == {"a": 12}
    assert plan_of(step(scheduler, runner)[0]) == {"a": 1, "b": 12}


def test_prefix_cache_hit_through_scheduler(make_scheduler, make_request):
    scheduler = make_scheduler(block_size=16, num_blocks=20)
    runner = FakeModelRunner(16)
    prompt = list(range(40))
    tokens, _, _, _ = run_steps(scheduler, runner, {0: [make_request("a", prompt, max_tokens=4)]})
    scheduler.add_request(make_request("b", prompt, max_tokens=4))
    first, outputs = step(scheduler, runner)
    assert plan_of(first) == {"b": 8} and computed_of(first) == {"b": 32}
    assert outputs[0].num_cached_tokens == 32
    while scheduler.has_unfinished_requests():
        outputs += step(scheduler, runner)[1]
    assert [t for o in outputs for t in o.new_token_ids] == tokens["a"] == reference_generate(prompt, 4)
    stats = scheduler.make_stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (80, 32)
    assert stats.num_running == 0 and stats.kv_cache_usage == 0.0 and stats.num_finished_requests == 2


def test_preemption_then_resume(make_scheduler, make_request):
    # 6 usable blocks of 4 tokens; two requests of 8 + 8 tokens need 4 blocks each at the end.
    scheduler = make_scheduler(num_blocks=7, block_size=4, max_model_len=16)
    runner = FakeModelRunner(4)
    a = make_request("a", range(8), max_tokens=8)
    b = make_request("b", range(20, 28), max_tokens=8, arrival_time=1.0)
    tokens, reasons, outs, _ = run_steps(scheduler, runner, {0: [a, b]})
    assert scheduler.num_preemptions >= 1 and b.num_preemptions >= 1 and a.num_preemptions == 0
    assert any("b" in o.preempted_req_ids for o in outs)
    assert tokens["a"] == reference_generate(list(range(8)), 8)
    assert tokens["b"] == reference_generate(list(range(20, 28)), 8)
    assert reasons == {"a": "length", "b": "length"}
    assert scheduler.kv_cache_manager.num_free_blocks == 6


def test_priority_order_and_priority_preemption(make_scheduler, make_request):
    scheduler = make_scheduler(policy="priority", max_num_seqs=1)
    runner = FakeModelRunner(4)
    for request_id, priority, arrival in [("low", 5, 0.0), ("high", 0, 2.0), ("mid", 1, 1.0), ("mid2", 1, 1.5)]:
        scheduler.add_request(make_request(request_id, range(3), max_tokens=1, priority=priority, arrival_time=arrival))
    order = [next(iter(plan_of(step(scheduler, runner)[0]))) for _ in range(4)]
    assert order == ["high", "mid", "mid2", "low"]

    small = make_scheduler(policy="priority", num_blocks=5, block_size=4, max_model_len=16)  # 4 usable
    low = make_request("low", range(12), max_tokens=4, priority=5)
    small.add_request(low)
    step(small, runner)  # low holds 3 blocks
    small.add_request(make_request("high", range(30, 38), max_tokens=2, priority=0, arrival_time=1.0))
    step_out, _ = step(small, runner)
    assert step_out.preempted_req_ids == {"low"} and plan_of(step_out) == {"high": 8}
    assert low.status == RequestStatus.PREEMPTED and small.num_preemptions == 1


def test_abort_frees_every_block(make_scheduler, make_request):
    scheduler = make_scheduler(num_blocks=20, block_size=4, max_num_seqs=3)
    runner = FakeModelRunner(4)
    for offset, request_id in enumerate("abc"):  # distinct prompts: no shared prefix to wait for
        scheduler.add_request(make_request(request_id, range(100 * offset, 100 * offset + 10), max_tokens=5))
    scheduler.add_request(make_request("waiting", range(9), max_tokens=5))
    step(scheduler, runner)
    assert scheduler.requests["waiting"].status == RequestStatus.WAITING
    assert scheduler.kv_cache_manager.num_free_blocks == 19 - 9
    scheduler.finish_requests(["a", "waiting", "unknown"], RequestStatus.FINISHED_ABORTED)
    check_all(scheduler)
    scheduler.finish_requests("b", RequestStatus.FINISHED_ABORTED)
    out, _ = step(scheduler, runner)
    assert out.finished_req_ids == {"a", "b", "waiting"}
    scheduler.finish_requests(["c"], RequestStatus.FINISHED_ABORTED)
    assert not scheduler.has_unfinished_requests()
    assert scheduler.kv_cache_manager.num_free_blocks == 19
    assert scheduler.schedule().finished_req_ids == {"c"}


def test_abort_between_schedule_and_update(make_scheduler, make_request):
    scheduler = make_scheduler()
    runner = FakeModelRunner(4)
    scheduler.add_request(make_request("a", range(6)))
    scheduler_output = scheduler.schedule()
    runner_output = runner.execute(scheduler_output)
    scheduler.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    assert scheduler.update_from_output(scheduler_output, runner_output) == []
    check_all(scheduler)


def test_logprobs_and_prompt_logprobs_pass_through(make_scheduler, make_request):
    scheduler = make_scheduler(max_num_batched_tokens=4)
    runner = FakeModelRunner(4)
    params = SamplingParams(max_tokens=2, logprobs=1, prompt_logprobs=0)
    scheduler.add_request(make_request("a", range(6), max_tokens=2, sampling_params=params))
    _, first = step(scheduler, runner)
    assert first[0].new_token_ids == [] and [lp.token_id for lp in first[0].prompt_logprobs] == [1, 2, 3]
    _, second = step(scheduler, runner)
    token = second[0].new_token_ids[0]
    assert [lp.token_id for lp in second[0].prompt_logprobs] == [4, 5]
    assert second[0].new_logprobs[0].token_id == token


def test_step_counters(make_scheduler, make_request):
    scheduler = make_scheduler()
    runner = FakeModelRunner(4)
    scheduler.add_request(make_request("a", range(5), max_tokens=3))
    scheduler.add_request(make_request("b", range(100, 109), max_tokens=1))
    stats = scheduler.make_stats()
    assert (stats.num_waiting, stats.num_running, stats.num_steps) == (2, 0, 0)
    step(scheduler, runner)
    stats = scheduler.make_stats()
    assert (stats.num_waiting, stats.num_running, stats.kv_cache_usage) == (0, 1, 2 / 63)
    while scheduler.has_unfinished_requests():
        step(scheduler, runner)
    assert scheduler.schedule().is_empty
    stats = scheduler.make_stats()
    assert (stats.num_steps, stats.num_scheduled_tokens, stats.num_generated_tokens) == (3, 16, 4)
    assert (stats.num_finished_requests, stats.num_preemptions, stats.kv_cache_usage) == (2, 0, 0.0)


def test_request_waits_for_a_shared_prefix_in_flight(make_scheduler, make_request):
    """Two requests with the same 48-token prompt arrive together: the second waits one step for
    the first's blocks instead of computing the same prefix again; an unrelated request behind
    it is scheduled meanwhile."""
    from kvserve.outputs import ModelRunnerOutput

    scheduler = make_scheduler(block_size=16, max_num_batched_tokens=256)
    shared = list(range(100, 148))
    scheduler.add_request(make_request("a", shared))
    scheduler.add_request(make_request("b", shared))
    scheduler.add_request(make_request("c", range(500, 520)))
    first = scheduler.schedule()
    assert list(first.num_scheduled_tokens.items()) == [("a", 48), ("c", 20)]
    stats = scheduler.make_stats()  # b was passed over: vLLM's "deferred" waiting reason
    assert (stats.num_waiting, stats.num_deferred) == (1, 1)
    scheduler.update_from_output(first, ModelRunnerOutput(sampled_token_ids={"a": [1], "c": [2]}))
    second = scheduler.schedule()
    assert scheduler.make_stats().num_deferred == 0
    assert (computed_of(second)["b"], second.num_scheduled_tokens["b"]) == (32, 16)  # two cached blocks; the last prompt token is always computed
    assert scheduler.requests["b"].num_cached_tokens == 32
    scheduler.kv_cache_manager.check_integrity()
