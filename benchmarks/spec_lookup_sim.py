"""What n-gram lookup can get from a model's greedy outputs: acceptance and tokens per step, exact.

    python benchmarks/spec_lookup_sim.py --model src/kvserve/builtin_model --max-model-len 256

A greedy output does not depend on the drafts (speculation is exact), so the plain engine's
outputs on the ``copy-edit`` prompts (one set per kind) decide, for any proposer, which drafts a
speculating engine would accept and how many tokens each step would give. This replays those
steps for lookup variants, without timing anything:

- ``earliest`` (vLLM's ``NgramProposer``) and ``recent`` (kvserve's ``ngram_propose``): the
  longest n-gram ``min <= n <= max`` ending the tokens, its earliest or most recent occurrence;
- ``aligned``: ``recent``, and when it finds nothing, the tokens after the place the last match
  pointed to, moved on by the tokens added since (a copy that goes on past a substituted token);
- ``bound``: the best any lookup in the request's own tokens could do, the longest span of the
  prompt and output so far that equals the next output tokens (a clairvoyant proposer).

The adaptive switch is off in the replay (every step proposes). ``est. TPOT`` is
``(steps + c * draft tokens) / output tokens`` with ``c`` (``--row-cost``) the cost of one more
verified row as a share of a plain step, from the oracle row of ``spec_decode.py`` (0.04 on the
built-in model: 1 + 4 rows cost 1.16 plain steps); it is a model, the measured TPOT is
``spec_decode.py``'s.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from kvserve import SamplingParams
from kvserve.bench.copy_dataset import KINDS, CopyEditDataset
from kvserve.engine.llm import LLM
from kvserve.spec_decode.ngram_proposer import ngram_propose


def bound(tokens: np.ndarray, upcoming: list[int]) -> list[int]:
    """The longest span of ``tokens`` equal to a prefix of ``upcoming``."""
    best: list[int] = []
    for start in range(len(tokens)):
        n = 0
        while n < len(upcoming) and start + n < len(tokens) and tokens[start + n] == upcoming[n]:
            n += 1
        if n > len(best):
            best = upcoming[:n]
    return best


def longest_match(tokens: np.ndarray, min_n: int, max_n: int, recent: bool) -> int:
    """End index of the earliest or most recent of the longest matches (brute force); -1: none."""
    length, best_n, best_end = len(tokens), 0, -1
    for end in range(length - 1):
        n = 0
        while n < max_n and end - n >= 0 and tokens[end - n] == tokens[length - 1 - n]:
            n += 1
        if n > best_n or (recent and n == best_n and n > 0):
            best_n, best_end = n, end
    return best_end if best_n >= min_n else -1


def earliest(tokens: np.ndarray, min_n: int, max_n: int, k: int) -> np.ndarray:
    """vLLM's choice: the earliest of the longest matches."""
    end = longest_match(tokens, min_n, max_n, recent=False)
    return tokens[end + 1 : end + 1 + k] if end >= 0 else tokens[:0]


def aligned(tokens: np.ndarray, k: int, min_n: int, max_n: int, state: dict) -> np.ndarray:
    """The most recent longest match; else the continuation of the previous match's alignment."""
    end, length = longest_match(tokens, min_n, max_n, recent=True), len(tokens)
    if end >= 0:
        state["offset"] = length - (end + 1)  # the token at ``length`` was copied from ``length - offset``
    source = length - state["offset"] if "offset" in state else -1
    return tokens[source : source + k] if 0 <= source < length else tokens[:0]


def replay(prompt: list[int], output: list[int], propose, k: int) -> tuple[int, int, int]:
    """(steps, draft tokens, accepted tokens) of one request speculating with ``propose``."""
    tokens, done, steps, drafted, accepted, state = list(prompt), 0, 0, 0, 0, {}
    while done < len(output):
        room = len(output) - done - 1  # the scheduler never drafts past max_tokens
        draft = list(propose(np.array(tokens), output[done : done + k], state))[: min(k, room)] if room else []
        n = 0
        while n < len(draft) and draft[n] == output[done + n]:
            n += 1
        drafted, accepted, steps = drafted + len(draft), accepted + n, steps + 1
        tokens += output[done : done + n + 1]
        done += n + 1
    return steps, drafted, accepted


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--passage-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=48)
    p.add_argument("--num-prompts", type=int, default=8, help="per kind")
    p.add_argument("--k", type=int, action="append", help="draft lengths (default 3, 4, 8)")
    p.add_argument("--lookup", default="2-4,1-4", help="min-max n-gram lengths, comma-separated")
    p.add_argument("--row-cost", type=float, default=0.04)
    args = p.parse_args(argv)
    llm = LLM(args.model, dtype="float32", max_model_len=args.max_model_len, seed=0)
    lookups = [tuple(int(x) for x in part.split("-")) for part in args.lookup.split(",")]
    totals: dict[tuple[int, str], np.ndarray] = {}  # (k, proposer) -> [steps, drafted, accepted, tokens]
    for kind in KINDS:
        samples = CopyEditDataset(args.passage_len, args.output_len, (kind,)).sample(
            llm.get_tokenizer(), args.num_prompts, np.random.default_rng(0))
        prompts = [s.prompt_token_ids for s in samples]
        outputs = [o.outputs[0].token_ids for o in llm.generate(
            prompts, SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True))]
        print(json.dumps({"kind": kind, "first_output": llm.get_tokenizer().decode(outputs[0])}), flush=True)
        for k in args.k or [3, 4, 8]:
            variants = {"bound": lambda t, up, st: bound(t, up)}
            for lo, hi in lookups:
                variants[f"earliest {lo}-{hi}"] = lambda t, up, st, lo=lo, hi=hi: earliest(t, lo, hi, k)
                variants[f"recent {lo}-{hi}"] = lambda t, up, st, lo=lo, hi=hi: ngram_propose(t, lo, hi, k)
                variants[f"aligned {lo}-{hi}"] = lambda t, up, st, lo=lo, hi=hi: aligned(t, k, lo, hi, st)
            for name, propose in variants.items():
                steps, drafted, accepted = map(sum, zip(*(replay(pr, out, propose, k)
                                                          for pr, out in zip(prompts, outputs))))
                counts = np.array([steps, drafted, accepted, sum(len(o) for o in outputs)])
                totals[(k, name)] = totals.get((k, name), 0) + counts
                report(kind, k, name, counts, args.row_cost)
    for (k, name), counts in totals.items():
        report("all", k, name, counts, args.row_cost)


def report(kind: str, k: int, name: str, counts, row_cost: float) -> None:
    steps, drafted, accepted, total = (int(c) for c in counts)
    print(json.dumps({"kind": kind, "k": k, "proposer": name, "tokens_per_step": round(total / steps, 3),
                      "acceptance": round(accepted / drafted, 3) if drafted else None, "draft_tokens": drafted,
                      "est_tpot_ratio": round((steps + row_cost * drafted) / total, 3)}), flush=True)


if __name__ == "__main__":
    main()
