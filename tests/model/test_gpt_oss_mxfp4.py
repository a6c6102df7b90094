"""GPT-OSS with its experts in MXFP4 as the released checkpoints store them (``_blocks`` /
``_scales``, ``quantization_config.quant_method: mxfp4``): loaded 4-bit into kvserve's int4
kernels with the E2M1 codebook, the float32 logits equal to transformers' (which dequantizes the
same tensors on a CPU) within 1e-4, bfloat16 greedy tokens equal up to a genuine tie, and the
flags that contradict the checkpoint refused by name."""

from __future__ import annotations

import shutil

import pytest
import torch
from model_fixtures import VARIANTS, flat_prompt_logits, relative_error, save_checkpoint

from kvserve.errors import CheckpointError, ConfigError
from kvserve.generate import generate
from kvserve.model.loader import load_model
from kvserve.model.quant_linear import QuantizedLinear
from kvserve.model.runner import ModelRunner
from kvserve.testing.checkpoints import store_experts_as_mxfp4
from test_generate import PROMPTS, assert_same_greedy_up_to_a_bf16_tie, hf_greedy_with_logits


@pytest.fixture(scope="module")
def mxfp4_checkpoint(tmp_path_factory):
    """(dtype) -> (folder, transformers' model loaded from it in that dtype)."""
    cache = {}

    def get(dtype):
        if dtype not in cache:
            from transformers import AutoModelForCausalLM, Mxfp4Config

            path = tmp_path_factory.mktemp(f"gpt_oss_mxfp4_{str(dtype).split('.')[-1]}")
            save_checkpoint(path, *VARIANTS["gpt_oss"], dtype)
            store_experts_as_mxfp4(path)
            # dequantized, as transformers does on a CPU without Triton (with Triton installed it
            # would fetch GPU kernels from the Hub)
            reference = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype,
                                                             quantization_config=Mxfp4Config(dequantize=True))
            cache[dtype] = path, reference.eval()
        return cache[dtype]

    return get


def test_float32_logits_match_transformers(mxfp4_checkpoint):
    path, ref = mxfp4_checkpoint(torch.float32)
    loaded = load_model(path, "float32")
    experts = loaded.model.model.layers[0].mlp.experts
    assert all(type(e.gate_up_proj) is QuantizedLinear and e.gate_up_proj.codebook == "e2m1" for e in experts)
    assert loaded.weight_format.startswith("mxfp4: mxfp4 (group 32) x 24")
    assert loaded.quantization.label == "mxfp4"
    runner = ModelRunner(loaded, num_blocks=32, block_size=4)
    tables = [[0, 1, 2, 3, 4, 5], [6, 7], [8, 9, 10]]
    for prompt, logits in zip(PROMPTS, flat_prompt_logits(runner, PROMPTS, tables), strict=True):
        with torch.no_grad():
            want = ref(torch.tensor([prompt])).logits[0].float()
        assert relative_error(logits, want) < 1e-4


def test_bfloat16_greedy_matches_transformers(mxfp4_checkpoint):
    path, ref = mxfp4_checkpoint(torch.bfloat16)
    ours = generate(path, PROMPTS, max_tokens=32, block_size=16, ignore_eos=True)
    for prompt, tokens in zip(PROMPTS, ours, strict=True):
        assert_same_greedy_up_to_a_bf16_tie(tokens, *hf_greedy_with_logits(ref, prompt, 32))


def test_contradicting_flags_and_fields_are_refused(mxfp4_checkpoint, tmp_path):
    from kvserve.config import QuantizationConfig

    path, _ = mxfp4_checkpoint(torch.float32)
    with pytest.raises(ConfigError, match="--quantization int4 contradicts the checkpoint: .* quantized with mxfp4"):
        load_model(path, "float32", quantization=QuantizationConfig("int4"))
    folder = tmp_path / "dequantize"
    shutil.copytree(path, folder)
    config = (folder / "config.json").read_text().replace('"quant_method": "mxfp4"',
                                                           '"quant_method": "mxfp4", "dequantize": true')
    (folder / "config.json").write_text(config)
    with pytest.raises(CheckpointError, match="dequantize = true: kvserve keeps MXFP4 experts 4-bit"):
        load_model(folder, "float32")
