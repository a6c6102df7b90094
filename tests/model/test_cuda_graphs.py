"""Decode steps through ``kvserve.model.cuda_graphs`` on the CPU: the runner's graph path with an
eager stand-in for the capture (a CUDA graph replays the forward it recorded; the stand-in runs it
again on the same static buffers), Triton attention under its interpreter. Padded buckets give the
eager step's bits, padding rows write no KV, and the steps a graph cannot run stay eager."""

from __future__ import annotations

import pytest
import torch
from model_fixtures import sequential_block_tables

from kvserve.attention import get_attention_backend
from kvserve.errors import ConfigError
from kvserve.attention.triton_paged import TritonPagedAttentionBackend
from kvserve.model.cuda_graphs import capture_sizes, why_not_captured
from kvserve.kernels.triton_moe import TritonMoe
from kvserve.kernels.triton_quant_linear import TritonQuantLinear
from kvserve.model.loader import load_model
from kvserve.model.moe import SparseMoeBlock
from kvserve.model.quant_linear import QuantizedLinear
from kvserve.model.quant_tensor import quantize_int4
from kvserve.model.runner import ModelRunner

pytest.importorskip("triton")

pytestmark = pytest.mark.slow
BLOCK = 8


class StandIn:
    """Records nothing: each replay runs the forward again into the captured output, in the grad
    mode of the capture (a CUDA graph replays what was recorded in it)."""

    def __init__(self):
        self.captured, self.replays, self.inference = [], 0, []

    def __call__(self, forward):
        output = forward()
        self.captured.append(output.shape[0])
        inference = torch.is_inference_mode_enabled()
        self.inference.append(inference)

        def replay():
            self.replays += 1
            with torch.inference_mode(inference):
                output.copy_(forward())
        return replay, output


def test_capture_sizes_are_vllms_buckets_up_to_max_num_seqs():
    assert capture_sizes(256) == [1, 2, 4, *range(8, 257, 8)]
    assert capture_sizes(3) == [1, 2, 3] and capture_sizes(1) == [1]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20] and capture_sizes(4096) == capture_sizes(512)
    assert capture_sizes(513)[-3:] == [496, 504, 512]


def test_where_graphs_do_not_apply(tiny_checkpoint):
    path, _ = tiny_checkpoint("qwen2")
    cpu = torch.device("cpu")
    assert "torch" in why_not_captured(load_model(path, attn_backend=get_attention_backend("torch")).model,
                                       torch.float32, cpu)
    assert why_not_captured(load_model(path, attn_backend=TritonPagedAttentionBackend()).model, torch.float32, cpu) is None
    moe = load_model(tiny_checkpoint("qwen3_moe")[0], attn_backend=TritonPagedAttentionBackend()).model
    assert "mixture-of-experts" in why_not_captured(moe, torch.float32, cpu)  # the experts in torch's loop
    with_triton_experts(moe)
    assert why_not_captured(moe, torch.float32, cpu) is None
    assert ModelRunner(load_model(path), num_blocks=8, block_size=BLOCK).decode_graphs is None  # CPU, no capturer


def with_triton_experts(model) -> None:
    """The MoE blocks' experts in Triton's grouped GEMMs as on CUDA (no CPU kernels), int4 packed
    for Triton (the other linears then stay on the CPU's batch-invariant kernels; torch's float32
    CPU GEMM is not)."""
    ops = TritonQuantLinear()
    for module in model.modules():
        if isinstance(module, SparseMoeBlock):
            module.ops, module.triton_moe = None, TritonMoe()
            for expert in module.experts:
                for name in ("gate_up_proj", "down_proj"):
                    weight = getattr(expert, name).weight.detach().float()
                    setattr(expert, name, QuantizedLinear(quantize_int4(weight, 32), None, None, triton=ops))


@pytest.mark.parametrize(("variant", "dtype"), [("qwen2", torch.float32), ("qwen3_moe", torch.bfloat16)])
def test_padded_graph_decode_steps_give_the_eager_bits(tiny_checkpoint, variant, dtype):
    """A dense model, and an MoE model whose experts run in Triton's grouped GEMMs (padding rows
    are routed like any token and must change no other row); the MoE model in bfloat16."""
    path, _ = tiny_checkpoint(variant)
    stand_in = StandIn()

    def runner(capturer):
        loaded = load_model(path, dtype=dtype, attn_backend=TritonPagedAttentionBackend())
        if variant.endswith("_moe"):
            with_triton_experts(loaded.model)
        return ModelRunner(loaded, num_blocks=32, block_size=BLOCK, max_num_reqs=4, max_model_len=24,
                           graph_capturer=capturer)

    graphed, eager = runner(stand_in), runner(None)
    assert stand_in.captured == [4, 2, 1] and eager.decode_graphs is None
    assert all(stand_in.inference)  # recorded as the steps run (no autograd, the fused kernels)
    prompts = [[5, 17, 3, 99, 41, 7, 8], [11, 12, 13], [200, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [60]]
    extra = 3
    tables = sequential_block_tables([len(p) + extra for p in prompts], BLOCK, start=1, reverse=True)
    tokens = [list(p) for p in prompts]
    for run in (graphed, eager):  # prefill: eager on both
        run.forward(tokens, tables)
    assert stand_in.replays == 0
    for step in range(extra):  # 4, 3 and 1 requests: buckets 4 (no padding), 4 (one row), 1
        active = [0, 1, 2, 3] if step == 0 else [0, 2, 3] if step == 1 else [1]
        for r in active:
            tokens[r].append((7 * step + r) % 256)
        args = ([tokens[r] for r in active], [tables[r] for r in active], [len(tokens[r]) - 1 for r in active])
        got, want = graphed.forward(*args), eager.forward(*args)
        assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert stand_in.replays == extra
    assert all(torch.equal(g, e) for g, e in zip(graphed.kv_caches, eager.kv_caches))  # padding wrote nothing
    # a step with a prefill chunk in it runs eagerly
    tokens[1].extend([3, 4])
    args = ([tokens[1]], [tables[1]], [len(tokens[1]) - 2])
    assert torch.equal(graphed.forward(*args)[0], eager.forward(*args)[0]) and stand_in.replays == extra


def test_a_failed_capture_ends_the_start_with_one_line_naming_it(tiny_checkpoint):
    def capturer(forward):
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    loaded = load_model(tiny_checkpoint("qwen2")[0], attn_backend=TritonPagedAttentionBackend())
    with pytest.raises(ConfigError, match="capturing CUDA graphs failed .*operation not permitted.*--enforce-eager"):
        ModelRunner(loaded, num_blocks=8, block_size=BLOCK, graph_capturer=capturer)
    assert ModelRunner(loaded, num_blocks=8, block_size=BLOCK, graph_capturer=capturer,
                       enforce_eager=True).decode_graphs is None
