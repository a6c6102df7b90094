"""Token-level stop conditions, with a runner that samples a scripted token sequence."""

import pytest

from kvserve.outputs import ModelRunnerOutput
from kvserve.request import Request, RequestStatus
from kvserve.sampling_params import SamplingParams
from kvserve.scheduler.stop import check_stop

from fake_model_runner import check_all
from scheduler_helpers import planned

EOS = 2


class ScriptedRunner:
    def __init__(self, scheduler, script):
        self.scheduler = scheduler
        self.script = list(script)

    def execute(self, scheduler_output):
        output = ModelRunnerOutput()
        for p in planned(scheduler_output, self.scheduler):
            if p.samples:
                output.sampled_token_ids[p.request_id] = [self.script.pop(0)]
        return output


def generate(make_scheduler, make_request, script, max_tokens=6, **params):
    scheduler = make_scheduler()
    sampling_params = SamplingParams(max_tokens=max_tokens, **params)
    request = make_request(
        "r", range(5), max_tokens=max_tokens, sampling_params=sampling_params, eos_token_ids=frozenset({EOS})
    )
    scheduler.add_request(request)
    runner = ScriptedRunner(scheduler, script)
    outputs = []
    while scheduler.has_unfinished_requests():
        scheduler_output = scheduler.schedule()
        outputs += scheduler.update_from_output(scheduler_output, runner.execute(scheduler_output))
        check_all(scheduler)
    assert scheduler.kv_cache_manager.num_free_blocks == scheduler.kv_cache_manager.block_pool.num_usable_blocks
    last = outputs[-1]
    return [t for o in outputs for t in o.new_token_ids], last.finish_reason, last.stop_reason


@pytest.mark.parametrize(
    "script, params, expected",
    [
        ([7, EOS, 8, 9, 10, 11], {}, ([7, EOS], "stop", None)),
        ([EOS, EOS, 8, EOS, 10, 11], {"min_tokens": 3}, ([EOS, EOS, 8, EOS], "stop", None)),
        ([7, EOS, 8, 9, 10, 11], {"ignore_eos": True}, ([7, EOS, 8, 9, 10, 11], "length", None)),
        ([7, 40, 8, 9], {"stop_token_ids": [40, 41]}, ([7, 40], "stop", 40)),
        ([41, 7, 41, 9], {"stop_token_ids": [41], "min_tokens": 2}, ([41, 7, 41], "stop", 41)),
        ([3, 4, 5, 6, 7, 8], {}, ([3, 4, 5, 6, 7, 8], "length", None)),
        ([3, 4, 5, 6, 7, EOS], {}, ([3, 4, 5, 6, 7, EOS], "stop", None)),  # EOS on the last allowed token
    ],
)
def test_stop_conditions(make_scheduler, make_request, script, params, expected):
    assert generate(make_scheduler, make_request, script, **params) == expected


def test_max_model_len_caps():
    request = Request.of("r", [1, 2, 3], SamplingParams(max_tokens=100), max_tokens=100)
    request.append_output_token_ids([5])
    assert not check_stop(request, max_model_len=5)
    request.append_output_token_ids([6])
    assert check_stop(request, max_model_len=5)
    assert request.status == RequestStatus.FINISHED_LENGTH_CAPPED and request.stop_reason is None
