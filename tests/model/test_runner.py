"""ModelRunner: the flat batch layout, cache sizing, the persistent batch across steps, and
sampling inside ``execute_model``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from model_fixtures import flat_prompt_logits

from kvserve.model.loader import load_model
from kvserve.model.model_inputs import make_flat_batch
from kvserve.model.kv_cache_layout import kv_cache_bytes_per_block
from kvserve.model.runner import ModelRunner
from kvserve.sampling_params import SamplingParams
from kvserve.request import Request
from kvserve.scheduler.output import CachedRequestData, NewRequestData, SchedulerOutput

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture
def runner(tiny_checkpoint):
    path, _ = tiny_checkpoint("llama")
    return ModelRunner(load_model(path), num_blocks=16, block_size=4)


def new_request(req_id, prompt, block_ids, computed=0, params=GREEDY, output=(), max_tokens=16):
    spec = Request.of(req_id, list(prompt), params, max_tokens=max_tokens).spec
    return NewRequestData(spec, list(output), list(block_ids), computed)


def step(new=(), cached=CachedRequestData(), scheduled=None, finished=(), preempted=()):
    scheduled = dict(scheduled or {})
    return SchedulerOutput(list(new), cached, scheduled, sum(scheduled.values()), set(finished), set(preempted))


def test_kv_cache_shape_and_bytes(runner):
    assert len(runner.kv_caches) == 2
    assert runner.kv_caches[0].shape == (2, 16, 4, 2, 16) and runner.kv_caches[0].dtype == torch.float32
    per_block = kv_cache_bytes_per_block(runner.arch, 4, torch.float32)
    assert per_block == 2 * 2 * 4 * 2 * 16 * 4
    assert per_block * 16 == sum(c.numel() * c.element_size() for c in runner.kv_caches)
    assert kv_cache_bytes_per_block(runner.arch, 16, torch.bfloat16) == 2 * 2 * 16 * 2 * 16 * 2


def test_flat_batch_layout():
    tokens = np.zeros((3, 8), dtype=np.int64)
    tokens[0, :7] = [10, 11, 12, 13, 14, 15, 16]  # chunk 2 of a prompt: computed 3, 3 new
    tokens[1, :5] = [20, 21, 22, 23, 24]  # decode: computed 4 of 5 tokens
    tokens[2, :2] = [30, 31]  # whole prompt
    tables = np.array([[9, 2], [5, 7], [11, 0]])
    flat = make_flat_batch(tokens, np.array([3, 4, 0]), np.array([3, 1, 2]), tables, 4,
                           np.array([False, True, True]))
    assert flat.input_ids.tolist() == [13, 14, 15, 24, 30, 31]
    assert flat.positions.tolist() == [3, 4, 5, 4, 0, 1]
    # slot = block_ids[p // 4] * 4 + p % 4
    assert flat.slot_mapping.tolist() == [9 * 4 + 3, 2 * 4 + 0, 2 * 4 + 1, 7 * 4 + 0, 44, 45]
    assert flat.query_start_loc.tolist() == [0, 3, 4, 6] and flat.seq_lens.tolist() == [6, 5, 2]
    assert flat.logits_indices.tolist() == [3, 5]  # the sampling requests' last tokens


def test_too_few_blocks_fails_that_request_only(runner):
    out = runner.execute_model(step([new_request("r", range(9), [1, 2])], scheduled={"r": 9}))
    assert "2 blocks of 4 tokens cannot hold 9 tokens" in out.errors["r"]
    assert out.sampled_token_ids == {}


def test_execute_model_samples_the_argmax_of_each_request(tiny_checkpoint):
    """Greedy tokens of a step equal the argmax of each prompt's last-position logits from a
    separate run with other block ids; the persistent batch then decodes on from its own tokens."""
    path, _ = tiny_checkpoint("llama")
    prompts = [[5, 6, 7, 8, 9], [40, 41], [70, 71, 72, 73, 74, 75]]
    reference = ModelRunner(load_model(path), num_blocks=16, block_size=4)
    expected = [int(logits[-1].argmax()) for logits in flat_prompt_logits(reference, prompts, [[1, 2], [3], [4, 5]])]
    runner = ModelRunner(load_model(path), num_blocks=16, block_size=4)
    tables = [[6, 7], [8], [10, 9]]
    news = [new_request(str(i), p, b) for i, (p, b) in enumerate(zip(prompts, tables))]
    out = runner.execute_model(step(news, scheduled={str(i): len(p) for i, p in enumerate(prompts)}))
    assert out.sampled_token_ids == {str(i): [t] for i, t in enumerate(expected)} and out.errors == {}
    # Step 2: request 1 decodes (needs no new block), 0 and 2 are not scheduled (keep their state).
    out2 = runner.execute_model(step(cached=CachedRequestData(["1"], [[]], [2]), scheduled={"1": 1}))
    full = prompts[1] + [expected[1]]
    next_token = int(flat_prompt_logits(reference, [full], [[11]])[0][-1].argmax())
    assert out2.sampled_token_ids == {"1": [next_token]}
    assert runner.input_batch.req_ids == ["1"] and set(runner.requests) == {"0", "1", "2"}
    # Step 3: request 0 comes back with a new block for its 7th token.
    out3 = runner.execute_model(step(cached=CachedRequestData(["0"], [[12]], [5]), scheduled={"0": 1},
                                     finished={"2"}))
    full0 = prompts[0] + [expected[0]]
    assert out3.sampled_token_ids == {"0": [int(flat_prompt_logits(reference, [full0], [[13, 14]])[0][-1].argmax())]}
    assert set(runner.requests) == {"0", "1"} and runner.input_batch.req_ids == ["0"]


def test_mid_prompt_chunk_samples_nothing(runner):
    out = runner.execute_model(step([new_request("r", [1, 2, 3, 4, 5], [1, 2])], scheduled={"r": 2}))
    assert out.sampled_token_ids == {} and out.errors == {}


def test_preempted_request_keeps_its_generator(runner):
    """A seeded request's generator survives preemption (its random stream continues); a
    finished request's is dropped."""
    params = SamplingParams(temperature=1.0, seed=7)
    runner.execute_model(step([new_request("s", [1, 2, 3], [1], params=params)], scheduled={"s": 3}))
    generator = runner.generators["s"]
    runner.execute_model(step(preempted={"s"}))
    assert "s" not in runner.requests and runner.generators["s"] is generator
    runner.execute_model(step([new_request("s", [1, 2, 3], [2], params=params, output=[9])], scheduled={"s": 4}))
    assert runner.requests["s"].generator is generator
    runner.execute_model(step(finished={"s"}))
    assert "s" not in runner.generators
