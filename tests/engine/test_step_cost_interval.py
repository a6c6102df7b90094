"""The step-cost model learns what requests wait for between their tokens: from one step's start to
the next one's while the engine goes on at once (output processing, streaming and admission
included), and a step's own time when nothing follows it."""

from __future__ import annotations

import time

from kvserve import SamplingParams
from engine_helpers import make_llm, random_prompts

PAUSE = 0.05  # the front end's work between two steps, played by a sleep


def test_the_cost_model_learns_the_interval_between_step_starts(model_dir, monkeypatch):
    llm = make_llm(model_dir)
    engine = llm.llm_engine
    learned = []
    monkeypatch.setattr(engine.core.scheduler.slo.cost_model, "observe",
                        lambda work, seconds: learned.append((work, seconds)))
    engine.add_request("a", random_prompts(1, seed=3)[0], SamplingParams(max_tokens=4, ignore_eos=True))
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
        time.sleep(PAUSE)
    assert steps == 4 and len(learned) == 4
    assert [work.prefill_tokens > 0 for work, _ in learned] == [True, False, False, False]
    assert all(seconds >= PAUSE for _, seconds in learned[:3])  # each up to the next step's start
    assert learned[3][1] < PAUSE  # the last step alone: nothing followed it
