"""Tensor parallelism on the CPU with gloo (``kvserve.distributed``): TP 2 against TP 1 on the
same checkpoint, which is the reference (itself checked against transformers in
tests/model/test_model_numerics.py).

- float32 logits of a prefill and of positions computed against its cached K/V within 1e-5
  (relative to the largest logit) of TP 1, and 64 greedy tokens identical, for Llama, Qwen2 and
  Qwen3 at TP 2, a model whose single KV head is replicated on both ranks, and Qwen2 at TP 3
  (a vocabulary that does not split evenly);
- prefix caching and preemption under TP 2 give the same bits as the same TP 2 engine running each
  prompt alone, and the same tokens as TP 1;
- int4 weights quantized by each rank from its slices match TP 1's int4; seeded sampling and
  prompt logprobs match TP 1;
- n-gram speculation under TP 2 is exact;
- bfloat16 under TP 2 (summed in float32) stays within bfloat16 error of TP 1 and batch-invariant;
- a rank killed before a step fails that step at once; refusals by name; the shards' ranges.
"""

from __future__ import annotations

import pytest
import torch

from kvserve import SamplingParams
from kvserve.distributed.shard import TensorParallelShard, check_tensor_parallel
from kvserve.engine.llm import LLM
from kvserve.errors import ConfigError
from kvserve.model.arch_config import ModelArchConfig
from tp_workload import COMMON, PROMPTS, greedy

pytestmark = pytest.mark.slow

GREEDY = greedy(64)


def make(model_dir, tp: int, **kwargs) -> LLM:
    return LLM(str(model_dir), **{**COMMON, "num_gpu_blocks_override": 64, "tensor_parallel_size": tp, **kwargs})


def forward_logits(llm: LLM) -> list[torch.Tensor]:
    """Logits of a 19-token prefill (blocks 1-2), then of 5 positions computed against its cached
    K/V, straight through the runner (no sampling)."""
    runner = llm.llm_engine.core.runner
    prompt = PROMPTS[0]
    first = runner.forward([prompt[:14]], [[1]])[0]
    rest = runner.forward([prompt], [[1, 2]], num_computed=[14])[0]
    return [first.float(), rest.float()]


def greedy(llm: LLM, prompts=PROMPTS) -> list[tuple[list[int], list[float]]]:
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY)
    return [(o.outputs[0].token_ids, [lp.logprob for lp in o.outputs[0].logprobs]) for o in outputs]


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max())


@pytest.fixture(scope="module")
def tiny_llama_kv1(checkpoint_factory):
    """Llama with 4 query heads and one KV head: TP 2 replicates the KV head on both ranks."""
    return checkpoint_factory("LlamaForCausalLM", num_key_value_heads=1)


@pytest.fixture(scope="module")
def tiny_qwen2_six_heads(checkpoint_factory):
    """Qwen2 with 6 query heads / 3 KV heads and MLP width 96: splits over 3 ranks."""
    return checkpoint_factory("Qwen2ForCausalLM", num_attention_heads=6, num_key_value_heads=3,
                              intermediate_size=96)


@pytest.fixture(scope="module")
def tiny_gemma3(checkpoint_factory):
    """Gemma 3: a sliding and a full layer, each with its rotary embedding; (1 + w) norms."""
    return checkpoint_factory("Gemma3ForCausalLM", initializer_range=0.1, sliding_window=6,
                              layer_types=["sliding_attention", "full_attention"])


@pytest.mark.parametrize("fixture, tp, quantization", [
    ("tiny_qwen2", 2, None), ("tiny_qwen3", 2, None), ("tiny_llama_kv1", 2, None),
    ("tiny_qwen2_six_heads", 3, None), ("tiny_llama", 2, "int4"), ("tiny_gemma3", 2, None)])
