"""GGUF files under tensor parallelism: each rank reads its rows (q/k/v in Hugging Face order
after llama.cpp's q/k permutation, gate/up, vocabulary) and columns (o_proj, down_proj, in whole
quantization blocks) from the memory map. TP 2 gives each rank exactly TP 1's rows or columns of
the file's integers and scales, float32 logits within 1e-5 of TP 1 and the same greedy tokens
(Llama Q8_0 with its permuted q/k, Qwen2 Q4_0 with q/k/v biases); a split that would cut a block
is refused by name."""

from __future__ import annotations

import pytest
import torch

from kvserve.attention import get_attention_backend
from kvserve.distributed.shard import TensorParallelShard
from kvserve.engine.llm import LLM
from kvserve.errors import ConfigError
from kvserve.kernels import cpu_kernels_available
from kvserve.model.gguf_file import open_gguf
from kvserve.model.gguf_loader import load_gguf_model
from kvserve.testing.gguf_export import export_gguf
from tp_workload import COMMON as BASE
from tp_workload import forward_and_generate

pytestmark = pytest.mark.skipif(not cpu_kernels_available(), reason="no C++ compiler for the kernels")

COMMON = BASE | {"num_gpu_blocks_override": 64}


@pytest.mark.slow
@pytest.mark.parametrize("fixture, outtype", [("tiny_llama", "q8_0"), ("tiny_qwen2", "q4_0")])
def test_tp2_gguf_matches_tp1(request, tmp_path, fixture, outtype):
    path = export_gguf(request.getfixturevalue(fixture), tmp_path / f"m-{outtype}.gguf", outtype)
    reference = LLM(str(path), tensor_parallel_size=1, **COMMON)
    want_logits, want = forward_and_generate(reference)
    whole = reference.llm_engine.core.loaded.model.model.layers[1]
    sharded = LLM(str(path), tensor_parallel_size=2, **COMMON)
    try:
        loaded = sharded.llm_engine.core.loaded
        assert loaded.weight_format.startswith(f"GGUF {outtype.upper()}")
        got_logits, got = forward_and_generate(sharded)
    finally:
        sharded.shutdown()
    shard = TensorParallelShard(0, 2, loaded.arch)
    layer = loaded.model.module.model.layers[1]  # rank 0's: its q rows and its o_proj columns, exactly
    q_rows = slice(*shard.rows_of("q_proj"))
    assert torch.equal(layer.self_attn.qkv_proj.dequantized_weight()[q_rows],
                       whole.self_attn.qkv_proj.dequantized_weight()[q_rows])
    assert torch.equal(layer.self_attn.o_proj.linear.dequantized_weight(),
                       whole.self_attn.o_proj.dequantized_weight()[:, slice(*shard.rows_of("o_proj"))])
    for g, w in zip(got_logits, want_logits, strict=True):
        assert float((g.float() - w.float()).abs().max() / w.float().abs().max()) < 1e-5
    for (ids, lps), (want_ids, want_lps) in zip(got, want, strict=True):
        assert ids == want_ids and len(ids) == 32
        assert lps == pytest.approx(want_lps, rel=1e-5, abs=1e-5)


def test_a_split_inside_a_quantization_block_is_refused(tiny_llama, tmp_path):
    """-tp 4 gives each rank 16 of o_proj's 64 inputs: half a Q8_0 block of 32."""
    gguf = open_gguf(export_gguf(tiny_llama, tmp_path / "m-q8_0.gguf", "q8_0"))
    shard = TensorParallelShard(0, 4, gguf.arch)
    with pytest.raises(ConfigError, match=r"^a GGUF file with --tensor-parallel-size 4: tensor "
                                          r"'blk.0.attn_output.weight' is Q8_0, in blocks of 32 inputs, but each "
                                          "rank takes 16 of its 64 inputs; a block would straddle two ranks"):
        load_gguf_model(gguf, torch.float32, "cpu", get_attention_backend("torch", torch.device("cpu")), shard)
