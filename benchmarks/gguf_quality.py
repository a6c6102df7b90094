"""Quality of GGUF files of the built-in model: the table of ``docs/benchmarks.md`` section 5.4,
"GGUF files".

Files written by ``kvserve.testing.gguf_export`` from the built-in model (float32, the one trained
model we have): F32, Q8_0 and Q4_0 (gguf's reference quantizers, bit-exact with ggml's) and a
Q4_K/Q6_K mix (Q4_K_M's split, ``kvserve.testing.ggml_kquants.q4_k_m_mix``). For each: perplexity
on the held-out Austen text (all windows, token ids from the source tokenizer, through the
engine's prompt scoring) and greedy agreement over 128 tokens with the float32 folder (same prompt
ids; share of matching positions, first position that differs).

    python benchmarks/gguf_quality.py [--json out.json]

No timing: it runs beside other work without disturbing a figure.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from quant_quality import HELDOUT, PROMPTS, agreement, greedy

from kvserve import LLM
from kvserve.builtin import builtin_model_path
from kvserve.testing.ggml_kquants import q4_k_m_mix
from kvserve.testing.gguf_export import export_gguf
from kvserve.testing.perplexity import perplexity, token_windows
from kvserve.tokenizer import load_tokenizer

FILES = {"F32": ("f32", None), "Q8_0": ("q8_0", None), "Q4_0": ("q4_0", None), "Q4_K/Q6_K": ("f32", q4_k_m_mix)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    source = builtin_model_path()
    tokenizer = load_tokenizer(source)
    windows = token_windows(tokenizer.encode(HELDOUT.read_text(), add_special_tokens=False), 256)
    prompts = [{"prompt_token_ids": tokenizer.encode(text, add_special_tokens=False)} for text in PROMPTS]

    def measure(model) -> tuple[float, list[list[int]]]:
        llm = LLM(str(model), dtype="float32", max_model_len=256, num_gpu_blocks_override=512, seed=0)
        return perplexity(llm, windows), greedy(llm, prompts, 128)

    reference, ref_tokens = measure(source)
    rows = [{"weights": "float32 folder", "ppl": reference, "vs_float32": 1.0}]
    with tempfile.TemporaryDirectory() as tmp:
        for name, (outtype, quantize) in FILES.items():
            path = export_gguf(source, Path(tmp) / f"{name.replace('/', '-')}.gguf", outtype, quantize=quantize)
            ppl, tokens = measure(path)
            rows.append({"weights": f"GGUF {name}", "ppl": ppl, "vs_float32": ppl / reference,
                         "bytes": path.stat().st_size, **agreement(tokens, ref_tokens)})
    for row in rows:
        print(json.dumps(row))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
