"""The roofline bound (``kvserve.bench.roofline``) against counts worked out by hand from the
model's shapes, the workload simulation step by step, and the machine probe's figures."""

from __future__ import annotations

import json
import math

import pytest

from kvserve.bench.machine_probe import MachinePeaks, probe_machine
from kvserve.bench.roofline import (
    ServingFormat,
    decode_step_bound,
    model_cost,
    quantization_from_label,
    workload_bound,
)
from kvserve.config import QuantizationConfig
from kvserve.model.arch_config import ModelArchConfig

# hidden 64, intermediate 128, 2 layers, 4 heads / 2 KV heads of 16, vocabulary 100, untied
SMALL = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 100, "hidden_size": 64,
         "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "tie_word_embeddings": False}
# Per layer: qkv [64 + 2 * 32, 64] = 8,192; o [64, 64] = 4,096; gate_up [256, 64] = 16,384;
# down [64, 128] = 8,192 -> 36,864 weights, x 2 layers = 73,728. LM head [100, 64] = 6,400.
# Norms: 2 x 64 per layer + 64 final = 320.
BODY, HEAD, NORMS = 73_728, 6_400, 320


def arch(**changes) -> ModelArchConfig:
    return ModelArchConfig.from_dict({**SMALL, **changes})


def test_float_weights_kv_and_flops_by_hand():
    cost = model_cost(arch(), ServingFormat("bfloat16"))
    assert (cost.body_params, cost.lm_head_params) == (BODY, HEAD)
    assert cost.weight_bytes == (BODY + HEAD + NORMS) * 2 == 160_896  # no embedding table: a row lookup
    assert cost.kv_token_bytes == 2 * 2 * 16 * 2 == 128  # K and V, 2 KV heads, 16 values, 2 bytes
    assert cost.attention_flops == 4 * 4 * 16 == 256
    assert model_cost(arch(), ServingFormat("float32")).weight_bytes == (BODY + HEAD + NORMS) * 4
    # prefill of 10 tokens: linears over 10 tokens, 55 (query, key) pairs per layer, LM head once
    assert cost.prefill_flops(10) == 2 * BODY * 10 + 256 * 2 * 55 + 2 * HEAD == 1_515_520


def test_one_byte_kv_cache_rows_hold_a_float32_scale():
    cost = model_cost(arch(), ServingFormat("bfloat16", kv_cache_dtype="int8"))
    assert cost.kv_token_bytes == 2 * 2 * (16 + 4) == 80


def test_biases_and_qk_norms_of_qwen():
    qwen2 = model_cost(arch(architectures=["Qwen2ForCausalLM"], model_type="qwen2"), ServingFormat("bfloat16"))
    assert qwen2.weight_bytes == (BODY + HEAD + NORMS + 2 * 128) * 2  # q/k/v biases: 64 + 32 + 32 per layer
    qwen3 = model_cost(arch(architectures=["Qwen3ForCausalLM"], model_type="qwen3"), ServingFormat("bfloat16"))
    assert qwen3.weight_bytes == (BODY + HEAD + NORMS + 2 * 2 * 16) * 2  # q_norm and k_norm of 16 per layer
    tied = model_cost(arch(tie_word_embeddings=True), ServingFormat("bfloat16"))
    assert (tied.lm_head_params, tied.weight_bytes) == (HEAD, (BODY + HEAD + NORMS) * 2)


def test_a_mixture_of_experts_counts_the_experts_a_step_touches():
    """Qwen3-MoE on SMALL's attention: 8 experts of width 32, top 2, every layer sparse. Per layer
    the router [8, 64] = 512 weights is dense; one expert is gate_up [64, 64] + down [64, 32] =
    6,144 weights."""
    moe = arch(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", num_experts=8, num_experts_per_tok=2,
               moe_intermediate_size=32, norm_topk_prob=True)
    cost = model_cost(moe, ServingFormat("bfloat16"))
    attention = 8_192 + 4_096
    dense = 2 * (attention + 512)
    assert (cost.body_params, cost.expert_params, cost.moe_layers, cost.num_experts, cost.top_k) == \
        (dense, 6_144, 2, 8, 2)
    assert cost.weight_bytes == (dense + HEAD + NORMS + 2 * 2 * 16) * 2 and cost.expert_bytes == 6_144 * 2
    assert cost.token_params == dense + 2 * 2 * 6_144 and cost.total_params == dense + HEAD + 2 * 8 * 6_144
    assert cost.step_weight_bytes(1) == cost.weight_bytes + 2 * 2 * cost.expert_bytes  # one token: its 2 experts
    assert cost.experts_touched(64) == pytest.approx(8 * (1 - 0.75**64)) and cost.experts_touched(0) == 0
    peaks = MachinePeaks("cpu", 1, 1.0, 1.0, 1.0, {"bfloat16": 1.0}, (1, 1, 1), 0.0)  # 1 GB/s, 1 TFLOP/s
    step = decode_step_bound(cost, peaks, "bfloat16", [10])
    assert step.weights_s == pytest.approx(cost.step_weight_bytes(1) / 1e9)
    assert step.compute_s == pytest.approx((2 * (cost.token_params + HEAD) + 256 * 2 * 10) / 1e12)
    quantized = model_cost(moe, ServingFormat("bfloat16", QuantizationConfig(method="int8")))
    assert quantized.expert_bytes == (64 * 64 + 4 * 64) + (64 * 32 + 4 * 64)  # int8 + per-channel scales
    assert quantized.weight_bytes - model_cost(moe, ServingFormat("bfloat16")).weight_bytes == \
        2 * ((8_192 + 4 * 128 - 8_192 * 2) + (4_096 + 4 * 64 - 4_096 * 2))  # the router stays bfloat16


