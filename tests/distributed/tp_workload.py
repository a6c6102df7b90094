"""The workload the tensor-parallel tests compare TP 1 and TP N on: engine settings, prompts, and one
run (a raw forward's logits, then greedy generation with logprobs)."""

from __future__ import annotations

from kvserve.engine.llm import LLM
from kvserve.sampling_params import SamplingParams

COMMON = dict(max_model_len=256, block_size=16, seed=0, dtype="float32", dist_timeout=60.0)
PROMPTS = [[5, 17, 29, 41, 53, 65, 77, 89, 101, 113, 125, 137, 149, 161, 173, 185, 197, 209, 221],
           [7, 8, 9, 10, 11], [300, 200, 100, 50, 25, 12, 6, 3, 400]]


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=1)


def forward_and_generate(llm: LLM, max_tokens: int = 32):
    """(the runner's logits of two prompts' next positions, [(token ids, logprobs)] of greedy
    generation for every prompt)."""
    logits = llm.llm_engine.core.runner.forward([PROMPTS[0], PROMPTS[1]], [[1, 2], [3]])
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], greedy(max_tokens))
    return logits, [(o.outputs[0].token_ids, [lp.logprob for lp in o.outputs[0].logprobs]) for o in outputs]
