"""Helpers for engine tests on a tiny random-weight checkpoint."""

from __future__ import annotations

import random

from kvserve.engine.llm import LLM


def make_llm(model_dir, **kwargs) -> LLM:
    """An offline engine on ``model_dir``, float32 by default (``--dtype auto`` would be bfloat16
    on some of these CPUs and float32 on others). Both dtypes are batch-invariant on the CPU
    (``kvserve.model.invariant_linear``, ``cpu_paged`` attention; ``test_logprob_invariance.py``)."""
    defaults = dict(max_model_len=256, block_size=16, num_gpu_blocks_override=128, seed=0, dtype="float32")
    defaults.update(kwargs)
    return LLM(str(model_dir), **defaults)


def assert_kv_clean(llm: LLM) -> None:
    """Integrity holds and every KV block is free again."""
    manager = llm.llm_engine.core.kv_cache_manager
    manager.check_integrity()
    assert manager.usage == 0.0
    assert manager.num_free_blocks == manager.block_pool.num_usable_blocks
    assert not llm.llm_engine.has_unfinished_requests()


def random_prompts(count: int, seed: int, min_len: int = 3, max_len: int = 70, vocab: int = 900) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, vocab) for _ in range(rng.randint(min_len, max_len))] for _ in range(count)]
