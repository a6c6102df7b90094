"""The decoder layers' C++ loop (``kvserve.model.fused_decoder``) gives the modules' bits exactly:
logits of prefill chunks and decode steps from a runner with it equal those of a runner that runs
the modules (``enforce_eager``), for every architecture variant, float32 and bfloat16, float and
int8/int4 weights; and it stays off where it does not apply."""

import pytest
import torch
from model_fixtures import sequential_block_tables

from kvserve.attention import get_attention_backend
from kvserve.config import QuantizationConfig
from kvserve.kernels import cpu_kernels_available
from kvserve.model.fused_decoder import FusedDecoder
from kvserve.model.llama import MLP_TILE_ROWS
from kvserve.model.loader import load_model
from kvserve.model.runner import ModelRunner

pytestmark = pytest.mark.skipif(not cpu_kernels_available(), reason="no C++ compiler for the kernels")

BLOCK = 4


def runners(path, dtype, quantization=QuantizationConfig(), kv_cache_dtype="auto", num_blocks=64):
    """(fused, modules): two runners over the same checkpoint, one with the C++ loop."""
    def make(enforce_eager):
        loaded = load_model(path, dtype=dtype, attn_backend=get_attention_backend("cpu_paged"),
                            quantization=quantization)
        return ModelRunner(loaded, num_blocks=num_blocks, block_size=BLOCK, enforce_eager=enforce_eager,
                           kv_cache_dtype=kv_cache_dtype)
    return make(False), make(True)


def assert_same_steps(fused, modules, prompts, extra):
    """Prefill ``prompts`` in two chunks, then ``extra`` tokens each one at a time (a batch decode
    step), on both runners; every step's logits must be equal bit for bit."""
    lengths = [len(p) + extra for p in prompts]
    tables = sequential_block_tables(lengths, BLOCK, reverse=True)
    half = [len(p) // 2 for p in prompts]
    steps = [([p[:h] for p, h in zip(prompts, half)], None), (prompts, half)]
    tokens = [list(p) for p in prompts]
    for i in range(extra):
        for t in tokens:
            t.append((t[-1] * 7 + i) % 200)
        steps.append(([list(t) for t in tokens], [len(t) - 1 for t in tokens]))
    for token_ids, computed in steps:
        ours = fused.forward(token_ids, tables, computed)
        ref = modules.forward(token_ids, tables, computed)
        for a, b in zip(ours, ref, strict=True):
            assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("variant", ["llama", "llama_mha_tied", "mistral_window", "qwen2", "qwen2_window", "qwen3",
                                     "mixtral", "mixtral_top1", "qwen2_moe", "qwen3_moe", "qwen3_moe_step2",
                                     "phi3_longrope"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_equals_modules(tiny_checkpoint, variant, dtype):
    path, _ = tiny_checkpoint(variant)
    fused, modules = runners(path, dtype)
    assert fused.fused_decoder is not None and modules.fused_decoder is None
    assert_same_steps(fused, modules, [[5, 9, 14, 2, 77, 31, 8], [3] * 11, [100, 4]], extra=3)


@pytest.mark.parametrize("variant", ["qwen2", "qwen3_moe"])
@pytest.mark.parametrize("method", ["int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_equals_modules_quantized(tiny_checkpoint, variant, method, dtype):
    path, _ = tiny_checkpoint(variant)
    fused, modules = runners(path, dtype, QuantizationConfig(method=method, group_size=32, lm_head=True))
    assert fused.fused_decoder is not None
    assert_same_steps(fused, modules, [[5, 9, 14, 2, 77, 31, 8], [100, 4, 6]], extra=2)


def test_fused_mlp_tiles_a_long_prefill(tiny_checkpoint):
    """More than ``MLP_TILE_ROWS`` tokens in one step: the C++ loop tiles the MLP as the module does."""
    path, _ = tiny_checkpoint("llama")
    fused, modules = runners(path, torch.bfloat16, num_blocks=2 * MLP_TILE_ROWS // BLOCK)
    prompt = [(i * 13) % 250 for i in range(MLP_TILE_ROWS + 40)]
    tables = sequential_block_tables([len(prompt)], BLOCK)
    assert torch.equal(fused.forward([prompt], tables)[0], modules.forward([prompt], tables)[0])


def test_fused_decoder_stays_off_where_it_does_not_apply(tiny_checkpoint):
    path, _ = tiny_checkpoint("llama")
    torch_backend = load_model(path, attn_backend=get_attention_backend("torch"))
    assert ModelRunner(torch_backend, num_blocks=8, block_size=BLOCK).fused_decoder is None
    one_byte_kv, _ = runners(path, torch.float32, kv_cache_dtype="int8")
    assert one_byte_kv.fused_decoder is None
    loaded = load_model(path, attn_backend=get_attention_backend("cpu_paged"))
    assert FusedDecoder.build(loaded.model, []) is None  # no KV caches for its layers


@pytest.mark.parametrize("variant", ["granite", "smollm3", "olmo2", "phi3_partial"])
def test_families_the_loop_does_not_run_keep_the_modules(tiny_checkpoint, variant):
    """Granite's residual multiplier, SmolLM3's layers without RoPE, OLMo 2's norms after the
    sublayers and a partial rotary are not in the C++ loop: those models run their modules."""
    path, _ = tiny_checkpoint(variant)
    fused, _ = runners(path, torch.float32)
    assert fused.fused_decoder is None
