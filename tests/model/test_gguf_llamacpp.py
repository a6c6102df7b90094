"""GGUF files quantized by llama.cpp's own quantizer (``llama_model_quantize`` of llama-cpp-python,
in the llama.cpp venv of the baselines, ``/tmp/llamacpp-venv``; skipped where it is not installed:
``tests/model/test_gguf_serving.py`` covers the formats without it): every quantized matrix loads
with the file's values exactly (``gguf.quants.dequantize``), and the model serves."""

from __future__ import annotations

import subprocess
from pathlib import Path

import gguf
import numpy as np
import pytest

from kvserve import SamplingParams
from kvserve.engine.llm import LLM
from kvserve.kernels import cpu_kernels_available
from kvserve.model.gguf_names import llama_rotary_order
from kvserve.model.loader import load_model
from kvserve.model.quant_linear import QuantizedLinear
from kvserve.model.stacked_linear import StackedLinear
from kvserve.testing.checkpoints import build_checkpoint
from kvserve.testing.gguf_export import export_gguf

LLAMACPP_PYTHON = Path("/tmp/llamacpp-venv/bin/python")
QUANTIZE = """
import sys, llama_cpp
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = int(sys.argv[3])
params.nthread = 1
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), params))
"""
# llama.cpp's LLAMA_FTYPE values (llama.h).
FTYPES = {"Q8_0": 7, "Q4_0": 2, "Q4_K_M": 15}


def llamacpp_available() -> bool:
    if not LLAMACPP_PYTHON.is_file():
        return False
    return subprocess.run([str(LLAMACPP_PYTHON), "-c", "import llama_cpp"], capture_output=True).returncode == 0


pytestmark = [
    pytest.mark.skipif(not llamacpp_available(), reason=f"llama-cpp-python is not installed in {LLAMACPP_PYTHON}"),
    pytest.mark.skipif(not cpu_kernels_available(), reason="no C++ compiler for the kernels"),
]


def layer_parts(layer) -> list[QuantizedLinear]:
    return list(layer.parts) if isinstance(layer, StackedLinear) else [layer]


@pytest.mark.parametrize("ftype", list(FTYPES))
def test_llamacpp_quantized_file_loads_its_values(tmp_path, ftype):
    source = build_checkpoint(tmp_path / "src", "LlamaForCausalLM", "bpe", "float32", seed=5, hidden_size=256,
                              intermediate_size=512, head_dim=64, initializer_range=0.1)
    f32 = export_gguf(source, tmp_path / "m-f32.gguf", "f32")
    out = tmp_path / f"m-{ftype}.gguf"
    subprocess.run([str(LLAMACPP_PYTHON), "-c", QUANTIZE, str(f32), str(out), str(FTYPES[ftype])], check=True,
                   capture_output=True)
    reader = {t.name: t for t in gguf.GGUFReader(str(out)).tensors}
    model = load_model(out, dtype="float32").model
    for i, layer in enumerate(model.model.layers):
        names = [(f"blk.{i}.attn_q.weight", 4), (f"blk.{i}.attn_k.weight", 2), (f"blk.{i}.attn_v.weight", None)]
        values = []
        for name, heads in names:
            tensor = reader[name]
            data = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(-1, 256)
            values.append(data if heads is None else data[np.argsort(llama_rotary_order(data.shape[0], heads))])
        ours = np.concatenate([p.dequantized_weight().numpy() for p in layer_parts(layer.self_attn.qkv_proj)])
        assert np.array_equal(ours, np.concatenate(values)), i
        down = reader[f"blk.{i}.ffn_down.weight"]
        assert np.array_equal(layer.mlp.down_proj.dequantized_weight().numpy(),
                              gguf.quants.dequantize(down.data, down.tensor_type).reshape(256, 512)), i
    text = LLM(str(out), dtype="float32", max_model_len=64, num_gpu_blocks_override=16).generate(
        "Hello", SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))[0].outputs[0]
    assert len(text.token_ids) == 4