def test_mxfp4_experts_count_four_bits_and_a_scale_per_32_the_rest_bfloat16(tmp_path):
    """GPT-OSS on SMALL's attention (with q/k/v/o biases): 4 experts of width 64, top 2. Only the
    routed experts are MXFP4: gate_up [128, 64] + down [64, 64] = 12,288 weights at 1/2 + 4/32
    bytes each; attention and the router [4, 64] (+ bias) stay bfloat16."""
    config = {**SMALL, "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "num_local_experts": 4,
              "num_experts_per_tok": 2, "intermediate_size": 64, "head_dim": 16, "attention_bias": True,
              "quantization_config": {"quant_method": "mxfp4"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    quant = quantization_from_label("mxfp4", str(tmp_path))
    cost = model_cost(ModelArchConfig.from_dict(config), ServingFormat("bfloat16", quant))
    assert cost.expert_params == 12_288 and cost.expert_bytes == 12_288 // 2 + 4 * 12_288 // 32
    attention = 8_192 + 4_096 + (128 + 64)  # weights and biases
    router = 4 * 64 + 4
    assert cost.weight_bytes == 2 * (2 * (attention + router) + HEAD + NORMS)


def test_quantized_weight_bytes_by_hand():
    int8 = model_cost(arch(), ServingFormat("bfloat16", QuantizationConfig("int8")))
    # N * K + 4 * N per linear: qkv 8,192 + 512, o 4,096 + 256, gate_up 16,384 + 1,024, down 8,192 + 256
    assert int8.weight_bytes == 2 * (8_704 + 4_352 + 17_408 + 8_448) + HEAD * 2 + NORMS * 2 == 91_264
    int4 = model_cost(arch(), ServingFormat("bfloat16", QuantizationConfig("int4", 32, lm_head=True)))
    # N * K / 2 + 4 * N * K / 32: qkv 4,096 + 1,024, o 2,048 + 512, gate_up 8,192 + 2,048, down 4,096 + 1,024;
    # LM head 3,200 + 800
    assert int4.weight_bytes == 2 * (5_120 + 2_560 + 10_240 + 5_120) + 4_000 + NORMS * 2 == 50_720
    qwen2_int8 = model_cost(arch(architectures=["Qwen2ForCausalLM"], model_type="qwen2"),
                            ServingFormat("bfloat16", QuantizationConfig("int8")))
    assert qwen2_int8.weight_bytes == 91_264 + 2 * 128 * 4  # a quantized layer keeps a float32 bias
    assert (int4.body_params, int4.lm_head_params) == (BODY, HEAD)  # FLOPs do not change


@pytest.mark.parametrize(("stored", "label", "linears"), [
    # bits 4, group 32, symmetric: N * K / 2 + 4 * N * K / 32 per linear
    ({"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": True}, "gptq-int4-g32",
     5_120 + 2_560 + 10_240 + 5_120),
    # AWQ has zero points: float32 offsets as many as the scales
    ({"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True, "version": "gemm"}, "awq-int4-g32",
     6_144 + 3_072 + 12_288 + 6_144),
    # 8-bit GPTQ: int8 with group-wise scales, N * K + 4 * N * K / 32
    ({"quant_method": "gptq", "bits": 8, "group_size": 32, "sym": True}, "gptq-int8-g32",
     9_216 + 4_608 + 18_432 + 9_216),
])
def test_checkpoint_quantization_bytes_by_hand(tmp_path, stored, label, linears):
    (tmp_path / "config.json").write_text(json.dumps({**SMALL, "quantization_config": stored}))
    quant = quantization_from_label(label, str(tmp_path))
    assert quant.label == label
    cost = model_cost(arch(), ServingFormat("bfloat16", quant))
    assert cost.weight_bytes == 2 * linears + HEAD * 2 + NORMS * 2  # the LM head stays bfloat16
    with pytest.raises(ValueError, match="does not describe"):
        quantization_from_label("gptq-int4-g128", str(tmp_path))


def test_sliding_window_caps_the_keys():
    cost = model_cost(arch(architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=4),
                      ServingFormat("bfloat16"))
    assert cost.prefill_keys(10) == 2 * (1 + 2 + 3 + 4 + 4 * 6)
    assert cost.attended([3, 9]).tolist() == [2 * 3, 2 * 4]


PEAKS = MachinePeaks("cpu", 1, bandwidth_gbs=1.0, gemv_bf16_gbs=1.0, sum_fp32_gbs=0.5,
                     matmul_tflops={"bfloat16": 1.0}, matmul_shape=(1024, 64, 256), probe_s=0.0)


def test_decode_steps_of_an_ideal_continuous_batch():
    cost = model_cost(arch(), ServingFormat("bfloat16"))
    # (prompt, output): r0 decodes 2 steps, r1 none (its token comes from prefill), r2 3 steps; 2 slots
    bound = workload_bound(cost, PEAKS, "bfloat16", [(10, 3), (6, 1), (4, 4)], cap=2)
    # step 1: r0 at 11 tokens, r2 at 5; step 2: 12 and 6; step 3: r2 alone at 7. Each step reads the
    # weights (160,896 B) and 128 B per key per layer, bandwidth-bound at 1 GB/s.
    steps = [160_896 + 128 * 2 * (11 + 5), 160_896 + 128 * 2 * (12 + 6), 160_896 + 128 * 2 * 7]
    assert (bound.decode_steps, bound.bandwidth_steps, bound.max_batch) == (3, 3, 2)
    assert bound.decode_s == pytest.approx(sum(steps) / 1e9, rel=1e-12)
    # prefill: 3,031,552 FLOPs (3 us at 1 TFLOP/s) < one pass over the weights (160.9 us)
    assert bound.prefill_flops == 1_515_520 + (2 * BODY * 6 + 256 * 2 * 21 + 2 * HEAD) + (
        2 * BODY * 4 + 256 * 2 * 10 + 2 * HEAD) == 3_031_552
    assert bound.prefill_s == pytest.approx(160_896 / 1e9, rel=1e-12)
    assert (bound.num_requests, bound.input_tokens, bound.output_tokens) == (3, 20, 8)
    assert bound.output_throughput == pytest.approx(8 / (bound.prefill_s + bound.decode_s), rel=1e-12)


def test_a_compute_bound_step():
    cost = model_cost(arch(), ServingFormat("bfloat16"))
    slow = MachinePeaks("cpu", 1, 1.0, 1.0, 1.0, {"bfloat16": 1e-6}, (1, 1, 1), 0.0)  # 1 MFLOP/s
    step = decode_step_bound(cost, slow, "bfloat16", [5, 7])
    flops = 2 * (BODY + HEAD) * 2 + 256 * 2 * 12
    assert step.compute_s == pytest.approx(flops / 1e6, rel=1e-12) and step.limit == "compute"
    assert step.bound_s == step.compute_s


@pytest.mark.parametrize("config", [QuantizationConfig(), QuantizationConfig("int8"),
                                    QuantizationConfig("int8", lm_head=True), QuantizationConfig("int4", 64),
                                    QuantizationConfig("int4", 128, lm_head=True)])
def test_quantization_labels_round_trip(config):
    assert quantization_from_label(config.label) == config


@pytest.mark.parametrize("label", ["int3", "int4", "int4-g48", "int8-g32", "int8+head", "fp8"])
def test_unknown_quantization_labels_are_refused(label):
    with pytest.raises(ValueError, match="unknown quantization"):
        quantization_from_label(label)


def test_the_probe_returns_positive_finite_figures():
    peaks = probe_machine(64, 128, ("bfloat16", "float32"), size_bytes=8 * 2**20)
    figures = [peaks.bandwidth_gbs, peaks.gemv_bf16_gbs, peaks.sum_fp32_gbs, *peaks.matmul_tflops.values()]
    assert all(math.isfinite(x) and x > 0 for x in figures)
    assert peaks.bandwidth_gbs == max(peaks.gemv_bf16_gbs, peaks.sum_fp32_gbs)
    assert set(peaks.matmul_tflops) == {"bfloat16", "float32"} and peaks.matmul_shape == (1024, 64, 256)
    assert peaks.threads >= 1 and peaks.device == "cpu"


@pytest.mark.parametrize("own_faster", [True, False])
def test_the_matmul_peak_is_the_faster_of_torch_and_kvserve(monkeypatch, own_faster):
    """The probe times F.linear, then kvserve's InvariantLinear on the same operands, and keeps the
    faster: a peak the engine's own kernel beats would make a bound the engine beats."""
    import torch

    from kvserve.bench import machine_probe

    calls = []

    def fake_best_time(fn, repeats, device):
        result = fn()
        calls.append(result)
        return 1.0 if (len(calls) == 2) == own_faster else 2.0  # the second call is kvserve's

    monkeypatch.setattr(machine_probe, "_best_time", fake_best_time)
    m, k, n = 8, 64, 48
    tflops = machine_probe.measure_matmul(torch.float32, m, k, n)
    assert len(calls) == 2
    torch.testing.assert_close(calls[1], calls[0], rtol=1e-5, atol=1e-5)  # the same product, by our kernel
    assert tflops == 2 * m * k * n / 1.0 / 1e12
    # Without kvserve's kernels only F.linear is timed.
    calls.clear()
    monkeypatch.setattr(machine_probe, "kernels_for", lambda device: None)
    assert machine_probe.measure_matmul(torch.float32, m, k, n) == 2 * m * k * n / (2.0 if own_faster else 1.0) / 1e12
    assert len(calls) == 1
