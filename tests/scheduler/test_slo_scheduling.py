"""The scheduler's latency-target side (kvserve.slo.scheduling) against the scheduler itself: a TTFT
predicted at admission equals the TTFT the real scheduler then gives when steps take exactly what
the cost model says (every rule the prediction plays: decodes first, chunked prefill, seats,
requests leaving at max_tokens); refusals, the queue order by deadline, the TPOT prefill cap."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fake_model_runner import FakeModelRunner
from kvserve.errors import RequestRejectedError
from kvserve.request import Request
from kvserve.slo.cost_model import StepCostModel
from kvserve.slo.cost_model import DEFAULT_MARGIN as PLAN_MARGIN  # a model set by hand plans to it
from kvserve.slo.scheduling import SLOScheduling
from kvserve.slo.targets import SLOTarget
from scheduler_helpers import build_request, build_scheduler

# seconds per step, prompt token, decode row, million attention pairs
COST = (0.010, 0.0007, 0.0003, 0.4)


def known_model(coefficients=COST) -> StepCostModel:
    model = StepCostModel(min_observations=0)
    model.coefficients = np.array(coefficients, dtype=float)
    return model


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def targeted(request: Request, **target) -> Request:
    return Request(dataclasses.replace(request.spec, slo=SLOTarget(**target)))


def setup(budget=16, max_seqs=3, clock=None, **kwargs):
    scheduler = build_scheduler(num_blocks=512, block_size=4, enable_caching=False, max_num_batched_tokens=budget,
                                max_num_seqs=max_seqs, **kwargs)
    scheduler.slo = SLOScheduling(known_model(), clock=clock or Clock())
    return scheduler, FakeModelRunner(4)


def play(scheduler, runner, clock, until=None, max_steps=2000) -> None:
    """Run steps, the clock advancing by the cost model's time of each, until ``until`` has a token
    (or everything finished)."""
    for _ in range(max_steps):
        if until is not None and until.num_output_tokens > 0 or not scheduler.has_unfinished_requests():
            return
        output = scheduler.schedule()
        clock.now += scheduler.slo.cost_model.predict(scheduler.slo.step_work(output, scheduler.requests))
        scheduler.update_from_output(output, runner.execute(output))
    raise AssertionError("did not finish")


@pytest.mark.parametrize("budget,max_seqs,warm_steps,policy", [(16, 3, 2, "fcfs"), (16, 2, 0, "fcfs"),
                                                                (40, 4, 5, "fcfs"), (7, 3, 3, "fcfs"),
                                                                (16, 3, 2, "priority")])
def test_the_predicted_ttft_is_what_the_scheduler_then_gives(budget, max_seqs, warm_steps, policy):
    clock = Clock()
    scheduler, runner = setup(budget, max_seqs, clock, policy=policy)
    shapes = [(10, 3), (23, 7), (5, 2), (40, 5), (3, 1), (17, 9)]
    for i, (prompt, max_tokens) in enumerate(shapes):  # under priority: some before the new one, some after
        scheduler.add_request(build_request(f"r{i}", range(100 * i, 100 * i + prompt), max_tokens=max_tokens,
                                            arrival_time=clock.now, priority=i % 2 if policy == "priority" else 0))
    for _ in range(warm_steps):  # some running mid-prefill, some decoding, some waiting
        output = scheduler.schedule()
        clock.now += scheduler.slo.cost_model.predict(scheduler.slo.step_work(output, scheduler.requests))
        scheduler.update_from_output(output, runner.execute(output))
    new = targeted(build_request("new", range(900, 931), max_tokens=4, arrival_time=clock.now), ttft_ms=1e7)
    scheduler.add_requests([new])
    predicted = new.slo_state.predicted_ttft
    play(scheduler, runner, clock, until=new)
    assert predicted == pytest.approx(clock.now - new.arrival_time, rel=1e-9, abs=1e-12)


def test_a_request_predicted_late_is_refused_with_the_prediction_and_nothing_is_queued():
    clock = Clock()
    scheduler, runner = setup(budget=16, max_seqs=2, clock=clock)
    for i in range(4):
        scheduler.add_request(build_request(f"r{i}", range(50 * i, 50 * i + 30), max_tokens=20, arrival_time=clock.now))
    play(scheduler, runner, clock, until=scheduler.requests["r1"])  # both seats taken for ~20 steps
    late = targeted(build_request("late", range(600, 610), max_tokens=4, arrival_time=clock.now), ttft_ms=50)
    with pytest.raises(RequestRejectedError) as refused:
        scheduler.add_requests([late])
    error = refused.value
    assert error.reason == "slo_unattainable" and "slo.ttft_ms=50" in error.message
    assert error.details["slo"] == {"ttft_ms": 50.0, "tpot_ms": None}
    assert error.details["predicted_ttft_ms"] > 50 and error.retry_after >= 1
    assert "late" not in scheduler.requests and len(scheduler.waiting) == 2
    assert scheduler.slo.stats(scheduler).refused == {"request": 1}

    queued = targeted(build_request("queued", range(600, 610), max_tokens=4, arrival_time=clock.now),
                      ttft_ms=50, on_miss="queue")
    scheduler.add_requests([queued])  # accepted although it will be late
    assert queued.slo_state.predicted_miss and scheduler.slo.stats(scheduler).queued_predicted_miss == {"request": 1}


def test_a_tpot_target_a_decode_step_cannot_keep_is_refused():
    clock = Clock()
    scheduler, runner = setup(budget=64, max_seqs=8, clock=clock)
    for i in range(4):
        scheduler.add_request(build_request(f"r{i}", range(50 * i, 50 * i + 8), max_tokens=30, arrival_time=clock.now))
    play(scheduler, runner, clock, until=scheduler.requests["r3"])
    # a decode step of 5 rows: 0.010 + 5 * 0.0003 + attention, 11.5-12 ms; planned within PLAN_MARGIN
    # of the target, 11 ms / PLAN_MARGIN cannot be kept and 12.5 ms / PLAN_MARGIN can
    with pytest.raises(RequestRejectedError, match="time-per-output-token target of"):
        scheduler.add_requests([targeted(build_request("fast", range(700, 708), max_tokens=4,
                                                       arrival_time=clock.now), tpot_ms=11 / PLAN_MARGIN)])
    scheduler.add_requests([targeted(build_request("ok", range(700, 708), max_tokens=4, arrival_time=clock.now),
                                     tpot_ms=12.5 / PLAN_MARGIN)])


def test_targeted_requests_pass_untargeted_ones_and_untargeted_ones_keep_arrival_order():
    clock = Clock()
    scheduler, _ = setup(budget=16, max_seqs=1, clock=clock)
    scheduler.add_request(build_request("busy", range(8), max_tokens=50, arrival_time=clock.now))
    scheduler.schedule()
    for i in range(3):
        scheduler.add_request(build_request(f"plain{i}", range(20 * i, 20 * i + 5), max_tokens=2,
                                            arrival_time=clock.now + i))
    urgent = targeted(build_request("urgent", range(300, 305), max_tokens=2, arrival_time=clock.now + 5),
                      ttft_ms=10_000, on_miss="queue")
    scheduler.add_requests([urgent])
    assert [r.request_id for r in scheduler.waiting] == ["urgent", "plain0", "plain1", "plain2"]
    # however late it arrives, a targeted request goes before every untargeted one
    later = targeted(build_request("later", range(400, 405), max_tokens=2, arrival_time=clock.now + 4000),
                     ttft_ms=1000, on_miss="queue")
    scheduler.add_requests([later])
    assert [r.request_id for r in scheduler.waiting] == ["urgent", "later", "plain0", "plain1", "plain2"]


def test_without_targets_the_order_is_arrival_and_nothing_is_capped():
    clock = Clock()
    scheduler, runner = setup(budget=16, max_seqs=4, clock=clock)
    for i, arrival in enumerate([3.0, 1.0, 2.0]):
        scheduler.add_request(build_request(f"r{i}", range(10 * i, 10 * i + 6), max_tokens=2, arrival_time=arrival))
    assert [r.request_id for r in scheduler.waiting] == ["r1", "r2", "r0"]
    assert scheduler.slo.prefill_cap(scheduler.running) is None
    output = scheduler.schedule()
    assert output.total_num_scheduled_tokens == 16  # the whole budget


def test_the_prefill_cap_keeps_a_decoders_tpot_target():
    clock = Clock()
    scheduler, runner = setup(budget=512, max_seqs=8, clock=clock)
    decoder = targeted(build_request("decoder", range(8), max_tokens=40, arrival_time=clock.now),
                       tpot_ms=25.5 / PLAN_MARGIN)  # steps planned to 25.5 ms
    scheduler.add_requests([decoder])
    play(scheduler, runner, clock, until=decoder)
    scheduler.add_request(build_request("long", range(1000, 1400), max_tokens=2, arrival_time=clock.now))
    model = scheduler.slo.cost_model
    for _ in range(5):
        output = scheduler.schedule()
        seconds = model.predict(scheduler.slo.step_work(output, scheduler.requests))
        assert seconds <= 0.0255 + 1e-12 and output.num_scheduled_tokens["long"] >= 16
        scheduler.update_from_output(output, runner.execute(output))
    # the cap: (25.5 ms - the decode step) / 0.7 ms per prompt token, less the attention of the chunk
    assert output.num_scheduled_tokens["long"] < 22


def test_requests_without_targets_hold_a_share_of_the_rows_while_tpot_targets_are_about():
    clock = Clock()
    # a decode step: 10 ms + 0.3 ms a row (+ attention): a target planned to 11.5 ms holds 4 rows; a
    # quarter is 1
    scheduler, runner = setup(budget=64, max_seqs=16, clock=clock)
    tight = targeted(build_request("tight", range(4), max_tokens=300, arrival_time=clock.now),
                     tpot_ms=11.5 / PLAN_MARGIN)
    scheduler.add_requests([tight])
    for i in range(8):
        scheduler.add_request(build_request(f"bulk{i}", range(10 * i + 100, 10 * i + 104), max_tokens=300,
                                            arrival_time=clock.now))
    for _ in range(4):
        output = scheduler.schedule()
        scheduler.update_from_output(output, runner.execute(output))
    assert [r.request_id for r in scheduler.running] == ["tight", "bulk0"] and len(scheduler.waiting) == 7
    output = scheduler.schedule()  # two decode rows
    assert scheduler.slo.cost_model.predict(scheduler.slo.step_work(output, scheduler.requests)) <= 0.0115 + 1e-12
    scheduler.update_from_output(output, runner.execute(output))
    clock.now += 31  # no TPOT target seen for 30 s (TPOT_WINDOW_S): no limit
    for _ in range(3):
        output = scheduler.schedule()
        scheduler.update_from_output(output, runner.execute(output))
    assert len(scheduler.running) == 9 and not scheduler.waiting


def test_a_prefix_cache_hit_is_credited_in_the_prediction():
    clock = Clock()
    scheduler = build_scheduler(num_blocks=512, block_size=4, enable_caching=True, max_num_batched_tokens=16,
                                max_num_seqs=4)
    scheduler.slo = SLOScheduling(known_model(), clock=clock)
    runner = FakeModelRunner(4)
    shared = list(range(500, 540))
    first = build_request("first", shared + [1], max_tokens=2, arrival_time=clock.now)
    scheduler.add_request(first)
    play(scheduler, runner, clock)  # its 40 shared tokens are now cached blocks
    again = targeted(build_request("again", shared + [2], max_tokens=2, arrival_time=clock.now), ttft_ms=1e7)
    scheduler.add_requests([again])
    play(scheduler, runner, clock, until=again)
    assert again.num_cached_tokens == 40
    assert again.slo_state.predicted_ttft == pytest.approx(clock.now - again.arrival_time, rel=1e-9)
    play(scheduler, runner, clock)
    start = clock.now  # a request of the same length without a hit is predicted slower
    cold = targeted(build_request("cold", list(range(600, 641)), max_tokens=2, arrival_time=start), ttft_ms=1e7)
    scheduler.add_requests([cold])
    assert cold.slo_state.predicted_ttft > again.slo_state.predicted_ttft
    play(scheduler, runner, clock, until=cold)
    assert cold.slo_state.predicted_ttft == pytest.approx(clock.now - start, rel=1e-9)


def test_predictions_under_preemption_are_made_and_every_request_finishes():
    clock = Clock()
    # 12 usable blocks of 4 tokens: three requests of 8 + 12 tokens preempt each other
    scheduler = build_scheduler(num_blocks=13, block_size=4, enable_caching=False, max_num_batched_tokens=16,
                                max_num_seqs=4, max_model_len=32)
    scheduler.slo = SLOScheduling(known_model(), clock=clock)
    runner = FakeModelRunner(4)
    for i in range(3):
        scheduler.add_request(build_request(f"r{i}", range(10 * i, 10 * i + 8), max_tokens=12, arrival_time=clock.now))
    for _ in range(6):
        output = scheduler.schedule()
        scheduler.update_from_output(output, runner.execute(output))
    late = targeted(build_request("late", range(300, 308), max_tokens=4, arrival_time=clock.now),
                    ttft_ms=1e7, tpot_ms=1e6)
    scheduler.add_requests([late])
    assert late.slo_state.predicted_ttft > 0
    play(scheduler, runner, clock)
    assert scheduler.num_preemptions >= 1 and not scheduler.has_unfinished_requests()
    assert late.num_output_tokens == 4
