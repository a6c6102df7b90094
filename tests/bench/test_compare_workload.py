"""The spec's request mix as prompts: the documented draw order repeated here with numpy gives the
same datasets, lengths, prefixes, APIs and extra bodies; every prompt has its exact token length
under the real BPE tokenizer of the bench tests."""

from __future__ import annotations

import numpy as np

from kvserve.bench.compare.spec import RequestsSpec
from kvserve.bench.compare.workload import build_requests, max_prompt_len
from kvserve.bench.prompts import encode

MIX = RequestsSpec.model_validate({
    "seed": 0,
    "datasets": [
        {"name": "prose", "weight": 3, "input_len": {"dist": "uniform", "low": 4, "high": 12},
         "output_len": {"dist": "fixed", "value": 5},
         "shared_prefix": {"share": 0.5, "prefix_len": 16, "num_prefixes": 2},
         "structured_outputs": {"share": 0.25}},
        {"name": "chat", "weight": 1, "api": "chat", "input_len": {"dist": "fixed", "value": 6},
         "output_len": {"dist": "uniform", "low": 2, "high": 9}, "tool_calls": {"share": 0.5}},
    ],
    "long_context": {"share": 0.1, "input_len": {"dist": "fixed", "value": 40}},
})
N, SEED = 60, 11


def expected_plan():
    """The module docstring's draw order, with numpy alone."""
    rng = np.random.default_rng(SEED)
    which = rng.choice(2, size=N, p=np.array([3.0, 1.0]) / 4.0)
    is_long = rng.random(N) < 0.1
    shared = rng.random(N) < np.array([0.5, 0.0])[which]
    picks = rng.integers(0, np.iinfo(np.int64).max, size=N)
    structured = rng.random(N) < np.array([0.25, 0.0])[which]
    tools = rng.random(N) < np.array([0.0, 0.5])[which]
    inputs, outputs = np.zeros(N, dtype=int), np.zeros(N, dtype=int)
    rows = np.flatnonzero(which == 0)
    inputs[rows] = rng.integers(4, 13, size=len(rows))
    outputs[rows] = 5
    rows = np.flatnonzero(which == 1)
    inputs[rows] = 6
    outputs[rows] = rng.integers(2, 10, size=len(rows))
    inputs[is_long] = 40
    return which, is_long, shared & ~is_long, picks % 2, structured, tools, inputs, outputs


def test_mix_follows_the_documented_draws(tokenizer):
    samples = build_requests(MIX, tokenizer, N, SEED)
    which, is_long, shared, prefix, structured, tools, inputs, outputs = expected_plan()
    assert [s.api for s in samples] == [("completions", "chat")[k] for k in which]
    assert [s.expected_output_len for s in samples] == outputs.tolist()
    assert [s.prompt_len for s in samples] == (inputs + 16 * shared).tolist()
    for s, long_, sh, st, tl in zip(samples, is_long, shared, structured, tools):
        assert encode(tokenizer, s.prompt) == s.prompt_token_ids  # exact lengths under the tokenizer
        body = s.extra_body or {}
        assert ("response_format" in body) == bool(st)
        assert (body.get("tool_choice") == "required") == bool(tl)
        if st:
            assert body["response_format"]["json_schema"]["schema"]["required"] == ["name", "count"]
    # the prompts that share prefix k start with the same 16 token ids; the two prefixes differ
    heads = {k: {tuple(s.prompt_token_ids[:16]) for s, sh, p in zip(samples, shared, prefix) if sh and p == k}
             for k in (0, 1)}
    assert len(heads[0]) == len(heads[1]) == 1 and heads[0] != heads[1]
    assert sum(shared) > 0 and sum(is_long) > 0 and sum(structured) > 0 and sum(tools) > 0


def test_same_seed_same_prompts_other_seed_other_prompts(tokenizer):
    a, b = build_requests(MIX, tokenizer, 8, 1), build_requests(MIX, tokenizer, 8, 1)
    assert a == b
    assert [s.prompt for s in build_requests(MIX, tokenizer, 8, 2)] != [s.prompt for s in a]


def test_longest_prompt_of_the_mix():
    assert max_prompt_len(MIX) == 40.0  # the long-context share beats 16 + 12
    assert max_prompt_len(MIX.model_copy(update={"long_context": None})) == 28.0
