"""The engine's features on a mixture of experts (Qwen3-MoE, tiny, random weights): structured
outputs stay inside their schema, n-gram speculation gives the plain run's tokens and logprob
bits, int8/int4 weights run with the same bits alone and batched, and a tool call over HTTP with
the official ``openai`` client returns arguments that validate."""

from __future__ import annotations

import json

import jsonschema
import pytest

from kvserve import SamplingParams
from kvserve.structured_output import StructuredOutputsParams
from engine_helpers import assert_kv_clean, make_llm, random_prompts

MOE = dict(num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32, norm_topk_prob=True, initializer_range=0.1)
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "n"], "additionalProperties": False}
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1,
         "min_acceptance_rate": 0, "disable_by_batch_size": 0}
SCORED = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=1)


@pytest.fixture(scope="module")
def moe_dir(checkpoint_factory):
    return checkpoint_factory("Qwen3MoeForCausalLM", seed=2, **MOE)


def scored(outputs):
    return [(o.outputs[0].token_ids, [lp.logprob for lp in o.outputs[0].logprobs]) for o in outputs]


def test_structured_outputs_follow_the_schema_on_moe(moe_dir):
    llm = make_llm(moe_dir)
    params = SamplingParams(n=12, temperature=1.0, seed=5, max_tokens=48,
                            structured_outputs=StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True))
    outputs = llm.generate(["Give me a record"], params)[0].outputs
    finished = [o.text for o in outputs if o.finish_reason == "stop"]
    assert finished, "no constrained output finished within 48 tokens"
    for text in finished:
        jsonschema.validate(json.loads(text), SCHEMA)
    assert_kv_clean(llm)


def test_ngram_speculation_keeps_the_tokens_and_logprobs_on_moe(moe_dir):
    prompts = [p + p[:6] for p in random_prompts(5, seed=9, min_len=8, max_len=30)]  # repeats to look up
    plain = scored(make_llm(moe_dir).generate(prompts, SCORED))
    spec = make_llm(moe_dir, speculative_config=NGRAM)
    assert scored(spec.generate(prompts, SCORED)) == plain
    stats = spec.llm_engine.core.scheduler.make_stats().spec_decoding
    assert stats.num_drafts > 0 and stats.num_draft_tokens >= stats.num_accepted_tokens
    assert_kv_clean(spec)


@pytest.mark.parametrize("method", ["int8", "int4"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_quantized_moe_is_batch_invariant(moe_dir, method, dtype):
    prompts = random_prompts(5, seed=4, min_len=3, max_len=40)
    quant = dict(quantization=method, dtype=dtype)
    alone = [scored(make_llm(moe_dir, enable_prefix_caching=False, **quant).generate([p], SCORED))[0] for p in prompts]
    assert scored(make_llm(moe_dir, max_num_batched_tokens=16, **quant).generate(prompts, SCORED)) == alone


def test_a_forced_tool_call_on_moe_over_http(tmp_path):
    from kvserve.testing.live_server import start_live_server
    from kvserve.testing.tool_checkpoint import build_tool_checkpoint

    model = build_tool_checkpoint(tmp_path / "tool-moe", architecture="Qwen3MoeForCausalLM")
    config = json.loads((model / "config.json").read_text())
    assert config["architectures"] == ["Qwen3MoeForCausalLM"]
    server = start_live_server(str(model), served_model_name="moe", api_key="k", dtype="float32",
                               max_model_len=1024, num_gpu_blocks_override=256,
                               structured_outputs_config={"disable_any_whitespace": True},
                               settings={"enable_auto_tool_choice": True, "tool_call_parser": "hermes"})
    try:
        weather = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                   "required": ["city"], "additionalProperties": False}
        reply = server.make_client().chat.completions.create(
            model="moe", messages=[{"role": "user", "content": "Weather?"}], max_tokens=64, temperature=0,
            tools=[{"type": "function", "function": {"name": "get_weather", "parameters": weather}}],
            tool_choice="required", parallel_tool_calls=False)  # one call: a random model would append more
        call = reply.choices[0].message.tool_calls[0]
        assert call.function.name == "get_weather" and reply.choices[0].finish_reason == "tool_calls"
        jsonschema.validate(json.loads(call.function.arguments), weather)
    finally:
        server.stop()
