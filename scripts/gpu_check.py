"""The GPU check (issue 41): what a lent NVIDIA GPU must show, in one run that writes one JSON.

    bash scripts/gpu_check.sh [--out gpu_check.json]        # on the GPU machine
    bash scripts/gpu_check.sh --dry-run                      # the same code on the CPU, tiny shapes

Sections (each recorded on its own: one that fails leaves the others' results):

1. ``environment``: torch, Triton, the device; the measured copy bandwidth (GB/s) and bf16 matmul
   peak (TFLOP/s) that the benchmarks are judged against.
2. ``attention``: the Triton paged-attention backend against the torch reference on the device
   (a mixed batch of prefill chunks and decodes, GQA, a sliding window; float32 and bf16), and a
   row alone against the same row in the batch (batch invariance).
3. ``elementwise``: the Triton RMSNorm (with the residual add), SiLU-and-multiply and rotary
   embedding against the torch code they replace, bf16 on the device: residual sums and the
   rotary embedding bit-identical, the others within one bf16 step.
4. ``sampler``: the Triton argmax, top-p and draw (bf16 logits of a Qwen-sized vocabulary, each row
   its own temperature and p) against torch on the device: argmax equal, the kept sets and tokens of
   a float64 sorted rule (except within 1e-5 of p or of a CDF step), rows alone equal to the same
   rows in the batch; the kernels' times beside the torch path's.
5. ``quant``: the Triton weight-only linear (int8, int4 symmetric and with zero points, MXFP4)
   against a float64 sum of its dequantized weights on the device (within one bf16 rounding), a row
   alone against the same row in 5 and 40 rows (bit-identical: the row tile changes size); an int4
   [14336, 4096] layer at 1 and 64 rows against its bytes at the copy bandwidth, cuBLAS bf16 beside.
6. ``moe``: MoE blocks with Qwen3-30B-A3B's shapes (bf16) and GPT-OSS-20B's (MXFP4 experts), the
   experts in Triton's grouped GEMMs against the block's torch loop (within two bf16 steps), a
   token alone against the same token among 64, and the time at 1 and 64 tokens against the bytes
   of the experts they touch (the torch loop's time beside).
7. ``engine_parity``: a small random Llama checkpoint: kvserve's greedy tokens on the device equal
   its tokens on the CPU in float32; in bf16, kvserve's logprobs against transformers' on the same
   device.
8. ``benchmarks``: a Llama-3.1-8B-shaped model with random bf16 weights made on the device
   (``--load-format dummy``): the batch-1 decode step against the weights' bandwidth bound (target
   <= 1.3x; with CUDA graphs, and without them beside it), the batch-64 decode step against its
   bound (<= 1.5x), a 4,096-token prefill against the matmul peak (>= 60%).

``--dry-run`` runs every section on the CPU with tiny shapes (Triton under its interpreter), so CI
keeps the check working; its figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

LLAMA31_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
}
TINY = {**LLAMA31_8B, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 1024,
        "max_position_embeddings": 4096}


def section(results: dict, name: str):
    """Decorator: run the section, record its result or its error and time."""
    def wrap(fn):
        start = time.perf_counter()
        try:
            results[name] = fn()
        except Exception as exc:  # noqa: BLE001 - one failing section must not lose the others
            results[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
        results[name]["seconds"] = round(time.perf_counter() - start, 2)
        print(f"[{name}] {json.dumps(results[name], default=str)[:600]}", flush=True)
        return fn
    return wrap


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def environment(device, dry_run: bool) -> dict:
    import torch

    facts = {"torch": torch.__version__, "device": str(device), "dry_run": dry_run}
    try:
        import triton

        facts["triton"] = triton.__version__
    except ImportError:
        facts["triton"] = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        facts.update(name=props.name, memory_gib=round(props.total_memory / 2**30, 1),
                     capability=f"{props.major}.{props.minor}")
    size = (64 << 20) if dry_run else (2 << 30)
    src = torch.empty(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    start = time.perf_counter()
    for _ in range(5):
        dst.copy_(src)
    sync(device)
    facts["copy_gb_s"] = round(2 * size * 5 / (time.perf_counter() - start) / 1e9, 1)
    n = 512 if dry_run else 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    a @ b
    sync(device)
    start = time.perf_counter()
    reps = 3 if dry_run else 20
    for _ in range(reps):
        a @ b
    sync(device)
    facts["bf16_matmul_tflops"] = round(2 * n**3 * reps / (time.perf_counter() - start) / 1e12, 4)
    return facts


def attention(device, dry_run: bool) -> dict:
    import torch

    from kvserve.attention import TorchAttentionBackend
    from kvserve.attention.triton_paged import TritonPagedAttentionBackend
    from kvserve.testing.attention import paged_metadata

    block, heads, kv_heads, dim = (16, 4, 2, 32) if dry_run else (16, 8, 2, 64)
    computed, new = [0, 40, 17], [23, 1, 5]
    tables = [[3, 9], [1, 4, 7, 12], [2, 5]]

    def metadata(rows):
        return paged_metadata(*([x[i] for i in rows] for x in (computed, new, tables)), block, device)

    result = {}
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        cache0 = (torch.randn(2, 16, block, kv_heads, dim, generator=gen) * 0.5).to(device, dtype)
        q = torch.randn(sum(new), heads, dim, generator=gen).to(device, dtype)
        k = torch.randn(sum(new), kv_heads, dim, generator=gen).to(device, dtype)
        v = torch.randn(sum(new), kv_heads, dim, generator=gen).to(device, dtype)
        outs = {}
        # 16 positions a partition: the lone decode row below (41 positions) runs split over three
        # programs and a combine, and must give the bits of its row in the mixed step (one program)
        triton_backend = TritonPagedAttentionBackend(partition_size=16)
        for name, backend in (("triton", triton_backend), ("torch", TorchAttentionBackend())):
            cache = cache0.clone()
            outs[name] = backend.forward(q, k, v, cache, metadata([0, 1, 2]), scale=dim**-0.5, sliding_window=20)
            outs[name + "_cache"] = cache
        alone = triton_backend.forward(q[23:24], k[23:24], v[23:24], cache0.clone(), metadata([1]),
                                       scale=dim**-0.5, sliding_window=20)
        label = str(dtype).removeprefix("torch.")
        result[label] = {
            "max_abs_diff_vs_torch": float((outs["triton"].float() - outs["torch"].float()).abs().max()),
            "cache_equal": bool(torch.equal(outs["triton_cache"], outs["torch_cache"])),
            "row_alone_equals_batched": bool(torch.equal(alone[0], outs["triton"][23])),
        }
    result["ok"] = all(r["cache_equal"] and r["row_alone_equals_batched"] for r in result.values()) and \
        result["float32"]["max_abs_diff_vs_torch"] < 1e-4 and result["bfloat16"]["max_abs_diff_vs_torch"] < 3e-2
    return result


def elementwise(device, dry_run: bool) -> dict:
    import torch
    import torch.nn.functional as F

    from kvserve.kernels.triton_elementwise import TritonElementwise
    from kvserve.model.layers import RMSNorm, RotaryEmbedding

    ops, gen = TritonElementwise(), torch.Generator().manual_seed(0)

    def rand(*shape):
        return (torch.randn(*shape, generator=gen) * 3).to(device, torch.bfloat16)

    def steps_apart(got, want):  # the largest difference in bf16 steps of the reference
        return float(((got.float() - want.float()).abs() / (want.float().abs() * 2**-7 + 1e-30)).max())

    rows, hidden, inter, heads = (9, 256, 512, 4) if dry_run else (33, 4096, 14336, 32)
    x, residual, weight = rand(rows, hidden), rand(rows, hidden), rand(hidden)
    norm = RMSNorm(hidden, 1e-5).to(device, torch.bfloat16)
    norm.weight.data.copy_(weight)
    norm.ops = None
    with torch.no_grad():
        want_normed, want_total = norm.add_and_norm(x, residual)
    normed, total = ops.rms_norm(x, weight, residual, 1e-5)
    gate_up = rand(rows, 2 * inter)
    gate, up = gate_up.chunk(2, dim=-1)
    silu = ops.silu_and_mul(gate_up)
    q = rand(rows, heads * 3 // 2, 128)[:, :heads]  # strided heads, as a view of a fused qkv output
    cos, sin = RotaryEmbedding(128, 500000.0, None).cos_sin(torch.arange(0, rows * 97, 97, device=device),
                                                            torch.bfloat16)
    rotary = ops.rotary_embedding(q, cos, sin)
    result = {
        "rms_norm_total_equal": bool(torch.equal(total, want_total)),
        "rms_norm_steps_apart": steps_apart(normed, want_normed),
        "silu_and_mul_steps_apart": steps_apart(silu, F.silu(gate) * up),
        "rotary_equal": bool(torch.equal(rotary, RotaryEmbedding.apply(q, cos, sin))),
        "rows_alone_equal": bool(torch.equal(ops.rms_norm(x[5:6], weight, residual[5:6], 1e-5)[0], normed[5:6])
                                 and torch.equal(ops.silu_and_mul(gate_up[5:6]), silu[5:6])),
    }
    result["ok"] = (result["rms_norm_total_equal"] and result["rotary_equal"] and result["rows_alone_equal"]
                    and result["rms_norm_steps_apart"] <= 1 and result["silu_and_mul_steps_apart"] <= 1)
    return result


def sampler(device, dry_run: bool) -> dict:
    import torch

    from kvserve.kernels.triton_sample import TritonSampleOps
    from kvserve.sample.top_k_top_p import apply_top_k_top_p

    ops, gen = TritonSampleOps(), torch.Generator().manual_seed(0)
    rows, vocab = (6, 3000) if dry_run else (64, 151936)
    logits = (torch.randn(rows, vocab, generator=gen) * torch.linspace(0.5, 6.0, rows)[:, None]).to(device, torch.bfloat16)
    temperature, top_p = torch.linspace(0.5, 1.5, rows, device=device), torch.linspace(0.3, 0.99, rows, device=device)
    uniforms = torch.rand(rows, dtype=torch.float64, generator=gen).to(device)
    index = torch.arange(rows, device=device)
    scaled = logits.float() / temperature[:, None]  # torch's division: the kernels' l
    order = torch.sort(-scaled.double(), dim=1, stable=True).indices  # the float64 rule, ties by index
    probs = torch.softmax(scaled.double(), dim=1).gather(1, order)
    before = probs.cumsum(1) - probs
    want = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, order, before < top_p.double()[:, None])
    unsure = torch.zeros_like(want).scatter_(1, order, (before - top_p.double()[:, None]).abs() < 1e-5)
    cut = logits.clone()
    ops.top_p_rows(cut, index, top_p, temperature)
    kept = cut > -torch.inf
    cdf = torch.softmax(scaled.double().masked_fill(~kept, -torch.inf), dim=1).cumsum(1)
    want_tokens = torch.searchsorted(cdf, uniforms[:, None], right=True).clamp_max(vocab - 1)
    near_step = ((cdf.gather(1, want_tokens) - uniforms[:, None]).abs() < 1e-5) | \
        ((cdf.gather(1, (want_tokens - 1).clamp_min(0)) - uniforms[:, None]).abs() < 1e-5)
    tokens = ops.sample_rows(cut, index, temperature, uniforms)
    r = rows // 2
    alone = logits[r : r + 1].clone()
    ops.top_p_rows(alone, index[:1], top_p[r : r + 1], temperature[r : r + 1])

    def ms(fn):  # median milliseconds of a few calls
        times = []
        for _ in range(1 if dry_run else 10):
            sync(device)
            start = time.perf_counter()
            fn()
            sync(device)
            times.append((time.perf_counter() - start) * 1e3)
        return round(sorted(times)[len(times) // 2], 3)

    result = {
        "shape": [rows, vocab],
        "argmax_equal": bool(torch.equal(ops.argmax_rows(logits), logits.argmax(dim=1))),
        "top_p_rows_off": int(((kept != want) & ~unsure).any(dim=1).sum()),
        "kept_tokens_median": int(kept.sum(dim=1).median()),
        "draws_off": int(((tokens[:, None] != want_tokens) & ~near_step).sum()),
        "rows_alone_equal": bool(torch.equal(alone[0], cut[r]) and torch.equal(
            ops.sample_rows(alone, index[:1], temperature[r : r + 1], uniforms[r : r + 1])[0], tokens[r])),
        "argmax_ms": ms(lambda: ops.argmax_rows(logits)), "torch_argmax_ms": ms(lambda: logits.argmax(dim=1)),
        "top_p_ms": ms(lambda: ops.top_p_rows(logits.clone(), index, top_p, temperature)),
        "torch_top_p_ms": ms(lambda: apply_top_k_top_p(scaled.clone(), None, top_p, None)),
        "sample_ms": ms(lambda: ops.sample_rows(logits, index, temperature, uniforms)),
        "torch_sample_ms": ms(lambda: torch.searchsorted(scaled.softmax(dim=1).cumsum(dim=1), uniforms[:, None].float())),
    }
    result["ok"] = (result["argmax_equal"] and result["rows_alone_equal"] and result["top_p_rows_off"] == 0
                    and result["draws_off"] == 0)
    return result


def timed_ms(device, fn, reps: int) -> float:
    """Median-free mean of ``reps`` calls after one warm-up, in ms."""
    fn()
    sync(device)
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    sync(device)
    return (time.perf_counter() - start) / reps * 1e3


def quant(device, dry_run: bool, env: dict) -> dict:
    """The Triton weight-only linear (``kvserve.kernels.triton_quant_linear``) on the device."""
    import torch

    from kvserve.kernels.triton_quant_linear import TritonQuantLinear, pack
    from kvserve.model.quant_tensor import quantize_int4, quantize_int8, quantize_mxfp4

    ops, gen = TritonQuantLinear(), torch.Generator().manual_seed(0)
    n, k, group = (70, 160, 32) if dry_run else (4096, 4096, 128)
    w = torch.randn(n, k, generator=gen).to(device)  # quantized on the device (the int4 search is slow on a CPU)
    x = torch.randn(40, k, generator=gen).to(device, torch.bfloat16)
    formats = {"int8": quantize_int8(w), "int4": quantize_int4(w, group),
               "int4_zero_points": quantize_int4(w, group, symmetric=False), "mxfp4": quantize_mxfp4(w)}
    result: dict = {}
    ok = True
    for name, weight in formats.items():
        packed = pack(weight)
        out = ops.linear(x, packed, None)
        dense = weight.dequantize().to(torch.bfloat16).double()
        exact = x.double() @ dense.T
        bound = 2.0**-8 * exact.abs() + 2 * k * 2.0**-24 * (x.double().abs() @ dense.abs().T)
        within = bool(((out.double() - exact).abs() <= bound).all())
        alone = bool(torch.equal(ops.linear(x[3:4], packed, None), out[3:4])
                     and torch.equal(ops.linear(x[:5], packed, None)[3:4], out[3:4]))
        result[name] = {"within_one_rounding": within, "row_alone_equal": alone}
        ok = ok and within and alone
    # an MLP-sized layer: int4 (group 128) at 1 and 64 rows against its bytes, and bf16 beside it
    n, k = (256, 128) if dry_run else (14336, 4096)
    weight = quantize_int4(torch.randn(n, k, generator=gen).to(device), 32 if dry_run else 128)
    packed = pack(weight)
    dense = weight.dequantize().to(device, torch.bfloat16)
    int4_bytes = packed.codes.numel() + packed.scales.numel() * 4
    reps = 1 if dry_run else 50
    for rows in (1, 64):
        xs = torch.randn(rows, k, generator=gen).to(device, torch.bfloat16)
        ms = timed_ms(device, lambda: ops.linear(xs, packed, None), reps)
        dense_ms = timed_ms(device, lambda: xs @ dense.T, reps)
        bound_ms = int4_bytes / (env["copy_gb_s"] * 1e9) * 1e3
        result[f"int4_{n}x{k}_rows{rows}"] = {"ms": round(ms, 4), "bytes_bound_ms": round(bound_ms, 4),
                                              "ratio": round(ms / bound_ms, 2), "bf16_cublas_ms": round(dense_ms, 4)}
    result["ok"] = ok
    return result


def moe(device, dry_run: bool, env: dict) -> dict:
    """An MoE block's experts in Triton's grouped GEMMs (``kvserve.kernels.triton_moe``) on the
    device: against the block's torch loop, a token alone against the same token in a batch, and
    the time at 1 and 64 tokens against the bytes of the experts they read; Qwen3-30B-A3B's shapes
    in bf16 and GPT-OSS-20B's with MXFP4 experts."""
    import torch

    from kvserve.kernels.triton_moe import TritonMoe
    from kvserve.kernels.triton_quant_linear import TritonQuantLinear
    from kvserve.model.arch_config import ModelArchConfig
    from kvserve.model.moe import SparseMoeBlock
    from kvserve.model.quant_linear import QuantizedLinear
    from kvserve.model.quant_tensor import quantize_mxfp4

    qwen3 = dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", vocab_size=1024, hidden_size=2048,
                 intermediate_size=6144, num_hidden_layers=1, num_attention_heads=32, num_key_value_heads=4,
                 head_dim=128, num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True)
    gpt_oss = dict(architectures=["GptOssForCausalLM"], model_type="gpt_oss", vocab_size=1024, hidden_size=2880,
                   intermediate_size=2880, num_hidden_layers=1, num_attention_heads=64, num_key_value_heads=8,
                   head_dim=64, num_local_experts=32, num_experts_per_tok=4, swiglu_limit=7.0)
    if dry_run:
        qwen3 |= dict(hidden_size=64, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
        gpt_oss |= dict(hidden_size=64, intermediate_size=32, num_local_experts=8, num_experts_per_tok=2)
    result: dict = {}
    ok = True
    for name, config, mxfp4 in (("qwen3_30b_a3b_bf16", qwen3, False), ("gpt_oss_20b_mxfp4", gpt_oss, True)):
        arch = ModelArchConfig.from_dict(config)
        torch.manual_seed(0)
        with torch.device(device):
            block = SparseMoeBlock(arch, arch.moe).eval()
        for p in block.parameters():
            torch.nn.init.normal_(p, std=0.02)
        block.to(torch.bfloat16)
        if mxfp4:
            ops = TritonQuantLinear()
            for expert in block.experts:
                for part in ("gate_up_proj", "down_proj"):
                    weight = quantize_mxfp4(getattr(expert, part).weight.detach().float())
                    setattr(expert, part, QuantizedLinear(weight, None, None, triton=ops))
        block.triton_moe = TritonMoe()
        batch = 16 if dry_run else 64
        x = torch.randn(batch, arch.hidden_size, device=device).to(torch.bfloat16)
        with torch.inference_mode():
            got, want = block(x), block.torch_forward(x)
            steps = float(((got.float() - want.float()).abs() / (want.float().abs() * 2**-7 + 1e-3)).max())
            alone = bool(torch.equal(block(x[5:6]), got[5:6]))
            entry = {"steps_apart_from_torch_loop": round(steps, 2), "token_alone_equal": alone}
            expert_bytes = sum(t.numel() * t.element_size() for t in (
                [block.experts[0].gate_up_proj.weight, block.experts[0].down_proj.weight] if not mxfp4 else
                [getattr(block.experts[0], p).triton_weight.codes for p in ("gate_up_proj", "down_proj")]
                + [getattr(block.experts[0], p).triton_weight.scales for p in ("gate_up_proj", "down_proj")]))
            reps = 1 if dry_run else 30
            for tokens in (1, batch):
                xs = x[:tokens]
                ids = block._route(xs)[1]
                touched = int(torch.unique(ids).numel())
                ms = timed_ms(device, lambda: block(xs), reps)
                loop_ms = timed_ms(device, lambda: block.torch_forward(xs), reps)
                bound = touched * expert_bytes / (env["copy_gb_s"] * 1e9) * 1e3
                entry[f"tokens{tokens}"] = {"ms": round(ms, 4), "torch_loop_ms": round(loop_ms, 4),
                                            "experts_touched": touched, "bytes_bound_ms": round(bound, 4),
                                            "ratio": round(ms / bound, 2)}
        result[name] = entry
        ok = ok and alone and steps <= 2
    result["ok"] = ok
    return result


def engine_parity(device, folder: Path) -> dict:
    import torch

    from kvserve import LLM, SamplingParams
    from kvserve.testing.checkpoints import build_checkpoint

    model = build_checkpoint(folder / "tiny-llama", "LlamaForCausalLM", "bpe", "float32", seed=0)
    prompts = [[5, 17, 99, 230, 7, 64], [400, 3, 3, 12, 800, 41, 9, 2, 15]]
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=1)
    common = dict(max_model_len=128, num_gpu_blocks_override=64, seed=0)

    def run(dev, dtype):
        llm = LLM(str(model), device=dev, dtype=dtype, **common)
        return [(o.outputs[0].token_ids, [lp.logprob for lp in o.outputs[0].logprobs])
                for o in llm.generate(prompts, greedy, use_tqdm=False)]

    on_device, on_cpu = run(str(device), "float32"), run("cpu", "float32")
    result = {"float32_tokens_equal_cpu": [a[0] == b[0] for a, b in zip(on_device, on_cpu)]}
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(model, torch_dtype=torch.bfloat16).to(device).eval()
    worst = 0.0
    for prompt, (tokens, logprobs) in zip(prompts, run(str(device), "bfloat16")):
        ids = torch.tensor([prompt + tokens], device=device)
        with torch.no_grad():
            logits = reference(ids).logits[0].float()
        expected = torch.log_softmax(logits[len(prompt) - 1:-1], dim=-1)
        got = expected.gather(1, torch.tensor(tokens, device=device)[:, None])[:, 0]
        worst = max(worst, float((got.cpu() - torch.tensor(logprobs)).abs().max()))
    result["bf16_max_logprob_diff_vs_transformers"] = worst
    result["ok"] = all(result["float32_tokens_equal_cpu"]) and worst < 0.1
    return result


