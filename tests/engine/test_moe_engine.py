"""Mixtures of experts through the engine: greedy tokens equal transformers' and do not depend on
batching, chunked prefill, prefix caching or preemption (the tests of test_llm_equivalence.py,
run here on Mixtral, Qwen2-MoE, Qwen3-MoE, GPT-OSS and DeepSeek-V3 checkpoints; DeepSeek-V2 differs from V3 in its router and rotation only,
which test_deepseek.py and the parity tests cover), and in float32 and bfloat16 every
sampled logprob of a request is the same bits alone, in a busy batch and chunked."""

from __future__ import annotations

import shutil

import pytest
import torch

from kvserve import SamplingParams
from engine_helpers import assert_kv_clean, make_llm, random_prompts
from kvserve.testing.checkpoints import store_experts_as_mxfp4
from test_llm_equivalence import (  # noqa: F401 - collected here with this module's model_dir
    solo,
    test_batched_equals_solo,
    test_prefix_cache_hits_equal_solo,
    test_preemption_keeps_outputs_and_is_counted,
    test_preemption_with_prefix_cache_and_chunks,
    test_solo_matches_transformers_greedy,
)

MOE = {
    "DeepseekV3ForCausalLM": dict(initializer_range=0.1),
    "GptOssForCausalLM": dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=64, swiglu_limit=1.5,
                              head_dim=32, sliding_window=6, initializer_range=0.1),
    "MixtralForCausalLM": dict(num_local_experts=4, num_experts_per_tok=2, initializer_range=0.1),
    "Qwen2MoeForCausalLM": dict(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32,
                                shared_expert_intermediate_size=48, initializer_range=0.1),
    "Qwen3MoeForCausalLM": dict(num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32, norm_topk_prob=True,
                                initializer_range=0.1),
}


@pytest.fixture(scope="module", params=sorted(MOE))
def model_dir(request, checkpoint_factory):
    return checkpoint_factory(request.param, seed=3, **MOE[request.param])


SCORED = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_moe_logprobs_alone_equal_batched_and_chunked(checkpoint_factory, model_dir, dtype):
    family = model_dir.name.split("-")[0]
    if dtype == "bfloat16":
        model_dir = checkpoint_factory(family, dtype=dtype, seed=3, **MOE[family])
    assert_logprobs_alone_equal_batched_and_chunked(model_dir, dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_mxfp4_experts_logprobs_alone_equal_batched_and_chunked(checkpoint_factory, tmp_path, dtype):
    """GPT-OSS with its experts in MXFP4 (the released checkpoints' format)."""
    folder = tmp_path / "mxfp4"
    shutil.copytree(checkpoint_factory("GptOssForCausalLM", dtype=dtype, seed=3, **MOE["GptOssForCausalLM"]), folder)
    store_experts_as_mxfp4(folder)
    assert_logprobs_alone_equal_batched_and_chunked(folder, dtype)


def assert_logprobs_alone_equal_batched_and_chunked(model_dir, dtype: str) -> None:
    prompts = random_prompts(7, seed=5, min_len=3, max_len=60)

    def scored(llm, batch):
        return [(o.outputs[0].token_ids, [e.logprob for e in o.outputs[0].logprobs]) for o in llm.generate(batch, SCORED)]

    alone_llm = make_llm(model_dir, dtype=dtype, enable_prefix_caching=False)
    assert alone_llm.llm_engine.core.loaded.dtype == getattr(torch, dtype)
    alone = [scored(alone_llm, [p])[0] for p in prompts]
    assert scored(make_llm(model_dir, dtype=dtype), prompts) == alone
    chunked = make_llm(model_dir, dtype=dtype, max_num_batched_tokens=9, enable_prefix_caching=False)
    assert scored(chunked, prompts[::-1])[::-1] == alone
    assert_kv_clean(chunked)
