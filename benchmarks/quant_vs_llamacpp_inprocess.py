"""kvserve's int8 / int4 weights against llama.cpp's Q8_0 / Q4_0 in process, without HTTP: time per
output token at batch 1, measured the same way for both engines in one run.

Each engine generates ``--output-len`` greedy tokens (end-of-text banned, so every run is full
length) after a ``--input-len``-token prompt of random token ids, and the same prompt again with
one output token; TPOT = (t(full) - t(one)) / (output_len - 1), the fastest of ``--repeats``.
kvserve runs its offline ``LLM`` in this process (one per format: bf16, ``--quantization int8``,
``int4``, each with and without the LM head); llama.cpp runs ``llama_cpp.Llama`` in the Python of
``--llamacpp-python`` on the bf16 GGUF export of the same checkpoint and on llama.cpp's own Q8_0 and
Q4_0 quantizations of it (``baseline_llamacpp.py`` makes them)::

    python benchmarks/quant_vs_llamacpp_inprocess.py --model /tmp/qwen-shaped \\
        --llamacpp-python /tmp/llamacpp-venv-noamx/bin/python

(``quant_vs_llamacpp.py`` compares the two servers, HTTP and serving loop included.)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from baseline_llamacpp import ensure_gguf, ensure_quantized  # noqa: E402

KVSERVE_FORMATS = {
    "kvserve bf16": {},
    "kvserve int8": {"quantization": "int8"},
    "kvserve int8+lm_head": {"quantization": "int8", "quantize_lm_head": True},
    "kvserve int4": {"quantization": "int4"},
    "kvserve int4+lm_head": {"quantization": "int4", "quantize_lm_head": True},
}

LLAMA_SCRIPT = """
import json, sys, time, llama_cpp
path, prompt, output_len, repeats, banned = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), json.loads(sys.argv[5])
llm = llama_cpp.Llama(path, n_ctx=2048, n_threads=2, n_threads_batch=2, verbose=False)
bias = {int(t): -100.0 for t in banned}
def timed(n):
    start = time.perf_counter()
    out = llm.create_completion(prompt, max_tokens=n, temperature=0.0, logit_bias=bias)
    assert out["usage"]["completion_tokens"] == n, out["usage"]
    return time.perf_counter() - start
timed(output_len)
print(json.dumps({"full": min(timed(output_len) for _ in range(repeats)), "one": min(timed(1) for _ in range(repeats))}))
"""


def kvserve_times(model: str, options: dict, prompt: list[int], output_len: int, repeats: int) -> dict:
    from kvserve import LLM, SamplingParams  # noqa: PLC0415

    llm = LLM(model=model, **options)

    def timed(n: int) -> float:
        start = time.perf_counter()
        out = llm.generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
        assert len(out[0].outputs[0].token_ids) == n
        return time.perf_counter() - start

    timed(output_len)
    times = {"full": min(timed(output_len) for _ in range(repeats)), "one": min(timed(1) for _ in range(repeats))}
    llm.shutdown()
    return times


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="/tmp/qwen-shaped")
    p.add_argument("--llamacpp-python", default="/tmp/llamacpp-venv/bin/python")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    from transformers import AutoTokenizer  # noqa: PLC0415

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    banned = sorted({t for t in (tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")) if t is not None})
    import random  # noqa: PLC0415

    rng = random.Random(0)
    prompt = [rng.randrange(1000, 100000) for _ in range(args.input_len)]
    source = ensure_gguf(args.llamacpp_python, args.model, Path(args.model) / "model-bf16.gguf", "bf16")
    lines = []

    def report(name: str, t: dict) -> None:
        tpot = (t["full"] - t["one"]) / (args.output_len - 1) * 1e3
        lines.append(f"{name:24s} TPOT {tpot:7.2f} ms   first token {t['one'] * 1e3:7.1f} ms")
        print(lines[-1], flush=True)

    for name, options in KVSERVE_FORMATS.items():
        report(name, kvserve_times(args.model, options, prompt, args.output_len, args.repeats))
    for quantize in (None, "Q8_0", "Q4_0"):
        gguf = source if quantize is None else ensure_quantized(args.llamacpp_python, source, quantize)
        out = subprocess.run([args.llamacpp_python, "-c", LLAMA_SCRIPT, str(gguf), json.dumps(prompt),
                              str(args.output_len), str(args.repeats), json.dumps(banned)],
                             check=True, capture_output=True, text=True).stdout
        report(f"llama.cpp {quantize or 'bf16'}", json.loads(out.strip().splitlines()[-1]))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
