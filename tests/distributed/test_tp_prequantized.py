"""GPTQ and AWQ checkpoints under tensor parallelism (``kvserve.distributed.prequantized``): each
rank reads its slices of the packed tensors; TP 2 gives float32 logits within 1e-5 of TP 1 on the
same checkpoint and the same greedy tokens (4-bit GPTQ with zero points and a quantized LM head,
AWQ on a model with biases, 8-bit GPTQ per channel in act order), each rank's layers hold exactly its rows or columns
of TP 1's dequantized weights, and the checkpoints whose groups cannot split are refused by name
before any rank starts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from kvserve.distributed.shard import TensorParallelShard
from kvserve.engine.llm import LLM
from kvserve.errors import ConfigError
from kvserve.kernels import cpu_kernels_available
from kvserve.model.quant_linear import QuantizedLinear

sys.path.insert(0, str(Path(__file__).parents[1] / "quantization"))
from prequantized_writer import write_prequantized  # noqa: E402
from tp_workload import COMMON as BASE  # noqa: E402
from tp_workload import forward_and_generate  # noqa: E402

pytestmark = pytest.mark.skipif(not cpu_kernels_available(), reason="no C++ compiler for the kernels")

COMMON = BASE | {"num_gpu_blocks_override": 64}
CHECKPOINTS = {
    # With a quantized LM head (vocabulary rows split) and the zero biases older writers store.
    "gptq_v2_g32_lm_head": ("LlamaForCausalLM", dict(method="gptq", group_size=32, sym=False, lm_head=True,
                                                     extra_bias=0.0)),
    "awq_g32": ("Qwen2ForCausalLM", dict(method="awq", group_size=32)),
    "gptq_int8_channel": ("LlamaForCausalLM", dict(method="gptq", group_size=-1, desc_act=True, sym=True, bits=8)),
}


def write(checkpoint_factory, tmp_path_factory, architecture: str, **options) -> Path:
    out = tmp_path_factory.mktemp("tp-quantized")
    write_prequantized(checkpoint_factory(architecture), out, tmp_path_factory.mktemp("tp-quantized-ref"), **options)
    return out



def quantized_weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name.removesuffix(".linear"): m.dequantized_weight().float() for name, m in module.named_modules()
            if isinstance(m, QuantizedLinear)}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_tp2_prequantized_matches_tp1(checkpoint_factory, tmp_path_factory, name):
    architecture, options = CHECKPOINTS[name]
    folder = write(checkpoint_factory, tmp_path_factory, architecture, **options)
    reference = LLM(str(folder), tensor_parallel_size=1, **COMMON)
    want_logits, want = forward_and_generate(reference)
    whole = quantized_weights(reference.llm_engine.core.loaded.model)
    sharded = LLM(str(folder), tensor_parallel_size=2, **COMMON)
    try:
        loaded = sharded.llm_engine.core.loaded
        assert loaded.quantization.checkpoint is not None and loaded.weight_format.startswith(options["method"])
        got_logits, got = forward_and_generate(sharded)
    finally:
        sharded.shutdown()
    shard = TensorParallelShard(0, 2, loaded.arch)
    rank0 = quantized_weights(loaded.model.module)
    assert set(rank0) == set(whole)
    for module, weight in rank0.items():  # rank 0's rows (column-parallel) or columns (row-parallel), exactly
        projection = module.rpartition(".")[2]
        if projection in ("o_proj", "down_proj"):
            assert torch.equal(weight, whole[module][:, slice(*shard.rows_of(projection))])
        elif projection == "lm_head":
            assert torch.equal(weight, whole[module][slice(*shard.vocab_rows)])
        else:
            parts = ("q_proj", "k_proj", "v_proj") if projection == "qkv_proj" else ("gate_proj", "up_proj")
            sizes = [TensorParallelShard(0, 1, loaded.arch).rows_of(p)[1] for p in parts]  # whole q, k, v
            starts = [sum(sizes[:i]) for i in range(len(parts))]
            rows = [whole[module][start + a : start + b]
                    for start, p in zip(starts, parts, strict=True) for a, b in [shard.rows_of(p)]]
            assert torch.equal(weight, torch.cat(rows))
    for g, w in zip(got_logits, want_logits, strict=True):
        assert float((g.float() - w.float()).abs().max() / w.float().abs().max()) < 1e-5
    for (ids, lps), (want_ids, want_lps) in zip(got, want, strict=True):
        assert ids == want_ids and len(ids) == 32
        assert lps == pytest.approx(want_lps, rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("options, words", [
    (dict(method="gptq", group_size=32, desc_act=True, sym=False),
     r"^a gptq-int4-g32-act_order checkpoint with --tensor-parallel-size 2 is not supported: act order "
     r"\(quantization_config.desc_act\)"),
    (dict(method="awq", group_size=64),
     r"^a awq-int4-g64 checkpoint with --tensor-parallel-size 2 is not supported: each rank takes 32 of o_proj's "
     r"64 inputs, not a multiple of group_size 64"),
])
def test_checkpoints_whose_groups_do_not_split_are_refused_by_name(checkpoint_factory, tmp_path_factory, options,
                                                                  words):
    folder = write(checkpoint_factory, tmp_path_factory, "LlamaForCausalLM", **options)
    with pytest.raises(ConfigError, match=words):
        LLM(str(folder), tensor_parallel_size=2, **COMMON)
