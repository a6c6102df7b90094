"""Greedy outputs must not depend on batching, chunking, prefix caching or preemption: each run
below is compared, token for token, with the same prompts run one at a time."""

from __future__ import annotations

import pytest

from kvserve import SamplingParams
from engine_helpers import assert_kv_clean, make_llm, random_prompts

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
PROMPTS = random_prompts(8, seed=1)  # 3..70 tokens: within one block and across several


def token_ids(outputs):
    return [out.outputs[0].token_ids for out in outputs]


@pytest.fixture(scope="module")
def solo(model_dir):
    llm = make_llm(model_dir, enable_prefix_caching=False)
    results = [token_ids(llm.generate([p], GREEDY))[0] for p in PROMPTS]
    assert_kv_clean(llm)
    return results


def test_solo_matches_transformers_greedy(model_dir, solo):
    import torch
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    for prompt, ours in list(zip(PROMPTS, solo))[:3]:
        # The argmax of each step's logits, the EOS id included (as ignore_eos keeps it: generate's
        # min_new_tokens would mask it instead).
        ids = list(prompt)
        with torch.no_grad():
            for _ in range(len(ours)):
                ids.append(int(reference(torch.tensor([ids])).logits[0, -1].argmax()))
        assert ids[len(prompt):] == ours


@pytest.mark.parametrize(
    "engine_kwargs",
    [
        pytest.param({}, id="batched"),
        pytest.param({"max_num_batched_tokens": 8}, id="chunked-prefill-8"),
        pytest.param({"max_num_batched_tokens": 24, "block_size": 4}, id="chunked-block4"),
        pytest.param({"enable_prefix_caching": False}, id="no-prefix-cache"),
        pytest.param({"max_num_seqs": 3}, id="max-num-seqs-3"),
    ],
)
def test_batched_equals_solo(model_dir, solo, engine_kwargs):
    llm = make_llm(model_dir, **engine_kwargs)
    assert token_ids(llm.generate(PROMPTS, GREEDY)) == solo
    assert_kv_clean(llm)


def test_prefix_cache_hits_equal_solo(model_dir, solo):
    llm = make_llm(model_dir)
    first = token_ids(llm.generate(PROMPTS, GREEDY))
    again = llm.generate(PROMPTS, GREEDY)  # every full prompt block is now cached
    assert first == solo and token_ids(again) == solo
    for prompt, out in zip(PROMPTS, again):
        # A hit never covers the last prompt token: (len - 1) // 16 full blocks are reused.
        assert out.num_cached_tokens == (len(prompt) - 1) // 16 * 16
    assert_kv_clean(llm)


def test_preemption_keeps_outputs_and_is_counted(model_dir, solo):
    # 14 usable blocks of 16 tokens cannot hold 8 requests of up to 94 tokens at once.
    llm = make_llm(model_dir, num_gpu_blocks_override=15, enable_prefix_caching=False)
    assert token_ids(llm.generate(PROMPTS, GREEDY)) == solo
    stats = llm.llm_engine.core.make_stats()
    assert stats.num_preemptions > 0
    assert_kv_clean(llm)


def test_preemption_with_prefix_cache_and_chunks(model_dir, solo):
    llm = make_llm(model_dir, num_gpu_blocks_override=15, max_num_batched_tokens=16)
    assert token_ids(llm.generate(PROMPTS, GREEDY)) == solo
    assert llm.llm_engine.core.make_stats().num_preemptions > 0
    assert_kv_clean(llm)


def test_repeated_prompt_reuses_blocks(model_dir):
    llm = make_llm(model_dir)
    prompt = random_prompts(1, seed=7, min_len=40, max_len=40)[0]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    before = llm.llm_engine.core.make_stats()
    first = llm.generate([prompt], params)[0]
    second = llm.generate([prompt], params)[0]
    after = llm.llm_engine.core.make_stats()
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == 32  # 40 tokens, block 16: two full blocks, never the last token
    assert after.prefix_cache_hits - before.prefix_cache_hits == 32
    assert after.prefix_cache_queries - before.prefix_cache_queries == 80
    assert first.outputs[0].token_ids == second.outputs[0].token_ids
    assert_kv_clean(llm)


def test_cache_salt_isolates(model_dir):
    llm = make_llm(model_dir)
    engine = llm.llm_engine
    prompt = random_prompts(1, seed=8, min_len=40, max_len=40)[0]
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    cached = []
    for request_id, salt in (("a", "tenant-1"), ("b", "tenant-2"), ("c", "tenant-1")):
        engine.add_request(request_id, prompt, params, cache_salt=salt)
        while engine.has_unfinished_requests():
            for delta in engine.step().outputs:
                if delta.finished:
                    cached.append(delta.num_cached_tokens)
    assert cached == [0, 0, 32]
