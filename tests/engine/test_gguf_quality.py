"""Quality of GGUF files of the built-in model (the one trained model we have), as issue 15 bounds
kvserve's own quantization: held-out perplexity (``tests/data/austen_heldout.txt``, through the
engine's prompt scoring) of the F32 file equal to the folder's, Q8_0 within 1% of float32, Q4_0 and
a Q4_K/Q6_K mix (Q4_K_M's split) within 6%. The files are written by ``kvserve.testing.gguf_export``
(Q8_0 and Q4_0 by gguf's reference quantizers), scored on the first 8 of the 37 windows;
docs/benchmarks.md section 5.4 has the table over all of them (``benchmarks/gguf_quality.py``)."""

from __future__ import annotations

import pytest

from kvserve.builtin import builtin_model_path
from kvserve.kernels import cpu_kernels_available
from kvserve.testing.ggml_kquants import q4_k_m_mix
from kvserve.testing.gguf_export import export_gguf
from kvserve.testing.perplexity import perplexity, token_windows
from kvserve.tokenizer import load_tokenizer
from test_quant_quality import HELDOUT, WINDOWS
from engine_helpers import make_llm

pytestmark = pytest.mark.skipif(not cpu_kernels_available(), reason="no C++ compiler for the kernels")


def heldout_perplexity(model) -> float:
    llm = make_llm(model, max_model_len=256, num_gpu_blocks_override=512)
    ids = load_tokenizer(builtin_model_path()).encode(HELDOUT.read_text(), add_special_tokens=False)
    return perplexity(llm, token_windows(ids, 256)[:WINDOWS // 2])


@pytest.mark.slow
def test_gguf_heldout_perplexity_within_bounds(tmp_path):
    source = builtin_model_path()
    reference = heldout_perplexity(source)
    results = {"F32": heldout_perplexity(export_gguf(source, tmp_path / "f32.gguf", "f32"))}
    for outtype in ("q8_0", "q4_0"):
        results[outtype] = heldout_perplexity(export_gguf(source, tmp_path / f"{outtype}.gguf", outtype))
    results["Q4_K/Q6_K"] = heldout_perplexity(export_gguf(source, tmp_path / "k.gguf", "f32", quantize=q4_k_m_mix))
    print({name: round(value / reference, 4) for name, value in results.items()}, reference)
    assert results["F32"] == reference
    assert results["q8_0"] <= 1.01 * reference, (reference, results)
    assert results["q4_0"] <= 1.06 * reference and results["Q4_K/Q6_K"] <= 1.06 * reference, (reference, results)
