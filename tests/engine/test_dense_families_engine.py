"""The dense families on the Llama network's hooks (Gemma 2, Gemma 3, Granite, SmolLM3, OLMo 2, Phi-3)
through the engine: greedy tokens equal transformers' and do not depend on batching, chunked
prefill, prefix caching or preemption (test_llm_equivalence.py's tests, run here on each); for the
families whose attention differs (Gemma's soft-capping, windows, rope per layer type) every sampled
logprob is the same bits alone, in a busy batch and chunked, in float32 and bfloat16."""

from __future__ import annotations

import pytest

from engine_helpers import assert_kv_clean, make_llm, random_prompts
from kvserve import SamplingParams
from test_llm_equivalence import (  # noqa: F401 - collected here with this module's model_dir
    solo,
    test_batched_equals_solo,
    test_preemption_with_prefix_cache_and_chunks,
    test_prefix_cache_hits_equal_solo,
    test_solo_matches_transformers_greedy,
)

FAMILIES = {
    # head_dim 32: the attention kernel's bfloat16 tiles (and AMX where the CPU has them) take it.
    "Gemma2ForCausalLM": dict(initializer_range=0.1, head_dim=32, sliding_window=6, attn_logit_softcapping=3.0,
                              final_logit_softcapping=5.0),
    "Gemma3ForCausalLM": dict(initializer_range=0.1, head_dim=32, sliding_window=6, query_pre_attn_scalar=24,
                              layer_types=["sliding_attention", "full_attention"],
                              rope_parameters={"full_attention": dict(rope_type="linear", factor=2.0,
                                                                      rope_theta=1_000_000.0),
                                               "sliding_attention": dict(rope_type="default", rope_theta=10_000.0)}),
    "GraniteForCausalLM": dict(embedding_multiplier=12.0, attention_multiplier=0.015625, residual_multiplier=0.22,
                               logits_scaling=8.0, initializer_range=0.1),
    "Olmo2ForCausalLM": dict(initializer_range=0.1),
    "Phi3ForCausalLM": dict(initializer_range=0.1, rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                                                        partial_rotary_factor=0.5)),
    "SmolLM3ForCausalLM": dict(num_hidden_layers=4, no_rope_layer_interval=2, initializer_range=0.1),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def model_dir(request, checkpoint_factory):
    return checkpoint_factory(request.param, seed=6, **FAMILIES[request.param])


SCORED = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=0)


@pytest.mark.parametrize("family", ["Gemma2ForCausalLM", "Gemma3ForCausalLM"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_logprob_bits_alone_equal_batched_and_chunked(checkpoint_factory, family, dtype):
    model_dir = checkpoint_factory(family, dtype=dtype, seed=6, **FAMILIES[family])
    prompts = random_prompts(7, seed=5, min_len=3, max_len=60)

    def scored(llm, batch):
        return [(o.outputs[0].token_ids, [e.logprob for e in o.outputs[0].logprobs]) for o in llm.generate(batch, SCORED)]

    alone_llm = make_llm(model_dir, dtype=dtype, enable_prefix_caching=False)
    alone = [scored(alone_llm, [p])[0] for p in prompts]
    assert scored(make_llm(model_dir, dtype=dtype), prompts) == alone
    chunked = make_llm(model_dir, dtype=dtype, max_num_batched_tokens=9, enable_prefix_caching=False)
    assert scored(chunked, prompts[::-1])[::-1] == alone
    assert_kv_clean(chunked)
