"""Helpers for speculative-decoding tests: engines with and without speculation on the same
checkpoint, results compared as (token ids, logprob bits, finish reason)."""

from __future__ import annotations

import random

from kvserve.engine.llm import LLM, merge_delta
from kvserve.testing.spec_decode import check_kv_integrity

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1,
         "min_acceptance_rate": 0, "disable_by_batch_size": 0}


def make_llm(model_dir, **kwargs) -> LLM:
    """An offline engine, float32, a KV cache of 128 blocks of 16 tokens (as the engine tests)."""
    defaults = dict(max_model_len=256, block_size=16, num_gpu_blocks_override=128, seed=0, dtype="float32")
    defaults.update(kwargs)
    return LLM(str(model_dir), **defaults)


def results(outputs) -> list[list[tuple]]:
    """Per prompt, per choice: (token ids, logprobs of each token, finish reason, text); a
    token's logprobs are its whole ``TokenLogprobs`` (id, logprob, rank, top ids and their
    logprobs), compared as Python floats: bit for bit."""
    return [[(c.token_ids, [tuple(lp) for lp in c.logprobs or []], c.finish_reason, c.text) for c in o.outputs]
            for o in outputs]


def generate_checked(llm: LLM, prompts, params) -> list:
    """``llm.generate`` driven step by step with ``check_kv_integrity`` after every step."""
    engine = llm.llm_engine
    params_list = params if isinstance(params, list) else [params] * len(prompts)
    requests = [engine.process_inputs(f"c{i}", {"prompt_token_ids": p}, sp)
                for i, (p, sp) in enumerate(zip(prompts, params_list))]
    engine.add_requests(requests)
    finals, pending = {}, {r.request_id for r in requests}
    while pending:
        for delta in engine.step().outputs:
            finals[delta.request_id] = merge_delta(finals.get(delta.request_id), delta)
            if delta.finished:
                pending.discard(delta.request_id)
        check_kv_integrity(engine.core)
    return [finals[r.request_id] for r in requests]


def spec_stats(llm: LLM):
    return llm.llm_engine.core.scheduler.make_stats().spec_decoding


def copy_prompts(count: int, seed: int, vocab: int = 900) -> list[list[int]]:
    """Prompts that repeat part of themselves, so n-grams recur (random ids in [5, vocab))."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        body = [rng.randrange(5, vocab) for _ in range(rng.randint(8, 40))]
        cut = rng.randint(2, len(body))
        prompts.append(body + body[:cut])
    return prompts
