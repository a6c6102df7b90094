"""Pooling requests through the scheduler: batched together in one step, bit-identical alone and
batched (float32 and bfloat16, encoders and decoders, mixed lengths), whole prompts per step,
no prefix caching, an encoder's KV cache of zero bytes, a failure that stays with its request."""

from __future__ import annotations

import random

import pytest
import torch

from pooling_helpers import TEXTS, make_llm
from kvserve.pooling.params import PoolingParams


def _prompts(count: int, seed: int, vocab: int, low: int = 5) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(low, vocab) for _ in range(rng.randint(1, 60))] for _ in range(count)]


def _vectors(llm, prompts) -> list[torch.Tensor]:
    return [o.outputs.data for o in llm.encode(prompts, pooling_task="embed", use_tqdm=False)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("model", ["bert_cls", "xlmr_mean", "qwen3_last"])
def test_alone_and_batched_are_bit_identical(request, model, dtype):
    folder = request.getfixturevalue(model)
    llm = make_llm(folder, dtype=dtype)
    vocab = min(llm.llm_engine.vocab_size, 260)
    prompts = _prompts(7, seed=11, vocab=vocab) + [{"prompt": t} for t in TEXTS]
    alone = [_vectors(llm, [p])[0] for p in prompts]
    batched = _vectors(llm, prompts)
    reversed_batch = _vectors(llm, prompts[::-1])[::-1]
    for a, b, c in zip(alone, batched, reversed_batch, strict=True):
        assert a.dtype == torch.float32
        assert torch.equal(a, b) and torch.equal(a, c)


def test_a_call_runs_in_one_step_with_the_kv_cache_clean_after(bert_cls):
    llm = make_llm(bert_cls, max_num_batched_tokens=1024)
    engine = llm.llm_engine
    prompts = _prompts(5, seed=2, vocab=260)
    requests = [engine.input_processor.process_pooling(f"r{i}", p, PoolingParams()) for i, p in enumerate(prompts)]
    engine.add_requests(requests)
    step = engine.step()
    assert step.stats.num_requests == 5 and step.stats.num_prefill_tokens == sum(map(len, prompts))
    assert sorted(o.request_id for o in step.outputs if o.finished) == sorted(r.request_id for r in requests)
    assert not engine.has_unfinished_requests()
    manager = engine.core.kv_cache_manager
    manager.check_integrity()
    assert manager.usage == 0.0 and manager.stats.queries == 0  # no prefix caching for pooling runs


def test_an_encoder_keeps_no_kv_cache_and_its_blocks_only_count(bert_cls):
    core = make_llm(bert_cls, max_num_seqs=4).llm_engine.core
    assert core.loaded.num_kv_heads == 0
    assert all(cache.numel() == 0 for cache in core.runner.kv_caches)
    blocks_per_seq = -(-core.max_model_len // core.kv_plan.block_size)
    assert core.kv_plan.num_blocks == blocks_per_seq * 4 + 1 and core.kv_plan.bytes_per_block == 0
    assert not core.config.cache.enable_prefix_caching and not core.config.scheduler.enable_chunked_prefill


def test_a_long_prompt_is_never_chunked(qwen3_last):
    llm = make_llm(qwen3_last, max_num_batched_tokens=16)
    engine = llm.llm_engine
    long_prompt = _prompts(1, seed=5, vocab=900)[0] * 3
    assert len(long_prompt) > 16
    engine.add_requests([engine.input_processor.process_pooling("long", long_prompt, PoolingParams())])
    step = engine.step()
    assert step.stats.num_prefill_tokens == len(long_prompt)
    assert [o.request_id for o in step.outputs if o.finished] == ["long"]


def test_a_failing_request_fails_alone(bert_cls):
    llm = make_llm(bert_cls)
    prompts = _prompts(4, seed=8, vocab=260)
    solo = _vectors(llm, prompts)
    llm.llm_engine.core.runner.faults.fail("pool", "-boom")
    engine = llm.llm_engine
    ids = ["a", "b-boom", "c", "d"]
    engine.add_requests([engine.input_processor.process_pooling(i, p, PoolingParams()) for i, p in zip(ids, prompts)])
    finals = {}
    while engine.has_unfinished_requests():
        finals.update({o.request_id: o for o in engine.step().outputs if o.finished})
    assert finals["b-boom"].outputs is None and "injected fault at pool" in finals["b-boom"].error
    for request_id, vector in zip(ids, solo):
        if request_id != "b-boom":
            assert finals[request_id].error is None and torch.equal(finals[request_id].outputs.data, vector)
