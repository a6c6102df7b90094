"""bfloat16 engine (``--dtype auto`` on AMX CPUs) with the ``cpu_paged`` attention kernel: greedy
outputs are bit-identical whatever the batch, the chunking, prefix-cache hits or preemption.

This holds because each query row's attention is computed alone with a fixed reduction order and
every output element of the linears is one fixed sequence of FMAs whatever the number of rows
(``kvserve.model.invariant_linear``). float32 is covered by ``test_logprob_invariance.py``."""

from __future__ import annotations

import pytest
import torch

from kvserve import SamplingParams
from kvserve.attention import CpuPagedAttentionBackend, cpu_paged_available
from engine_helpers import assert_kv_clean, make_llm, random_prompts

pytestmark = pytest.mark.skipif(not cpu_paged_available(), reason="no C++ compiler for the kernel")

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
PROMPTS = random_prompts(6, seed=7)


def run(model_dir, prompts, **kwargs):
    llm = make_llm(model_dir, dtype="bfloat16", **kwargs)
    attention = llm.llm_engine.core.loaded.model.model.layers[0].self_attn.backend
    assert isinstance(attention, CpuPagedAttentionBackend)
    assert llm.llm_engine.core.loaded.dtype == torch.bfloat16
    outputs = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    assert_kv_clean(llm)
    return outputs, llm


@pytest.fixture(scope="module")
def solo(model_dir):
    llm = make_llm(model_dir, dtype="bfloat16", enable_prefix_caching=False)
    return [llm.generate([p], GREEDY)[0].outputs[0].token_ids for p in PROMPTS]


@pytest.mark.parametrize(
    "engine_kwargs",
    [
        pytest.param({}, id="batched"),
        pytest.param({"max_num_batched_tokens": 8}, id="chunked-prefill-8"),
        pytest.param({"num_gpu_blocks_override": 12, "max_num_batched_tokens": 16}, id="preempted-chunked"),
    ],
)
def test_bf16_batched_chunked_preempted_equal_solo(model_dir, solo, engine_kwargs):
    outputs, _ = run(model_dir, PROMPTS, **engine_kwargs)
    assert outputs == solo


def test_bf16_prefix_cache_hits_equal_solo(model_dir, solo):
    _, llm = run(model_dir, PROMPTS)
    again = llm.generate(PROMPTS, GREEDY)
    assert [o.outputs[0].token_ids for o in again] == solo
    assert sum(o.num_cached_tokens for o in again) > 0


# The fast path of the kernel (bfloat16 tiles, head_dim % 32 == 0) under a sliding window shorter
# than a prompt, and a down_proj of 4,864 inputs (Qwen2.5-0.5B's; oneDNN's one-row kernel rounded
# it differently from its batched kernels): every sampled logit, not just every token, must be the
# same alone, batched, chunked and from the prefix cache.
FAST_PATH = dict(hidden_size=128, intermediate_size=4864, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                 sliding_window=20, initializer_range=0.05)
SCORED = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=0)


def test_bf16_fast_path_window_logprobs_equal_solo(checkpoint_factory):
    model_dir = checkpoint_factory("MistralForCausalLM", dtype="bfloat16", **FAST_PATH)
    prompts = random_prompts(6, seed=11, min_len=3, max_len=90)

    def scored(llm, batch):
        return [(o.outputs[0].token_ids, [e.logprob for e in o.outputs[0].logprobs]) for o in llm.generate(batch, SCORED)]

    solo_llm = make_llm(model_dir, dtype="bfloat16", enable_prefix_caching=False)
    assert isinstance(solo_llm.llm_engine.core.loaded.model.model.layers[0].self_attn.backend, CpuPagedAttentionBackend)
    solo = [scored(solo_llm, [p])[0] for p in prompts]
    batched = make_llm(model_dir, dtype="bfloat16", enable_prefix_caching=True)
    assert scored(batched, prompts) == solo
    assert scored(batched, prompts[::-1])[::-1] == solo  # prefix-cache hits, other order
    chunked = make_llm(model_dir, dtype="bfloat16", max_num_batched_tokens=7, enable_prefix_caching=False)
    assert scored(chunked, prompts) == solo
    assert_kv_clean(chunked)