def test_tp_logits_and_greedy_tokens_match_tp1(request, fixture, tp, quantization):
    """int4: each rank quantizes its slices; its groups of 32 inputs are the whole model's. (Llama
    in float32: test_tp2_prefix_caching_and_preemption.)"""
    model_dir = request.getfixturevalue(fixture)
    reference = make(model_dir, 1, quantization=quantization)
    want_logits, want_tokens = forward_logits(reference), greedy(reference)
    sharded = make(model_dir, tp, quantization=quantization)
    try:
        got_logits, got_tokens = forward_logits(sharded), greedy(sharded)
    finally:
        sharded.shutdown()
    for got, want in zip(got_logits, want_logits, strict=True):
        assert got.shape == want.shape
        assert relative_error(got, want) < 1e-5
    for (got_ids, got_lps), (want_ids, want_lps) in zip(got_tokens, want_tokens, strict=True):
        assert got_ids == want_ids and len(got_ids) == 64
        assert got_lps == pytest.approx(want_lps, rel=1e-5, abs=1e-5)


def test_tp2_bfloat16_sums_in_float32_and_stays_close(tiny_llama):
    """bfloat16 partial products are all-reduced in float32 and rounded once (gloo's bfloat16 sum
    is slow): the logits stay within bfloat16 error of TP 1's float32 ones (a lost or doubled
    partial sum would be off by tens of percent), and a prompt alone gives the bits it gives in a
    batch."""
    want = forward_logits(make(tiny_llama, 1))
    sharded = make(tiny_llama, 2, dtype="bfloat16")
    try:
        got = forward_logits(sharded)
        alone, batched = greedy(sharded, PROMPTS[:1]), greedy(sharded)
    finally:
        sharded.shutdown()
    for g, w in zip(got, want, strict=True):
        assert relative_error(g, w) < 5e-2
    assert alone[0] == batched[0]


def test_tp2_prefix_caching_and_preemption(tiny_llama):
    """The runner's logits as TP 1's (as test_tp_logits_and_greedy_tokens_match_tp1 for the other
    families); then 12 blocks of 16 tokens cannot hold the three prompts' 64-token continuations at
    once: the scheduler preempts and recomputes, and the shared 16-token prefix hits the cache."""
    prefix = list(range(40, 56))
    prompts = [prefix + [7, 8, 9], prefix + [300, 301], prefix + [9, 99, 199, 299]]
    reference = make(tiny_llama, 1, num_gpu_blocks_override=12)
    want_logits, want = forward_logits(reference), greedy(reference, prompts)
    sharded = make(tiny_llama, 2, num_gpu_blocks_override=12)
    try:
        got_logits = forward_logits(sharded)
        batched = greedy(sharded, prompts)
        stats = sharded.llm_engine.core.make_stats()
        alone = [greedy(sharded, [p])[0] for p in prompts]
        sharded.llm_engine.core.kv_cache_manager.check_integrity()
    finally:
        sharded.shutdown()
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
    assert batched == alone  # the same bits, batched and preempted or alone
    assert all(relative_error(g, w) < 1e-5 for g, w in zip(got_logits, want_logits, strict=True))
    for (got_ids, got_lps), (want_ids, want_lps) in zip(batched, want, strict=True):
        assert got_ids == want_ids and got_lps == pytest.approx(want_lps, rel=1e-5, abs=1e-5)


