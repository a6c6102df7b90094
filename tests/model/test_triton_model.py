"""A model on its GPU path, run on the CPU by Triton's interpreter: Triton paged attention and the
Triton elementwise kernels bound as a CUDA device binds them (``bind_kernels(..., triton=True)``),
the C++ kernels off; logits of a flat batch against transformers' float32 ones on the same weights
(bfloat16: the rotary embedding runs in Triton too)."""

from __future__ import annotations

import pytest
from model_fixtures import flat_prompt_logits, hf_logits, relative_error, sequential_block_tables

from kvserve.attention.triton_paged import TritonPagedAttentionBackend
from kvserve.kernels.triton_elementwise import TritonElementwise
from kvserve.model.kernel_layer import KernelLayer, bind_kernels
from kvserve.model.loader import load_model
from kvserve.model.runner import ModelRunner

pytest.importorskip("triton")

pytestmark = pytest.mark.slow
PROMPTS = [[(7 * i + 3) % 256 for i in range(12)], [(11 * i + 5) % 256 for i in range(5)], [42]]


@pytest.mark.parametrize(("dtype", "tolerance"), [("float32", 1e-4), ("bfloat16", 3e-2)])
def test_the_triton_path_gives_transformers_logits(tiny_checkpoint, dtype, tolerance):
    path, hf_model = tiny_checkpoint("qwen2")
    loaded = load_model(path, dtype=dtype, attn_backend=TritonPagedAttentionBackend())
    bind_kernels(loaded.model, "cuda", triton=True)
    layers = [m for m in loaded.model.modules() if isinstance(m, KernelLayer)]
    on_triton = {type(m).__name__ for m in layers if isinstance(m.ops, TritonElementwise)}
    assert on_triton == {"RMSNorm", "SiluAndMul", "LlamaAttention"}
    assert all(m.ops is None for m in layers if not m.triton_kernels)
    runner = ModelRunner(loaded, num_blocks=16, block_size=8, prepack_linears=False)
    tables = sequential_block_tables([len(p) for p in PROMPTS], 8, start=1, reverse=True)
    for prompt, logits in zip(PROMPTS, flat_prompt_logits(runner, PROMPTS, tables)):
        assert relative_error(logits.float(), hf_logits(hf_model, prompt)) < tolerance


def test_the_torch_attention_backend_keeps_torch_code_on_cuda(tiny_checkpoint):
    loaded = load_model(tiny_checkpoint("qwen2")[0])
    bind_kernels(loaded.model, "cuda", triton=False)
    assert all(m.ops is None for m in loaded.model.modules() if isinstance(m, KernelLayer))
