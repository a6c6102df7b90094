"""Adapters in the model runner against ``transformers`` + ``peft`` on the same weights: float32
logits alone and in a batch mixing four adapters and the base model, for each architecture."""

from __future__ import annotations

import pytest
import torch
from lora_fixtures import SPECS, peft_logits
from model_fixtures import hf_logits, relative_error, sequential_block_tables

import kvserve.model.llama as llama
from kvserve.config import LoRAConfig
from kvserve.lora.request import LoRARequest
from kvserve.model.loader import load_model
from kvserve.model.runner import ModelRunner

TOLERANCE = 1e-4  # max abs diff relative to the largest reference logit (as tests/model)
PROMPTS = [
    [(7 * i + 3) % 256 for i in range(19)],
    [(11 * i + 5) % 256 for i in range(7)],
    [(13 * i + 1) % 256 for i in range(33)],
    [42, 17],
    [(5 * i + 2) % 256 for i in range(12)],  # the base model's row
]
ARCHITECTURES = ["llama", "mistral_window", "qwen2", "qwen3", "gemma3", "olmo2"]


def _setup(tiny_checkpoint, adapter_factory, variant, dtype="float32"):
    path, hf_model = tiny_checkpoint(variant)
    adapters = [adapter_factory(path, spec) for spec in SPECS]
    runner = ModelRunner(load_model(path, dtype), num_blocks=64, block_size=4,
                         lora_config=LoRAConfig(max_loras=4, max_lora_rank=64))
    loras = [LoRARequest(f"adapter-{i}", i + 1, str(folder)) for i, (folder, _) in enumerate(adapters)]
    return runner, hf_model, [ref for _, ref in adapters], loras


def _tables():
    return sequential_block_tables([len(p) for p in PROMPTS], 4, start=1, reverse=True)


def _invariant(runner) -> bool:
    return runner.lora.layers[0]["qkv_proj"]._kernels is not None


@pytest.mark.parametrize("variant", ARCHITECTURES)
def test_adapters_alone_and_mixed_match_peft(tiny_checkpoint, adapter_factory, variant):
    runner, hf_model, refs, loras = _setup(tiny_checkpoint, adapter_factory, variant)
    tables = _tables()
    alone = [runner.forward([p], [t], lora_requests=[lora])[0].float()
             for p, t, lora in zip(PROMPTS, tables, loras + [None])]
    mixed = [x.float() for x in runner.forward(PROMPTS, tables, lora_requests=loras + [None])]
    base_alone = runner.forward([PROMPTS[-1]], [tables[-1]])[0].float()  # no LoRA context at all
    for i, (prompt, ref) in enumerate(zip(PROMPTS, refs)):
        expected = peft_logits(ref, prompt)
        assert relative_error(alone[i], expected) < TOLERANCE, (variant, i)
        assert relative_error(mixed[i], expected) < TOLERANCE, (variant, i)
        assert relative_error(expected, hf_logits(hf_model, prompt)) > 1e-2  # the adapter does change the logits
    assert relative_error(mixed[-1], hf_logits(hf_model, PROMPTS[-1])) < TOLERANCE
    if _invariant(runner):  # the batch-invariant CPU path: the same bits alone and mixed
        for i in range(len(PROMPTS)):
            assert torch.equal(alone[i], mixed[i]), (variant, i)
        assert torch.equal(mixed[-1], base_alone)


def test_mixed_batch_is_bit_identical_in_bfloat16(tiny_checkpoint, adapter_factory):
    runner, _, _, loras = _setup(tiny_checkpoint, adapter_factory, "qwen2", dtype="bfloat16")
    if not _invariant(runner):
        pytest.skip("no C++ kernels: F.linear gives no batch invariance")
    tables = _tables()
    mixed = runner.forward(PROMPTS, tables, lora_requests=[loras[3], None, loras[0], loras[2], loras[1]])
    order = [loras[3], None, loras[0], loras[2], loras[1]]
    for i, (prompt, table, lora) in enumerate(zip(PROMPTS, tables, order)):
        assert torch.equal(runner.forward([prompt], [table], lora_requests=[lora])[0], mixed[i]), i


def test_mlp_tiles_keep_each_token_on_its_adapter(tiny_checkpoint, adapter_factory, monkeypatch):
    """Long prefills run the MLP in row tiles; each tile must get its own tokens' adapters."""
    runner, _, refs, loras = _setup(tiny_checkpoint, adapter_factory, "llama")
    tables = _tables()
    untiled = runner.forward(PROMPTS, tables, lora_requests=loras + [None])
    monkeypatch.setattr(llama, "MLP_TILE_ROWS", 8)
    tiled = runner.forward(PROMPTS, tables, lora_requests=loras + [None])
    for i, prompt in enumerate(PROMPTS[:-1]):
        assert relative_error(tiled[i].float(), peft_logits(refs[i], prompt)) < TOLERANCE
        if _invariant(runner):
            assert torch.equal(tiled[i], untiled[i])


def test_torch_path_without_kernels_matches_peft(tiny_checkpoint, adapter_factory, monkeypatch):
    """Where the C++ kernels cannot run (CUDA, no compiler) the adapters go through torch matmuls."""
    import kvserve.lora.manager as manager

    monkeypatch.setattr(manager, "_kernels_for", lambda *args: None)
    runner, hf_model, refs, loras = _setup(tiny_checkpoint, adapter_factory, "qwen2")
    assert not _invariant(runner)
    mixed = runner.forward(PROMPTS, _tables(), lora_requests=loras + [None])
    for i, prompt in enumerate(PROMPTS[:-1]):
        assert relative_error(mixed[i].float(), peft_logits(refs[i], prompt)) < TOLERANCE, i
    assert relative_error(mixed[-1].float(), hf_logits(hf_model, PROMPTS[-1])) < TOLERANCE
