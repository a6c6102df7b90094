"""ModelRunner: the flat batch it builds, cache sizing, and logits selection."""

from __future__ import annotations

import pytest
import torch
from model_fixtures import flat_prompt_logits

from kvserve.model.loader import load_model
from kvserve.model.runner import ModelRunner, kv_cache_bytes_per_block
from kvserve.request import Request
from kvserve.sampling_params import SamplingParams
from kvserve.scheduler.output import ScheduledRequest, SchedulerOutput


@pytest.fixture
def runner(tiny_checkpoint):
    path, _ = tiny_checkpoint("llama")
    return ModelRunner(load_model(path), num_blocks=16, block_size=4)


def step(*scheduled):
    return SchedulerOutput(list(scheduled), sum(s.num_new_tokens for s in scheduled))


def test_kv_cache_shape_and_bytes(runner):
    assert len(runner.kv_caches) == 2
    assert runner.kv_caches[0].shape == (2, 16, 4, 2, 16) and runner.kv_caches[0].dtype == torch.float32
    per_block = kv_cache_bytes_per_block(runner.arch, 4, torch.float32)
    assert per_block == 2 * 2 * 4 * 2 * 16 * 4
    assert per_block * 16 == sum(c.numel() * c.element_size() for c in runner.kv_caches)
    assert kv_cache_bytes_per_block(runner.arch, 16, torch.bfloat16) == 2 * 2 * 16 * 2 * 16 * 2


def test_prepare_inputs_layout(runner):
    a = Request("a", [10, 11, 12, 13, 14, 15, 16], SamplingParams())  # chunk 2 of a prompt
    b = Request("b", [20, 21, 22], SamplingParams())
    b.append_output_token_ids([23, 24])  # decode: computed 4 of 5 tokens
    c = Request("c", [30, 31], SamplingParams())  # whole prompt
    inputs = runner.prepare_inputs(
        step(ScheduledRequest(a, 3, 3, [9, 2]), ScheduledRequest(b, 4, 1, [5, 7]), ScheduledRequest(c, 0, 2, [11]))
    )
    assert inputs.input_ids.tolist() == [13, 14, 15, 24, 30, 31]
    assert inputs.positions.tolist() == [3, 4, 5, 4, 0, 1]
    # slot = block_ids[p // 4] * 4 + p % 4
    assert inputs.attn_metadata.slot_mapping.tolist() == [9 * 4 + 3, 2 * 4 + 0, 2 * 4 + 1, 7 * 4 + 0, 44, 45]
    meta = inputs.attn_metadata
    assert meta.query_start_loc.tolist() == [0, 3, 4, 6] and meta.query_start_loc.dtype == torch.int32
    assert meta.seq_lens.tolist() == [6, 5, 2] and meta.seq_lens_cpu.tolist() == [6, 5, 2]
    assert meta.block_tables.tolist() == [[9, 2], [5, 7], [11, 0]]
    assert (meta.max_query_len, meta.max_seq_len) == (3, 6)
    # a stops mid-prompt (6 of 7 tokens): no sampling; b and c sample at their last token.
    assert inputs.logits_indices.tolist() == [3, 5]


def test_too_few_blocks_is_a_scheduler_bug(runner):
    r = Request("r", list(range(9)), SamplingParams())
    with pytest.raises(ValueError, match="2 blocks of 4 tokens cannot hold 9 tokens"):
        runner.prepare_inputs(step(ScheduledRequest(r, 0, 9, [0, 1])))


def test_execute_model_returns_sampling_rows_in_order(tiny_checkpoint):
    """Logits of the sampling requests, in scheduled order, equal each prompt's last-position logits
    from a separate run with other block ids."""
    path, _ = tiny_checkpoint("llama")
    prompts = [[5, 6, 7, 8, 9], [40, 41], [70, 71, 72, 73, 74, 75]]
    first = ModelRunner(load_model(path), num_blocks=16, block_size=4)
    expected = torch.stack([logits[-1] for logits in flat_prompt_logits(first, prompts, [[0, 1], [2], [3, 4]])])
    second = ModelRunner(load_model(path), num_blocks=16, block_size=4)
    reqs = [Request(str(i), p, SamplingParams()) for i, p in enumerate(prompts)]
    logits = second.execute_model(
        step(*(ScheduledRequest(r, 0, r.num_tokens, b) for r, b in zip(reqs, [[6, 7], [8], [10, 9]])))
    )
    assert logits.shape == (3, 256) and logits.dtype == torch.float32
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)


def test_mid_prompt_chunk_samples_nothing(runner):
    r = Request("r", [1, 2, 3, 4, 5], SamplingParams())
    logits = runner.execute_model(step(ScheduledRequest(r, 0, 2, [0, 1])))
    assert logits.shape == (0, 256)
