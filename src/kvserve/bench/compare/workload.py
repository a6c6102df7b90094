"""The spec's request mix as prompts: :class:`kvserve.bench.datasets.SampleRequest` lists.

For ``n`` requests and one seed, the random choices are drawn from one
``numpy.random.default_rng(seed)`` in this order (the tests repeat it)::

    1. dataset of each request      rng.choice(len(datasets), size=n, p=weights / sum(weights))
    2. long-context flags           rng.random(n) < long_context.share          (all False without one)
    3. shared-prefix flags          rng.random(n) < dataset's shared_prefix.share
    4. prefix picks                 rng.integers(0, 2**63 - 1, size=n); request i uses pick % num_prefixes
    5. structured-output flags      rng.random(n) < dataset's structured_outputs.share
    6. tool-call flags              rng.random(n) < dataset's tool_calls.share
    7. per dataset in spec order: input lengths, then output lengths of its requests (in request order)
    8. long-context input lengths of the flagged requests (in request order)
    9. the text: each dataset's prefixes (``num_prefixes`` x ``prefix_len`` tokens), then each
       request's prompt, by :class:`kvserve.bench.prompts.ExactLengthPrompter`

A shared-prefix prompt is the prefix followed by its drawn input length of tokens; a long-context
prompt replaces the dataset's prompt (no prefix). A request with structured outputs carries
``response_format: {type: json_schema, ...}``; one with tool calls carries ``tools`` and
``tool_choice: required``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvserve.bench.compare.spec import DatasetSpec, RequestsSpec
from kvserve.bench.datasets import SampleRequest
from kvserve.bench.prompts import ExactLengthPrompter


def _flags(rng: np.random.Generator, shares: np.ndarray) -> np.ndarray:
    return rng.random(len(shares)) < shares


def _share(datasets: list[DatasetSpec], which: np.ndarray, attr: str) -> np.ndarray:
    values = [getattr(d, attr).share if getattr(d, attr) is not None else 0.0 for d in datasets]
    return np.asarray(values, dtype=np.float64)[which]


def _extra_body(dataset: DatasetSpec, structured: bool, tools: bool) -> dict[str, Any] | None:
    body: dict[str, Any] = {}
    if structured and dataset.structured_outputs is not None:
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "bench", "schema": dataset.structured_outputs.json_schema}}
    if tools and dataset.tool_calls is not None:
        body.update(tools=dataset.tool_calls.tools, tool_choice="required")
    return body or None


def build_requests(spec: RequestsSpec, tokenizer: Any, n: int, seed: int) -> list[SampleRequest]:
    """``n`` requests of the mix, seeded by ``seed`` (see the module docstring for the draw order).

    Raises:
        InvalidRequestError: a prompt of the drawn length cannot be built with this tokenizer.
    """
    rng = np.random.default_rng(seed)
    datasets = spec.datasets
    weights = np.asarray([d.weight for d in datasets], dtype=np.float64)
    which = rng.choice(len(datasets), size=n, p=weights / weights.sum())
    long_share = spec.long_context.share if spec.long_context is not None else 0.0
    is_long = rng.random(n) < long_share
    shared = _flags(rng, _share(datasets, which, "shared_prefix"))
    prefix_index = rng.integers(0, np.iinfo(np.int64).max, size=n)
    structured = _flags(rng, _share(datasets, which, "structured_outputs"))
    tools = _flags(rng, _share(datasets, which, "tool_calls"))
    input_lens, output_lens = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    for k, dataset in enumerate(datasets):
        rows = np.flatnonzero(which == k)
        input_lens[rows] = dataset.input_len.sample(rng, len(rows))
        output_lens[rows] = dataset.output_len.sample(rng, len(rows))
    long_rows = np.flatnonzero(is_long)
    if len(long_rows):
        input_lens[long_rows] = spec.long_context.input_len.sample(rng, len(long_rows))
    prompter = ExactLengthPrompter(tokenizer, rng)
    prefixes = [[prompter.text(d.shared_prefix.prefix_len) for _ in range(d.shared_prefix.num_prefixes)]
                if d.shared_prefix is not None else [] for d in datasets]
    samples = []
    for i in range(n):
        dataset = datasets[which[i]]
        prefix, prefix_ids = "", []
        if shared[i] and not is_long[i]:
            prefix, prefix_ids = prefixes[which[i]][prefix_index[i] % len(prefixes[which[i]])]
        text, ids = prompter.text(int(input_lens[i]), prefix=prefix)
        samples.append(SampleRequest(prefix + text, prefix_ids + ids, int(output_lens[i]), api=dataset.api,
                                     extra_body=_extra_body(dataset, structured[i], tools[i])))
    return samples


def max_prompt_len(spec: RequestsSpec) -> float:
    """The longest prompt the mix can send (tokens; ``inf`` when a distribution is unbounded)."""
    longest = max(d.input_len.upper_bound() + (d.shared_prefix.prefix_len if d.shared_prefix else 0)
                  for d in spec.datasets)
    if spec.long_context is not None and spec.long_context.share > 0:
        longest = max(longest, spec.long_context.input_len.upper_bound())
    return longest