def benchmarks(device, folder: Path, dry_run: bool, env: dict) -> dict:
    import torch

    from kvserve import LLM, SamplingParams
    from make_qwen_shaped_model import full_vocab_tokenizer

    shape = TINY if dry_run else LLAMA31_8B
    model = folder / "llama-8b-shaped"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(shape))
    full_vocab_tokenizer(shape["vocab_size"]).save_pretrained(model)
    prefill_len, batch = (256, 4) if dry_run else (4096, 64)
    llm = LLM(str(model), load_format="dummy", dtype="bfloat16", device=str(device), max_model_len=prefill_len + 64,
              max_num_seqs=batch, max_num_batched_tokens=prefill_len, seed=0)
    params = sum(p.numel() for p in llm.llm_engine.core.loaded.model.parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in llm.llm_engine.core.loaded.model.parameters())
    gen = torch.Generator().manual_seed(1)

    def prompts(n, length):
        return torch.randint(10, shape["vocab_size"], (n, length), generator=gen).tolist()

    def timed(batch_prompts, max_tokens):
        sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        sync(device)
        start = time.perf_counter()
        llm.generate(batch_prompts, sp, use_tqdm=False)
        sync(device)
        return time.perf_counter() - start

    def step(n):  # a decode step at batch n: (N tokens - 1 token) / (N - 1)
        p = prompts(n, 16)
        timed(p, 2)  # warm
        steps = 8 if dry_run else 32
        return (timed(p, steps + 1) - timed(p, 1)) / steps

    bandwidth = env.get("copy_gb_s") or 1.0
    bound_1 = weight_bytes / (bandwidth * 1e9)
    one, many = step(1), step(batch)
    runner = llm.llm_engine.core.runner
    graphs, runner.decode_graphs = runner.decode_graphs, None
    one_eager = step(1)  # the same step without CUDA graphs (as --enforce-eager runs it)
    runner.decode_graphs = graphs
    kv_bytes = batch * (16 + 16) * shape["num_hidden_layers"] * 2 * shape["num_key_value_heads"] * shape["head_dim"] * 2
    bound_many = (weight_bytes + kv_bytes) / (bandwidth * 1e9)
    long_prompt = prompts(1, prefill_len)
    timed(long_prompt, 1)
    prefill = timed(prompts(1, prefill_len), 1)
    flops = 2 * params * prefill_len + 2 * shape["num_hidden_layers"] * shape["num_attention_heads"] * \
        shape["head_dim"] * prefill_len**2  # + causal attention (QK and PV, half the square each)
    peak = env.get("bf16_matmul_tflops") or 1.0
    result = {
        "shape": "tiny (dry run)" if dry_run else "Llama-3.1-8B", "parameters": params, "weight_gb": weight_bytes / 1e9,
        "cuda_graphs": graphs is not None, "batch1_step_eager_ms": one_eager * 1000,
        "batch1_step_ms": one * 1000, "batch1_bound_ms": bound_1 * 1000, "batch1_ratio": one / bound_1,
        f"batch{batch}_step_ms": many * 1000, f"batch{batch}_bound_ms": bound_many * 1000,
        f"batch{batch}_ratio": many / bound_many,
        f"prefill{prefill_len}_s": prefill, "prefill_tflops": flops / prefill / 1e12,
        "prefill_share_of_peak": flops / prefill / 1e12 / peak,
    }
    result["targets_met"] = {"batch1<=1.3x": result["batch1_ratio"] <= 1.3,
                             f"batch{batch}<=1.5x": result[f"batch{batch}_ratio"] <= 1.5,
                             "prefill>=60%": result["prefill_share_of_peak"] >= 0.6}
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="the CPU half: tiny shapes, Triton's interpreter")
    parser.add_argument("--out", default="gpu_check.json")
    args = parser.parse_args()
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; use --dry-run for the CPU half", file=sys.stderr)
        return 2
    device = torch.device("cpu" if args.dry_run else "cuda")
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        section(results, "environment")(lambda: environment(device, args.dry_run))
        section(results, "attention")(lambda: attention(device, args.dry_run))
        section(results, "elementwise")(lambda: elementwise(device, args.dry_run))
        section(results, "sampler")(lambda: sampler(device, args.dry_run))
        section(results, "quant")(lambda: quant(device, args.dry_run, results["environment"]))
        section(results, "moe")(lambda: moe(device, args.dry_run, results["environment"]))
        section(results, "engine_parity")(lambda: engine_parity(device, folder))
        section(results, "benchmarks")(lambda: benchmarks(device, folder, args.dry_run, results["environment"]))
    Path(args.out).write_text(json.dumps(results, indent=2, default=str))
    failed = [name for name, r in results.items() if "error" in r or r.get("ok") is False]
    print(f"gpu_check: wrote {args.out}; {'failed: ' + ', '.join(failed) if failed else 'every section ran'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
