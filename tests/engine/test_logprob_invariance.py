"""The sampled logprobs of a greedy request, bit for bit, do not depend on how it was run: alone
(one thread) or batched with others (two threads), in prefill chunks, from the prefix cache, or
preempted and recomputed, in float32 and in bfloat16.

This is what the batch-invariant CPU linears (``kvserve.model.invariant_linear``) and the
``cpu_paged`` attention kernel (each query row computed alone, in an order fixed by absolute
position) promise together. The model is wide where the libraries' kernels broke it: a down_proj
of 4,864 inputs (Qwen2.5-0.5B's; MKL's float32 and oneDNN's bf16 one-row kernels summed it in
another order than their batched ones) and a QKV bias.
"""

from __future__ import annotations

import pytest
import torch

from kvserve import SamplingParams
from kvserve.attention import CpuPagedAttentionBackend, cpu_paged_available
from kvserve.model.invariant_linear import InvariantLinear
from engine_helpers import assert_kv_clean, make_llm, random_prompts

pytestmark = pytest.mark.skipif(not cpu_paged_available(), reason="no C++ compiler for the kernels")

WIDE = dict(hidden_size=128, intermediate_size=4864, num_attention_heads=4, num_key_value_heads=2,
            initializer_range=0.05)
SCORED = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=0)


def scored(outputs):
    """(token ids, sampled logprobs) of each output, in order."""
    return [(o.outputs[0].token_ids, [e.logprob for e in o.outputs[0].logprobs]) for o in outputs]


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_logprobs_alone_batched_chunked_cached_preempted_equal(checkpoint_factory, dtype, two_threads):
    model_dir = checkpoint_factory("Qwen2ForCausalLM", dtype=dtype, **WIDE)
    prompts = random_prompts(6, seed=13, min_len=3, max_len=90)

    torch.set_num_threads(1)
    solo_llm = make_llm(model_dir, dtype=dtype, enable_prefix_caching=False)
    model = solo_llm.llm_engine.core.loaded.model
    assert isinstance(model.model.layers[0].self_attn.backend, CpuPagedAttentionBackend)
    assert isinstance(model.model.layers[0].mlp.down_proj, InvariantLinear)
    assert isinstance(model.lm_head, InvariantLinear)
    solo = [scored(solo_llm.generate([p], SCORED))[0] for p in prompts]

    torch.set_num_threads(2)
    batched = make_llm(model_dir, dtype=dtype, enable_prefix_caching=True)
    assert scored(batched.generate(prompts, SCORED)) == solo
    again = batched.generate(prompts[::-1], SCORED)  # prefix-cache hits, other order
    assert scored(again)[::-1] == solo
    assert sum(o.num_cached_tokens for o in again) > 0
    chunked = make_llm(model_dir, dtype=dtype, max_num_batched_tokens=7, enable_prefix_caching=False)
    assert scored(chunked.generate(prompts, SCORED)) == solo
    assert_kv_clean(chunked)
    preempted = make_llm(model_dir, dtype=dtype, num_gpu_blocks_override=12, max_num_batched_tokens=16,
                         enable_prefix_caching=False)
    assert scored(preempted.generate(prompts, SCORED)) == solo
    assert preempted.llm_engine.core.make_stats().num_preemptions > 0
    assert_kv_clean(preempted)
