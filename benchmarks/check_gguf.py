"""Check ``gguf_export.py`` (``kvserve.testing.gguf_export``) against transformers: llama.cpp must compute the same logits.

    python benchmarks/check_gguf.py [--llamacpp-python /tmp/llamacpp-venv/bin/python]

For tiny random-weight Llama and Qwen2 checkpoints (hidden 64, 2 layers, float32, from
:func:`kvserve.testing.checkpoints.build_checkpoint`): transformers greedily extends a fixed
prompt by 16 tokens; the whole sequence goes through llama.cpp (F32 GGUF, ``logits_all``) in the
llama.cpp venv, and the logits of every position are compared. Pass: the argmax agrees at every
position and the largest absolute difference is below 0.2% of the logits' range (llama.cpp keeps
its KV cache in f16). A Llama GGUF written *without* the q/k permutation is checked too and must
disagree, which shows the permutation is what makes Llama right (Qwen2 needs none). Exit 0 when
all pass. Takes about 30 s.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from kvserve.testing.checkpoints import build_checkpoint

HERE = Path(__file__).resolve().parent
PROMPT = [5, 17, 200, 33, 812, 90, 4, 61, 700, 12, 250, 9]
NEW_TOKENS = 16
LLAMACPP_SNIPPET = """
import sys, numpy as np
from llama_cpp import Llama
ids = [int(t) for t in sys.argv[2].split(",")]
llm = Llama(model_path=sys.argv[1], n_ctx=128, n_threads=2, logits_all=True, verbose=False)
llm.eval(ids)
np.save(sys.argv[3], np.asarray(llm.scores[: len(ids)], dtype=np.float32))
"""


def hf_sequence_and_logits(model_dir: Path) -> tuple[list[int], np.ndarray]:
    """transformers' greedy continuation of PROMPT and the logits at every position, float32."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        out = model.generate(torch.tensor([PROMPT]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                             do_sample=False, pad_token_id=0)
        ids = out[0].tolist()
        logits = model(torch.tensor([ids])).logits[0].float().numpy()
    return ids, logits


def llamacpp_logits(python: str, gguf: Path, ids: list[int], work: Path) -> np.ndarray:
    out = work / f"{gguf.stem}-logits.npy"
    subprocess.run([python, "-c", LLAMACPP_SNIPPET, str(gguf), ",".join(map(str, ids)), str(out)], check=True)
    return np.load(out)


def export(python: str, model_dir: Path, out: Path, permute: bool = True) -> Path:
    flags = [] if permute else ["--no-permute"]
    subprocess.run([sys.executable, str(HERE / "gguf_export.py"), str(model_dir), str(out), "--outtype", "f32", *flags],
                   check=True, capture_output=True)
    return out


def compare(name: str, hf: np.ndarray, cpp: np.ndarray) -> bool:
    """Print the comparison; True when the argmax agrees everywhere and the difference is small."""
    diff = float(np.abs(hf - cpp).max())
    scale = float(hf.max() - hf.min())
    argmax_agree = int((hf.argmax(-1) == cpp.argmax(-1)).sum())
    ok = argmax_agree == len(hf) and diff < 2e-3 * scale
    print(f"{name:28s} positions {len(hf)}, argmax agree {argmax_agree}/{len(hf)}, "
          f"max |diff| {diff:.2e} (logit range {scale:.2f}) -> {'MATCH' if ok else 'DIFFER'}")
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="check GGUF export against transformers")
    p.add_argument("--llamacpp-python", default="/tmp/llamacpp-venv/bin/python")
    args = p.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for arch in ("Qwen2ForCausalLM", "LlamaForCausalLM"):
            model_dir = build_checkpoint(work / arch, arch, "bpe", "float32", seed=0)
            ids, hf = hf_sequence_and_logits(model_dir)
            gguf = export(args.llamacpp_python, model_dir, work / f"{arch}.gguf")
            results.append(compare(arch, hf, llamacpp_logits(args.llamacpp_python, gguf, ids, work)))
            if arch == "LlamaForCausalLM":
                wrong = export(args.llamacpp_python, model_dir, work / "llama-unpermuted.gguf", permute=False)
                unpermuted = llamacpp_logits(args.llamacpp_python, wrong, ids, work)
                results.append(not compare("Llama without q/k permute", hf, unpermuted))
    print("GGUF export check:", "PASS" if all(results) else "FAIL")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
