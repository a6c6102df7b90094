"""DeepSeek-V2/V3 (``kvserve.model.deepseek``): grouped routing against a direct transcription of
transformers' routers, the compressed cache's size, latent attention's batch invariance, its
kernel's bits against the invariant GEMM's, its torch path, and the switches refused by name.
Logits and greedy tokens against transformers are in test_model_numerics.py and test_generate.py (the ``deepseek_*``
variants of model_fixtures.VARIANTS); the engine's batching, chunking, caching and preemption in
tests/engine/test_moe_engine.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from model_fixtures import VARIANTS, hf_config, random_moe_block

from kvserve.attention.backend import AttentionMetadata
from kvserve.attention.latent import latent_attention
from kvserve.config import QuantizationConfig
from kvserve.errors import CheckpointError, ConfigError
from kvserve.kernels import cpu_kernels, cpu_kernels_available
from kvserve.model.arch_config import ModelArchConfig
from kvserve.model.loader import load_model
from kvserve.model.memory_plan import memory_plan
from kvserve.model.moe import grouped_route
from kvserve.model.kv_cache_layout import kv_cache_bytes_per_block, kv_cache_shape

needs_kernels = pytest.mark.skipif(not cpu_kernels_available(), reason="the C++ kernels do not build here")


def arch_of(variant: str, **fields) -> ModelArchConfig:
    architecture, overrides = VARIANTS[variant]
    config = hf_config(architecture, overrides).to_dict()  # as transformers writes config.json, then ``fields``
    return ModelArchConfig.from_dict({**config, "architectures": [architecture], **fields})


def transformers_v3_route(logits, bias, moe):
    """transformers' DeepseekV3TopkRouter.forward after the logits, line for line."""
    scores = logits.sigmoid()
    choice = scores + bias
    group_scores = choice.view(-1, moe.n_group, moe.num_experts // moe.n_group).topk(2, dim=-1)[0].sum(dim=-1)
    group_idx = torch.topk(group_scores, k=moe.topk_group, dim=-1, sorted=False)[1]
    mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
    mask = mask.unsqueeze(-1).expand(-1, moe.n_group, moe.num_experts // moe.n_group).reshape(-1, moe.num_experts)
    ids = torch.topk(choice.masked_fill(~mask.bool(), float("-inf")), k=moe.top_k, dim=-1, sorted=False)[1]
    weights = scores.gather(1, ids)
    if moe.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * moe.routed_scaling_factor, ids


def transformers_v2_route(logits, moe):
    """transformers' DeepseekV2TopkRouter.forward (group_limited_greedy) after the logits."""
    scores = logits.softmax(dim=-1, dtype=torch.float32)
    group_scores = scores.view(-1, moe.n_group, moe.num_experts // moe.n_group).max(dim=-1).values
    group_idx = torch.topk(group_scores, k=moe.topk_group, dim=-1, sorted=False)[1]
    mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
    mask = mask.unsqueeze(-1).expand(-1, moe.n_group, moe.num_experts // moe.n_group).reshape(-1, moe.num_experts)
    weights, ids = torch.topk(scores.masked_fill(~mask.bool(), 0.0), k=moe.top_k, dim=-1, sorted=False)
    return weights * moe.routed_scaling_factor, ids


def by_expert(weights, ids):
    order = ids.argsort(dim=-1)
    return weights.gather(1, order), ids.gather(1, order)


@pytest.mark.parametrize("variant", ["deepseek_v3", "deepseek_v2"])
def test_grouped_routing_matches_transformers(variant):
    moe = arch_of(variant).moe
    torch.manual_seed(0)
    logits, bias = torch.randn(64, moe.num_experts) * 2, torch.randn(moe.num_experts) * 0.3
    if variant == "deepseek_v3":
        ours, ref = grouped_route(logits, moe, bias, cpu_kernels()), transformers_v3_route(logits, bias, moe)
    else:
        ours, ref = grouped_route(logits, moe, None, cpu_kernels()), transformers_v2_route(logits, moe)
    (w, ids), (ref_w, ref_ids) = by_expert(*ours), by_expert(*ref)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(w, ref_w, rtol=2e-6, atol=0)


def test_grouped_routing_ties_and_the_correction_bias():
    moe = dataclasses.replace(arch_of("deepseek_v3").moe, n_group=2, topk_group=1, top_k=2, norm_topk_prob=False,
                              routed_scaling_factor=1.0)
    # 8 experts, groups [0..3] and [4..7]; equal logits everywhere: group 0, experts 0 and 1
    weights, ids = grouped_route(torch.zeros(1, 8), moe, torch.zeros(8), cpu_kernels())
    assert ids.tolist() == [[0, 1]] and weights.tolist() == [[0.5, 0.5]]
    # the bias moves the choice to group 1's experts 6 and 7; the weights stay the unbiased scores
    logits = torch.tensor([[1.0, 0.9, 0.0, 0.0, 0.0, 0.0, 0.2, 0.1]])
    bias = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.5])
    weights, ids = grouped_route(logits, moe, bias, cpu_kernels())
    assert ids.tolist() == [[6, 7]]
    torch.testing.assert_close(weights, torch.sigmoid(logits[:, [6, 7]]), rtol=1e-6, atol=0)


def test_the_cache_holds_one_compressed_row_per_token():
    """DeepSeek-V3's shape: 61 layers, 128 heads; 512 + 64 values per token and layer instead of
    128 heads' keys (192) and values (128)."""
    v3 = arch_of("deepseek_v3", num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128,
                 kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, hidden_size=256)
    assert kv_cache_shape(v3, 10, 16) == (1, 10, 16, 1, 576)
    assert kv_cache_bytes_per_block(v3, 16, torch.bfloat16) == 61 * 16 * 576 * 2
    plan = memory_plan(v3, "bfloat16", QuantizationConfig())
    assert plan.kv_bytes_per_token == 61 * 576 * 2 and "68.6 KiB of KV cache per token" in plan.describe()
    with pytest.raises(ConfigError, match="--kv-cache-dtype int8 is not supported for DeepseekV3ForCausalLM"):
        kv_cache_shape(v3, 10, 16, "int8")


def _metadata(q_lens: list[int], seq_lens: list[int], block_size: int, tables: list[list[int]]) -> AttentionMetadata:
    starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    slots = [table[p // block_size] * block_size + p % block_size
             for table, q, s in zip(tables, q_lens, seq_lens) for p in range(s - q, s)]
    width = max(len(t) for t in tables)
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    return AttentionMetadata(query_start_loc=starts, seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
                             block_tables=block_tables, slot_mapping=torch.tensor(slots, dtype=torch.int64),
                             max_query_len=max(q_lens), max_seq_len=max(seq_lens), query_start_loc_cpu=starts,
                             seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int32))


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_latent_attention_rows_do_not_depend_on_chunking_or_batch(dtype, monkeypatch):
    """One 23-token request: whole, as chunks of 9 + 14 beside another request, and decoded token
    by token; each query row's output is the same bits. The kernel path agrees with the torch
    path (float32 matmuls and a masked softmax) to rounding."""
    torch.manual_seed(0)
    heads, width, latent, block_size, n = 4, 40, 32, 4, 23
    rows, query = torch.randn(n, width).to(dtype), torch.randn(n, heads, width)
    table = [5, 2, 7, 0, 3, 1]

    def run(cache, q_lens, seq_lens, tables, q, new_rows, ops=cpu_kernels()):
        return latent_attention(q, new_rows, cache, _metadata(q_lens, seq_lens, block_size, tables), scale=0.3,
                                value_width=latent, ops=ops)

    def fresh():
        return torch.zeros(1, 12, block_size, 1, width, dtype=dtype)

    whole = run(fresh(), [n], [n], [table], query, rows)
    cache = fresh()
    other_rows, other_q = torch.randn(3, width).to(dtype), torch.randn(3, heads, width)
    first = run(cache, [9, 3], [9, 3], [table, [9]], torch.cat([query[:9], other_q]), torch.cat([rows[:9], other_rows]))
    second = run(cache, [14], [n], [table], query[9:], rows[9:])
    assert torch.equal(torch.cat([first[:9], second]), whole)
    cache, steps = fresh(), []
    for i in range(n):
        steps.append(run(cache, [1], [i + 1], [table], query[i : i + 1], rows[i : i + 1]))
    assert torch.equal(torch.cat(steps), whole)
    assert torch.equal(whole, invariant_gemm_attention(query * 0.3, rows.float(), latent))
    torch.testing.assert_close(run(fresh(), [n], [n], [table], query, rows, ops=None), whole, rtol=1e-5, atol=1e-6)


def invariant_gemm_attention(scaled: torch.Tensor, context: torch.Tensor, value_width: int) -> torch.Tensor:
    """One request's causal latent attention (scaled queries [n, H, W], its rows [n, W] in
    float32) composed of kvserve's invariant GEMM (the rows packed as its weight) and
    softmax_prefix_rows: the sequences latent_attention.cpp documents, for its bits."""
    kernels = cpu_kernels()
    n, heads, width = scaled.shape
    q = scaled.reshape(-1, width).contiguous()
    scores = kernels.invariant_linear(q, kernels.pack_linear_weight(context.contiguous()), None, n)
    lengths = torch.arange(1, n + 1, dtype=torch.int32).repeat_interleave(heads)
    probs = kernels.softmax_prefix_rows(scores, lengths)
    values = kernels.pack_linear_weight(context[:, :value_width].t().contiguous())
    return kernels.invariant_linear(probs, values, None, value_width).view(n, heads, value_width)


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_latent_attention_kernel_at_deepseek_shapes(dtype):
    """DeepSeek-V2-Lite's widths (16 heads, 512 + 64) and 20 heads (a partial vector of heads and
    of a head group): a 70-token prompt in blocks of 16 gives the invariant-GEMM composition's
    bits, and a decode row of another request beside it changes nothing."""
    torch.manual_seed(1)
    for heads in (16, 20):
        width, latent, block_size, n = 576, 512, 16, 70
        rows, query = torch.randn(n, width).to(dtype), torch.randn(n, heads, width) * 0.05
        table = [3, 0, 6, 1, 4]
        cache = torch.zeros(1, 8, block_size, 1, width, dtype=dtype)
        out = latent_attention(query, rows, cache, _metadata([n], [n], block_size, [table]), scale=0.1,
                               value_width=latent, ops=cpu_kernels())
        assert torch.equal(out, invariant_gemm_attention(query * 0.1, rows.float(), latent))
        beside = latent_attention(torch.cat([query[n - 1 :], torch.randn(1, heads, width)]),
                                  torch.cat([rows[n - 1 :], torch.randn(1, width).to(dtype)]), cache,
                                  _metadata([1, 1], [n, 1], block_size, [table, [7]]), scale=0.1, value_width=latent,
                                  ops=cpu_kernels())
        assert torch.equal(beside[0], out[n - 1])


@needs_kernels
def test_softmax_prefix_rows_kernel():
    torch.manual_seed(0)
    x = torch.randn(5, 37) * 4
    lengths = torch.tensor([1, 5, 16, 17, 37], dtype=torch.int32)
    out = cpu_kernels().softmax_prefix_rows(x.clone(), lengths)
    for r, n in enumerate(lengths.tolist()):
        torch.testing.assert_close(out[r, :n], torch.softmax(x[r, :n].double(), -1).float(), rtol=2e-6, atol=1e-7)
        assert not out[r, n:].any()
    longer = cpu_kernels().softmax_prefix_rows(torch.cat([x, torch.randn(5, 50)], 1).contiguous(), lengths)
    assert torch.equal(longer[:, :37], out)


def test_the_correction_bias_stays_float32_in_a_bfloat16_model(tiny_checkpoint):
    path, hf_model = tiny_checkpoint("deepseek_v3", torch.bfloat16)
    model = load_model(path).model
    block = model.model.layers[1].mlp
    ref = hf_model.model.layers[1].mlp.gate.e_score_correction_bias
    assert block.score_correction.value.dtype == torch.float32 and torch.equal(block.score_correction.value, ref)


@pytest.mark.parametrize(("fields", "words"), [
    (dict(scoring_func="softmax"), "scoring_func 'softmax' is not supported for DeepseekV3ForCausalLM; supported: sigmoid"),
    (dict(topk_method="greedy"), "topk_method 'greedy' is not supported for DeepseekV3ForCausalLM; supported: noaux_tc"),
    (dict(moe_layer_freq=2), "moe_layer_freq=2 is not supported"),
    (dict(n_group=3), "n_routed_experts=8, n_group=3, topk_group=2"),
    (dict(kv_lora_rank=None), "needs a positive integer 'kv_lora_rank'"),
])
def test_unsupported_switches_are_refused_by_name(fields, words):
    with pytest.raises(CheckpointError, match=words.replace("(", r"\(").replace(")", r"\)")):
        arch_of("deepseek_v3", **fields)


def test_v2_routers():
    with pytest.raises(CheckpointError, match="topk_method 'noaux_tc' is not supported for DeepseekV2ForCausalLM"):
        arch_of("deepseek_v2", topk_method="noaux_tc")
    greedy = arch_of("deepseek_v2", topk_method="greedy").moe
    assert (greedy.routing, greedy.n_group, greedy.topk_group) == ("softmax_grouped", 1, 1)


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("variant", ["deepseek_v3", "deepseek_v2"])
def test_the_cpp_block_takes_the_grouped_routing_and_gives_the_torch_bits(variant, dtype):
    """On the CPU the grouped router's weights and ids go to the C++ layer (moe.cpp), which runs
    the experts and the ungated shared experts: the torch path's bits, for a batch and for each
    token alone."""
    arch = arch_of(variant)
    block = random_moe_block(arch, dtype)
    x = torch.randn(7, arch.hidden_size).to(dtype)
    with torch.no_grad():
        assert block.kernel_layer(dtype) is not None and block.shared_expert is not None
        out = block(x)
        assert torch.equal(out, block.torch_forward(x))
        assert all(torch.equal(block(x[t : t + 1])[0], out[t]) for t in range(7))
