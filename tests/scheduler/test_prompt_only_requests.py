"""Requests that generate no token (``max_tokens=0``, scoring the prompt): the scheduler computes
the prompt in chunks, never asks for a sample, finishes with ``length`` and frees every block."""

from fake_model_runner import FakeModelRunner, check_all, reference_generate, run_steps
from scheduler_helpers import planned

from kvserve.sampling_params import SamplingParams


def test_prompt_only_request_scores_every_position_and_frees_its_blocks(make_scheduler, make_request):
    scheduler = make_scheduler(max_num_batched_tokens=4)
    runner = FakeModelRunner(4)
    params = SamplingParams(max_tokens=0, prompt_logprobs=0)
    scheduler.add_request(make_request("score", range(10, 20), max_tokens=0, sampling_params=params))
    plans, outputs = [], []
    while scheduler.has_unfinished_requests():
        scheduler_output = scheduler.schedule()
        assert not any(p.samples for p in planned(scheduler_output, scheduler))
        plans.append(list(scheduler_output.num_scheduled_tokens.values()))
        runner_output = runner.execute(scheduler_output)
        assert runner_output.sampled_token_ids == {}
        outputs += scheduler.update_from_output(scheduler_output, runner_output)
        check_all(scheduler)
    assert plans == [[4], [4], [2]]  # 10 prompt tokens in chunks of the budget, nothing more
    assert [o.new_token_ids for o in outputs] == [[], [], []]
    assert [lp.token_id for o in outputs for lp in o.prompt_logprobs or ()] == list(range(11, 20))
    assert [o.finish_reason for o in outputs] == [None, None, "length"]
    stats = scheduler.make_stats()
    assert (stats.num_generated_tokens, stats.num_finished_requests, stats.kv_cache_usage) == (0, 1, 0.0)
    assert scheduler.requests == {}


def test_prompt_only_requests_beside_generating_ones(make_scheduler, make_request):
    """Generating requests are unaffected by prompt-only ones in the same steps."""
    scheduler = make_scheduler(max_num_batched_tokens=16)
    runner = FakeModelRunner(4)
    only = SamplingParams(max_tokens=0, prompt_logprobs=1)
    arrivals = {
        0: [make_request("gen-a", range(30, 43), max_tokens=5),
            make_request("only-a", range(50, 70), max_tokens=0, sampling_params=only)],
        2: [make_request("only-b", range(30, 43), max_tokens=0, sampling_params=only),
            make_request("gen-b", range(80, 85), max_tokens=4)],
    }
    result = run_steps(scheduler, runner, arrivals)
    assert result.tokens == {"gen-a": reference_generate(list(range(30, 43)), 5), "only-a": [],
                             "only-b": [], "gen-b": reference_generate(list(range(80, 85)), 4)}
    assert result.reasons == {"gen-a": "length", "only-a": "length", "only-b": "length", "gen-b": "length"}
    assert result.prompt_logprob_ids["only-a"] == list(range(51, 70))
    assert result.prompt_logprob_ids["only-b"] == list(range(31, 43))
    assert scheduler.kv_cache_manager.usage == 0.0