def test_shards_hold_their_rows_only(tiny_llama_kv1):
    arch = ModelArchConfig.from_file(tiny_llama_kv1 / "config.json")
    shards = [TensorParallelShard(rank, 2, arch) for rank in range(2)]
    assert [s.rows_of("q_proj") for s in shards] == [(0, 32), (32, 64)]
    assert [s.rows_of("k_proj") for s in shards] == [(0, 16), (0, 16)]  # one KV head, replicated
    assert [s.rows_of("down_proj") for s in shards] == [(0, 64), (64, 128)]
    vocab = arch.vocab_size
    assert shards[0].vocab_rows == (0, -(-vocab // 2)) and shards[1].vocab_rows == (-(-vocab // 2), vocab)
    four = [TensorParallelShard(rank, 4, ModelArchConfig.from_file(tiny_llama_kv1 / "config.json"))
            for rank in range(4)]
    assert [s.num_heads for s in four] == [1] * 4 and [s.first_kv_head for s in four] == [0] * 4


def test_refused_combinations_name_the_flag(tiny_llama):
    arch = ModelArchConfig.from_file(tiny_llama / "config.json")
    with pytest.raises(ConfigError, match=r"--tensor-parallel-size 3: num_attention_heads \(4\)"):
        check_tensor_parallel(arch, 3)


def test_a_rank_killed_before_a_step_fails_it_at_once(tiny_llama):
    """The step's collectives fail on the closed connection (no wait for --dist-timeout), the
    failure is the engine's (not bisected as the requests') and names the rank that exited."""
    import time

    from kvserve.errors import EngineDeadError

    llm = make(tiny_llama, 2)
    try:
        worker = llm.llm_engine.core.tensor_parallel.processes[1]
        worker.kill()
        worker.join(10)
        start = time.monotonic()
        with pytest.raises(EngineDeadError, match=r"tensor-parallel rank 1 \(pid \d+\) exited with status -9; the "
                                                  r"engine stops \(tensor-parallel rank 0: .* failed"):
            llm.generate([{"prompt_token_ids": PROMPTS[1]}], GREEDY)
        assert time.monotonic() - start < 10
        with pytest.raises(EngineDeadError, match=r"tensor-parallel rank 1 \(pid \d+\) exited with status -9"):
            llm.llm_engine.core.check_health()
    finally:
        llm.shutdown()


def test_tp2_with_ngram_speculation_is_exact(tiny_llama):
    """Rank 0 verifies the n-gram drafts over the gathered logits: greedy output equals TP 1's
    without speculation."""
    spec = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}'
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6], [9, 10, 11, 12, 9, 10, 11]]
    want = greedy(make(tiny_llama, 1), prompts)
    sharded = make(tiny_llama, 2, speculative_config=spec)
    try:
        got = greedy(sharded, prompts)
        spec_stats = sharded.llm_engine.core.make_stats().spec_decoding
    finally:
        sharded.shutdown()
    assert spec_stats.num_draft_tokens > 0
    assert [ids for ids, _ in got] == [ids for ids, _ in want]
    for (_, got_lps), (_, want_lps) in zip(got, want, strict=True):
        assert got_lps == pytest.approx(want_lps, rel=1e-5, abs=1e-5)


def test_serve_refuses_tp_with_dp(tiny_llama, capsys):
    from kvserve.cli import main

    assert main(["serve", str(tiny_llama), "-tp", "2", "-dp", "2"]) == 2
    assert "kvserve: error: --data-parallel-size with --tensor-parallel-size > 1 is not supported" in \
        capsys.readouterr().err


def test_tp2_seeded_sampling_and_prompt_logprobs_match_tp1(tiny_llama):
    """Rank 0 samples from the gathered logits with the request's own generator: seeded sampled
    tokens equal TP 1's, and prompt logprobs agree within 1e-5. The engine also outlives its
    collective timeout while idle: --dist-timeout bounds the collectives of a call, not the
    workers' wait between calls (a second run after 3 s idle at a 2 s timeout gives the same)."""
    import time

    params = SamplingParams(temperature=0.8, top_p=0.9, top_k=50, seed=7, max_tokens=24, ignore_eos=True,
                            prompt_logprobs=2)

    def run(llm):
        outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
        return [(o.outputs[0].token_ids, [lp.logprob for lp in o.prompt_logprobs[1:]]) for o in outputs]

    want = run(make(tiny_llama, 1))
    sharded = make(tiny_llama, 2, dist_timeout=2.0)
    try:
        got = run(sharded)
        time.sleep(3)
        assert run(sharded) == got
    finally:
        sharded.shutdown()
    for (got_ids, got_prompt), (want_ids, want_prompt) in zip(got, want, strict=True):
        assert got_ids == want_ids
        assert got_prompt == pytest.approx(want_prompt, rel=1e-5, abs=1e-5)


def test_q_k_norms_over_all_heads_refuse_tensor_parallelism_by_name(checkpoint_factory):
    from kvserve.distributed.shard import check_parallel_options
    from kvserve.engine.arg_utils import engine_config_from_kwargs

    config = engine_config_from_kwargs(str(checkpoint_factory("Olmo2ForCausalLM")), tensor_parallel_size=2)
    with pytest.raises(ConfigError, match="--tensor-parallel-size 2: Olmo2ForCausalLM's q/k norms over all heads"):
        check_parallel_options(config)
