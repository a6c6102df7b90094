"""Disaggregated prefill/decode at the engine level, float32 and bfloat16: a producer engine
computes prompts, a consumer engine fetches their blocks from the producer's block server and
generates exactly (token ids and logprobs) what an engine that computed everything gives."""

from __future__ import annotations

import asyncio

import pytest

from kvserve import SamplingParams
from kvserve.testing.live_server import free_port
from engine_helpers import assert_kv_clean, make_llm, random_prompts

PROMPTS = random_prompts(3, seed=31, min_len=70, max_len=120)
PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=3)


def results(outputs):
    return [(o.outputs[0].token_ids, list(o.outputs[0].logprobs)) for o in outputs]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_consumer_decodes_what_the_producer_prefilled(model_dir, dtype):
    reference = make_llm(model_dir, dtype=dtype, enable_prefix_caching=False)
    expected = results(reference.generate(PROMPTS, PARAMS, use_tqdm=False))
    port = free_port()
    producer = make_llm(model_dir, dtype=dtype, kv_role="producer", kv_port=port)
    consumer = make_llm(model_dir, dtype=dtype, kv_role="consumer", kv_producers=[f"127.0.0.1:{port}"])
    try:
        producer.generate(PROMPTS, SamplingParams(max_tokens=1), use_tqdm=False)
        transfer = consumer.llm_engine.core.kv_transfer
        params = {"remote_host": "127.0.0.1", "remote_port": port}
        for i, prompt in enumerate(PROMPTS):
            spec = consumer.llm_engine.input_processor.process(f"fetch-{i}", {"prompt_token_ids": prompt}, PARAMS)
            held = asyncio.run(transfer.consumer.prefetch(spec, params))
            assert held == (len(prompt) - 1) // 16  # every full block but one holding the last token
        assert results(consumer.generate(PROMPTS, PARAMS, use_tqdm=False)) == expected
        loaded = consumer.llm_engine.core.make_stats().kv_transfer.hits_by_source["p2p"]
        assert loaded == sum((len(p) - 1) // 16 * 16 for p in PROMPTS)
        assert_kv_clean(consumer)
    finally:
        producer.llm_engine.core.shutdown()
        consumer.llm_engine.core.shutdown()
