"""Greedy speculative decoding gives the non-speculative output token for token, with the same
logprob bits: n-gram and draft-model proposals, forced proposals (all accepted, none, random
prefixes), several checkpoints, mixed batches, preemption on a tiny KV cache, prefix caching,
chunked prefill, ``n > 1``, stop strings and stop tokens inside accepted drafts, ``max_tokens``.
Every speculative run checks the KV cache after every step (``check_kv_integrity``)."""

from __future__ import annotations

import pytest

from kvserve import SamplingParams
from kvserve.testing.spec_decode import ForcedProposer, reference_drafts
from spec_helpers import NGRAM, copy_prompts, generate_checked, make_llm, results, spec_stats

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=2)
PROMPTS = copy_prompts(6, seed=7)


@pytest.fixture(scope="module")
def reference(tiny_llama):
    return results(make_llm(tiny_llama).generate(PROMPTS, GREEDY))


def reference_map(prompts, ref) -> dict:
    return {tuple(p): r[0][0] for p, r in zip(prompts, ref)}


@pytest.mark.parametrize("kind", ["llama", "llama_bf16", "qwen2", "qwen3", "mistral_tekken", "llama_sentencepiece"])
def test_ngram_greedy_equals_plain_on_checkpoints(request, kind, reference):
    """The n-gram proposer on six checkpoints (float32 and bfloat16, biases, q/k norms, tokenizers
    of 1k to 131k tokens); the K/V checked after every step on the first."""
    fixture = {"llama": "tiny_llama", "llama_bf16": "tiny_llama_bf16", "qwen2": "tiny_qwen2", "qwen3": "tiny_qwen3",
               "mistral_tekken": "tiny_mistral_tekken", "llama_sentencepiece": "tiny_llama_sentencepiece"}[kind]
    model_dir = request.getfixturevalue(fixture)
    dtype = "bfloat16" if kind.endswith("bf16") else "float32"
    plain = reference if kind == "llama" else results(make_llm(model_dir, dtype=dtype).generate(PROMPTS, GREEDY))
    spec = make_llm(model_dir, dtype=dtype, speculative_config=NGRAM)
    got = generate_checked(spec, PROMPTS, GREEDY) if kind == "llama" else spec.generate(PROMPTS, GREEDY)
    assert results(got) == plain
    stats = spec_stats(spec)
    assert stats.num_drafts > 0 and stats.num_draft_tokens >= stats.num_accepted_tokens


def test_draft_model_greedy_equals_plain(tiny_llama, checkpoint_factory, reference):
    same = make_llm(tiny_llama, speculative_config={"method": "draft_model", "model": str(tiny_llama),
                                                     "num_speculative_tokens": 3})
    assert results(generate_checked(same, PROMPTS, GREEDY)) == reference
    stats = spec_stats(same)
    assert stats.num_draft_tokens > 0 and stats.acceptance_rate == 1.0  # the target drafting for itself
    other = checkpoint_factory("LlamaForCausalLM", seed=3, num_hidden_layers=1)  # another model, same vocabulary
    small = make_llm(tiny_llama, speculative_config={"method": "draft_model", "model": str(other),
                                                      "num_speculative_tokens": 4, "min_acceptance_rate": 0})
    assert results(generate_checked(small, PROMPTS, GREEDY)) == reference
    assert spec_stats(small).num_draft_tokens > 0


@pytest.mark.parametrize("mode", ["all", "none", "prefix"])
def test_forced_proposals(tiny_llama, reference, mode):
    llm = make_llm(tiny_llama, speculative_config=NGRAM)
    llm.llm_engine.core.proposer = ForcedProposer(reference_drafts(reference_map(PROMPTS, reference), 4, mode))
    assert results(generate_checked(llm, PROMPTS, GREEDY)) == reference
    stats = spec_stats(llm)
    assert stats.num_draft_tokens > 0
    if mode == "all":
        assert stats.acceptance_rate == 1.0 and stats.num_drafts <= 6 * 24 / 5 + 6
    elif mode == "none":
        assert stats.num_accepted_tokens == 0
    else:
        assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens


