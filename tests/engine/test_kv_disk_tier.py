"""The disk tier (--kv-offload-dir) on a real engine: outputs are identical, bit for bit (token ids
and logprobs, float32 and bfloat16, greedy and seeded sampling), whether a prefix is computed,
hit in the pool, or loaded from the disk tier after a restart or after the pool evicted it; the
tier is keyed by the model's fingerprint (another dtype is a miss, never wrong KV)."""

from __future__ import annotations

import pytest

from kvserve import SamplingParams
from engine_helpers import assert_kv_clean, make_llm, random_prompts

SHARED = random_prompts(1, seed=11, min_len=100, max_len=100)[0]
PROMPTS = [SHARED + tail for tail in random_prompts(4, seed=12, min_len=5, max_len=40)]
PARAMS = [SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=2),
          SamplingParams(temperature=1.0, seed=3, max_tokens=10, ignore_eos=True, logprobs=2)]


def results(llm, params):
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    return [(o.outputs[0].token_ids, [lp for lp in o.outputs[0].logprobs]) for o in outputs]


def loaded_tokens(llm) -> int:
    return llm.llm_engine.core.make_stats().kv_transfer.hits_by_source.get("disk", 0)


@pytest.fixture(params=["float32", "bfloat16"])
def dtype(request):
    return request.param


def test_a_restarted_engine_loads_its_prefixes_from_disk_with_identical_outputs(model_dir, tmp_path, dtype):
    reference = make_llm(model_dir, dtype=dtype, enable_prefix_caching=False)
    expected = [results(reference, params) for params in PARAMS]
    first = make_llm(model_dir, dtype=dtype, kv_offload_dir=str(tmp_path))
    assert [results(first, params) for params in PARAMS] == expected
    assert loaded_tokens(first) == 0  # the first run fills the tier (and hits its own pool)
    assert_kv_clean(first)
    first.llm_engine.core.shutdown()  # writes what is queued
    restarted = make_llm(model_dir, dtype=dtype, kv_offload_dir=str(tmp_path))
    outputs = restarted.generate(PROMPTS, PARAMS[0], use_tqdm=False)
    assert [(o.outputs[0].token_ids, list(o.outputs[0].logprobs)) for o in outputs] == expected[0]
    assert loaded_tokens(restarted) >= 6 * 16  # at least the shared prefix's full blocks
    assert all(o.num_cached_tokens >= 6 * 16 for o in outputs)  # usage counts loaded tokens as cached
    assert results(restarted, PARAMS[1]) == expected[1]
    assert_kv_clean(restarted)
    restarted.llm_engine.core.shutdown()


def test_prefixes_the_pool_evicted_come_back_from_disk(model_dir, tmp_path):
    prompts = random_prompts(12, seed=21, min_len=60, max_len=90)  # ~70 blocks: over 2x the pool
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=1)
    small = dict(num_gpu_blocks_override=32, max_num_seqs=2)
    reference = make_llm(model_dir, enable_prefix_caching=False, **small)
    expected = [(o.outputs[0].token_ids, list(o.outputs[0].logprobs)) for o in reference.generate(prompts, params)]
    llm = make_llm(model_dir, kv_offload_dir=str(tmp_path), **small)
    for _ in range(2):  # the second round's prefixes were evicted from the pool by the first round's
        got = [(o.outputs[0].token_ids, list(o.outputs[0].logprobs)) for o in llm.generate(prompts, params)]
        assert got == expected
        llm.llm_engine.core.kv_transfer.connector.sinks[0].flush()
    assert loaded_tokens(llm) > 0
    stats = llm.llm_engine.core.make_stats()
    assert stats.kv_transfer.external_hits == loaded_tokens(llm) and stats.kv_transfer.external_queries > 0
    assert_kv_clean(llm)
    llm.llm_engine.core.shutdown()


def test_another_dtype_is_a_miss_and_prompt_logprobs_compute_every_position(model_dir, tmp_path):
    writer = make_llm(model_dir, dtype="float32", kv_offload_dir=str(tmp_path))
    writer.generate(PROMPTS, PARAMS[0], use_tqdm=False)
    writer.llm_engine.core.shutdown()
    other = make_llm(model_dir, dtype="bfloat16", kv_offload_dir=str(tmp_path))
    other.generate(PROMPTS, PARAMS[0], use_tqdm=False)
    assert loaded_tokens(other) == 0  # bfloat16 blocks are another fingerprint's folder
    other.llm_engine.core.shutdown()
    same = make_llm(model_dir, dtype="float32", kv_offload_dir=str(tmp_path))
    scoring = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=1)
    reference = make_llm(model_dir, dtype="float32", enable_prefix_caching=False)
    want = reference.generate(PROMPTS[:1], scoring, use_tqdm=False)[0].prompt_logprobs
    assert same.generate(PROMPTS[:1], scoring, use_tqdm=False)[0].prompt_logprobs == want
    assert loaded_tokens(same) == 0
    same.llm_engine.core.shutdown()


def test_a_host_tier_holds_what_the_pool_evicted_before_the_disk(model_dir, tmp_path):
    prompts = random_prompts(12, seed=21, min_len=60, max_len=90)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=1)
    small = dict(num_gpu_blocks_override=32, max_num_seqs=2)
    reference = make_llm(model_dir, enable_prefix_caching=False, **small)
    expected = [(o.outputs[0].token_ids, list(o.outputs[0].logprobs)) for o in reference.generate(prompts, params)]
    llm = make_llm(model_dir, kv_offloading_size=0.01, kv_offload_dir=str(tmp_path), **small)
    for _ in range(2):
        got = [(o.outputs[0].token_ids, list(o.outputs[0].logprobs)) for o in llm.generate(prompts, params)]
        assert got == expected
    hits = llm.llm_engine.core.make_stats().kv_transfer.hits_by_source
    assert hits.get("host", 0) > 0 and hits.get("disk", 0) == 0  # the host tier is looked up first
    assert_kv_clean(llm)
    llm.llm_engine.core.shutdown()
