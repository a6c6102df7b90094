"""Quality of quantized weights: the table behind ``docs/benchmarks.md`` section 5.4, "Quantized weights".

1. Perplexity of the built-in model (float32, the one trained model we have) on the held-out Austen
   text (``tests/data/austen_heldout.txt``), through the engine's prompt scoring
   (``kvserve.testing.perplexity``): float32, int8, and int4 symmetric / with zero points at group
   sizes 32, 64 and 128 (LM head float and quantized) -- the numbers that chose int4's form --
   and one-byte KV caches (``--kv-cache-dtype int8|fp8_e4m3|fp8_e5m2``), int8 also with int8/int4
   weights.
2. Greedy agreement over 128 tokens with the float model (same prompts): the share of positions
   whose token matches, and the first position that differs, on the built-in model and on a
   random-weight checkpoint (``--random-model``, e.g. the Qwen2.5-0.5B-shaped ``/tmp/qwen-shaped``,
   bfloat16).

    python benchmarks/quant_quality.py [--random-model /tmp/qwen-shaped] [--json out.json]

No timing: it runs beside other work without disturbing a figure.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kvserve import LLM, SamplingParams
from kvserve.builtin import builtin_model_path
from kvserve.model import quant_linear
from kvserve.testing.perplexity import perplexity, token_windows

HELDOUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "austen_heldout.txt"
PROMPTS = ["It is a truth universally acknowledged", "Emma Woodhouse, handsome, clever, and rich",
           "The family of Dashwood had long been settled", "Sir Walter Elliot, of Kellynch Hall"]


def make(model: str, dtype: str, symmetric: bool = True, **quantization) -> LLM:
    """An engine; ``symmetric`` sets kvserve's int4 form for this load (a module constant read
    when the linears are quantized)."""
    quant_linear.INT4_SYMMETRIC = symmetric
    return LLM(model, dtype=dtype, max_model_len=256, num_gpu_blocks_override=512, seed=0, **quantization)


def heldout(llm: LLM) -> float:
    ids = llm.get_tokenizer().encode(HELDOUT.read_text(), add_special_tokens=False)
    return perplexity(llm, token_windows(ids, 256))


def greedy(llm: LLM, prompts: list, tokens: int) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def agreement(ours: list[list[int]], ref: list[list[int]]) -> dict:
    same = sum(a == b for o, r in zip(ours, ref) for a, b in zip(o, r))
    total = sum(len(r) for r in ref)
    first = [next((i for i, (a, b) in enumerate(zip(o, r)) if a != b), len(r)) for o, r in zip(ours, ref)]
    return {"matching_share": same / total, "first_difference": first}


def perplexity_table(model: str) -> list[dict]:
    rows = [{"weights": "float32", "ppl": heldout(make(model, "float32"))}]
    for name, kwargs in [("float32, KV int8", dict(kv_cache_dtype="int8")),
                         ("float32, KV fp8_e4m3", dict(kv_cache_dtype="fp8_e4m3")),
                         ("float32, KV fp8_e5m2", dict(kv_cache_dtype="fp8_e5m2")),
                         ("int8, KV int8", dict(quantization="int8", kv_cache_dtype="int8")),
                         ("int4-g32 symmetric, KV int8", dict(quantization="int4", kv_cache_dtype="int8"))]:
        rows.append({"weights": name, "ppl": heldout(make(model, "float32", **kwargs))})
    rows.append({"weights": "int8", "ppl": heldout(make(model, "float32", quantization="int8"))})
    rows.append({"weights": "int8+lm_head", "ppl": heldout(make(model, "float32", quantization="int8",
                                                                quantize_lm_head=True))})
    for symmetric in (True, False):
        for group in (32, 64, 128):
            for head in (False, True):
                llm = make(model, "float32", symmetric, quantization="int4", quantization_group_size=group,
                           quantize_lm_head=head)
                name = f"int4-g{group} {'symmetric' if symmetric else 'zero points'}" + ("+lm_head" if head else "")
                rows.append({"weights": name, "ppl": heldout(llm)})
    base = rows[0]["ppl"]
    for row in rows:
        row["ratio"] = row["ppl"] / base
        print(f"{row['weights']:40s} perplexity {row['ppl']:8.4f}  {row['ratio']:.4f}x float32", flush=True)
    return rows


def agreement_table(model: str, dtype: str, prompts: list, tokens: int = 128) -> list[dict]:
    ref = greedy(make(model, dtype), prompts, tokens)
    rows = []
    for name, kwargs in [("int8", dict(quantization="int8")),
                         ("int8+lm_head", dict(quantization="int8", quantize_lm_head=True)),
                         ("int4-g32", dict(quantization="int4")),
                         ("int4-g32+lm_head", dict(quantization="int4", quantize_lm_head=True))]:
        row = {"weights": name, **agreement(greedy(make(model, dtype, **kwargs), prompts, tokens), ref)}
        print(f"{model} {dtype} {name:18s} greedy agreement over {tokens} tokens: "
              f"{row['matching_share']:.3f}, first difference at {row['first_difference']}", flush=True)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--random-model", default=None, help="a random-weight checkpoint for greedy agreement")
    parser.add_argument("--json", default=None)
    parser.add_argument("--random-only", action="store_true", help="only the random model's greedy agreement")
    args = parser.parse_args(argv)
    builtin = str(builtin_model_path())
    result = {}
    if not args.random_only:
        result["perplexity"] = perplexity_table(builtin)
        quant_linear.INT4_SYMMETRIC = True
        tok = make(builtin, "float32").get_tokenizer()
        result["agreement_builtin"] = agreement_table(builtin, "float32",
                                                      [{"prompt_token_ids": tok.encode(p)} for p in PROMPTS], 128)
    if args.random_model:
        prompts = [{"prompt_token_ids": [(37 * i + 11 * j) % 5000 + 10 for j in range(16)]} for i in range(4)]
        result["agreement_random"] = agreement_table(args.random_model, "bfloat16", prompts, 128)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