def test_mixed_batch_with_every_feature(tiny_llama):
    """Greedy and seeded requests, logprobs, prompt logprobs, n = 2, stop tokens, min_tokens,
    max_tokens 1-3, in one batch: the same results as without speculation."""
    params = [
        GREEDY,
        SamplingParams(temperature=0.8, seed=11, max_tokens=20, ignore_eos=True, logprobs=1),
        SamplingParams(temperature=0, max_tokens=16, prompt_logprobs=2, logprobs=0),
        SamplingParams(temperature=1.0, seed=3, n=2, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=3, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=1, ignore_eos=True),
    ]
    plain = results(make_llm(tiny_llama).generate(PROMPTS, params))
    spec = make_llm(tiny_llama, speculative_config=NGRAM)
    assert results(spec.generate(PROMPTS, params)) == plain
    assert [len(r[0][0]) for r in results(spec.generate(PROMPTS, params))][4:] == [3, 1]


def test_preemption_on_a_tiny_kv_cache(tiny_llama, reference):
    llm = make_llm(tiny_llama, num_gpu_blocks_override=9, speculative_config=NGRAM)
    llm.llm_engine.core.proposer = ForcedProposer(reference_drafts(reference_map(PROMPTS, reference), 4, "prefix"))
    assert results(generate_checked(llm, PROMPTS, GREEDY)) == reference
    assert llm.llm_engine.core.scheduler.num_preemptions > 0
    draft = make_llm(tiny_llama, num_gpu_blocks_override=9,
                     speculative_config={"method": "draft_model", "model": str(tiny_llama), "num_speculative_tokens": 3})
    assert results(generate_checked(draft, PROMPTS, GREEDY)) == reference
    assert draft.llm_engine.core.scheduler.num_preemptions > 0


DRAFT = {"method": "draft_model", "model": None, "num_speculative_tokens": 3}


@pytest.mark.parametrize("kwargs, method", [({}, "ngram"), ({"max_num_batched_tokens": 8}, "draft_model"),
                                            ({"long_prefill_token_threshold": 5}, "ngram")],
                         ids=["whole-prefill", "budget-8", "chunk-threshold-5"])
def test_prefix_caching_and_chunked_prefill(tiny_llama, kwargs, method):
    """A shared prefix, prompts then run again in reverse order (prefix-cache hits), prefills
    chunked by a tiny budget (drafts and chunks share it) or a chunk threshold."""
    shared = copy_prompts(1, seed=99)[0] * 2
    prompts = [shared + p for p in PROMPTS[:3]]
    plain = results(make_llm(tiny_llama, enable_prefix_caching=False).generate(prompts, GREEDY))
    config = NGRAM if method == "ngram" else {**DRAFT, "model": str(tiny_llama)}
    llm = make_llm(tiny_llama, speculative_config=config, **kwargs)
    assert results(generate_checked(llm, prompts, GREEDY)) == plain
    again = generate_checked(llm, prompts[::-1], GREEDY)  # prefix-cache hits
    assert results(again)[::-1] == plain
    assert sum(o.num_cached_tokens for o in again) > 0 and spec_stats(llm).num_accepted_tokens > 0


def test_max_tokens_is_never_exceeded(tiny_llama, reference):
    llm = make_llm(tiny_llama, speculative_config=NGRAM)
    llm.llm_engine.core.proposer = ForcedProposer(reference_drafts(reference_map(PROMPTS, reference), 4))
    for max_tokens in range(1, 8):
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=0)
        got = results(llm.generate(PROMPTS, params))
        assert [r[0][0] for r in got] == [r[0][0][:max_tokens] for r in reference]
        assert all(r[0][2] == "length" for r in got)


def test_stop_strings_and_stop_token_ids_inside_accepted_drafts(tiny_llama, reference):
    """With every draft accepted, several tokens arrive per step: a stop token or a stop string
    completed by a token in the middle of them ends the output there, as without speculation."""
    plain_llm = make_llm(tiny_llama)
    llm = make_llm(tiny_llama, speculative_config=NGRAM)
    llm.llm_engine.core.proposer = ForcedProposer(reference_drafts(reference_map(PROMPTS, reference), 4))
    for i, prompt in enumerate(PROMPTS[:3]):
        tokens, _, _, text = reference[i][0]
        stop_text = text[len(text) // 2 : len(text) // 2 + 3]
        for params in (SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop_token_ids=[tokens[9]]),
                       SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop=[stop_text], logprobs=0),
                       SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop=[stop_text],
                                      include_stop_str_in_output=True)):
            plain = plain_llm.generate([prompt], params)
            got = llm.generate([prompt], params)
            assert results(got) == results(plain)
            assert (got[0].outputs[0].finish_reason, got[0].outputs[0].stop_reason) == (
                plain[0].outputs[0].finish_reason, plain[0].outputs[0].stop_reason)
            assert got[0].outputs[0].finish_reason == "stop"
