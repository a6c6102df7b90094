"""Benchmark workloads: a small registry of prompt generators.

=================  =======================================================================
name               prompts
=================  =======================================================================
random             (vLLM's) a fixed random prefix of ``prefix_len`` tokens + random tokens
                   of ``input_len`` (± ``range_ratio``) tokens, exact length
prefix_repetition  (vLLM's) ``num_prefixes`` prefixes x ``num_prompts // num_prefixes``
                   suffixes: the shared-prefix generator with vLLM's parameters
shared-prefix      G groups x P prompts: a group's system prompt of S tokens + a question of Q
copy-edit          prompts asking to repeat or lightly edit a passage (``copy_dataset``): the
                   copy-heavy work n-gram speculative decoding speeds up
sharegpt           (vLLM's) first human turn of each ShareGPT conversation; output length
                   from the reply
custom, spec_bench (vLLM's) JSONL prompts (``prompt`` / ``turns[0]``) in the chat template
jsonl              one prompt per line: ``{"prompt": ..., "output_len": N}`` or a JSON string
=================  =======================================================================

Every dataset is seeded by the ``numpy.random.Generator`` it is given, and counts prompt tokens
with the target model's tokenizer (without special tokens, except where vLLM counts them:
custom and spec_bench). Lengths and flags follow vLLM's ``vllm/benchmarks/datasets``.
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from kvserve.bench.prompts import ExactLengthPrompter
from kvserve.errors import InvalidRequestError


@dataclass(frozen=True)
class SampleRequest:
    """One prompt of a workload. Lengths in tokens; ``prompt_token_ids`` are its ids.

    ``api`` (``completions`` or ``chat``) sends this request in that shape, to that endpoint,
    whatever the run's ``--endpoint``; ``extra_body`` joins its payload after the run's (a mixed
    workload of ``bench compare``: chat and completions, structured outputs, tools). None: the
    run's settings."""

    prompt: str
    prompt_token_ids: list[int]
    expected_output_len: int
    api: str | None = None
    extra_body: dict[str, Any] | None = None

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


class BenchmarkDataset(ABC):
    """A workload. Subclasses set ``name``, are built by ``from_args`` from parsed CLI flags, and
    are registered with :func:`register_dataset`."""

    name: ClassVar[str]

    @classmethod
    @abstractmethod
    def from_args(cls, args: Any) -> BenchmarkDataset:
        """Build from an ``argparse.Namespace`` (flags defined in ``kvserve.bench.cli``)."""

    @abstractmethod
    def sample(self, tokenizer: Any, num_requests: int | None, rng: np.random.Generator) -> list[SampleRequest]:
        """``num_requests`` prompts (``None`` = the dataset's natural size).

        Raises:
            InvalidRequestError: bad parameters, or fewer usable prompts than asked for.
        """


DATASETS: dict[str, type[BenchmarkDataset]] = {}


def register_dataset(cls: type[BenchmarkDataset]) -> type[BenchmarkDataset]:
    """Class decorator adding a dataset to :data:`DATASETS` under ``cls.name``."""
    DATASETS[cls.name] = cls
    return cls


def get_dataset(args: Any) -> BenchmarkDataset:
    """The dataset named by ``args.dataset_name``, built from ``args``.

    Raises:
        InvalidRequestError: unknown name (the message lists the registered ones).
    """
    cls = DATASETS.get(args.dataset_name)
    if cls is None:
        raise InvalidRequestError(
            f"unknown dataset {args.dataset_name!r}; choose one of {', '.join(sorted(DATASETS))}", "dataset_name"
        )
    return cls.from_args(args)


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise InvalidRequestError(f"{name} must be >= 1, got {value}", name)


def parse_range_ratio(value: Any) -> tuple[float, float]:
    """``--random-range-ratio``: a number for both lengths, or vLLM's ``{"input": r, "output": r}``
    (a missing key is 0), as ``(input ratio, output ratio)``.

    Raises:
        InvalidRequestError: not a number or such an object, or a ratio outside [0, 1).
    """
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                value = None
    if isinstance(value, (int, float)):
        ratios = (float(value), float(value))
    elif isinstance(value, dict) and set(value) <= {"input", "output"}:
        ratios = (float(value.get("input", 0.0)), float(value.get("output", 0.0)))
    else:
        raise InvalidRequestError(f'random_range_ratio must be a number or {{"input": r, "output": r}}, '
                                  f"got {value!r}", "random_range_ratio")
    if not all(0.0 <= r < 1.0 for r in ratios):
        raise InvalidRequestError(f"random_range_ratio must be in [0, 1), got {value}", "random_range_ratio")
    return ratios


@register_dataset
class RandomDataset(BenchmarkDataset):
    """Random tokens, as vLLM's: lengths drawn uniformly from
    ``[floor(len * (1 - ratio)), ceil(len * (1 + ratio))]`` (outputs at least 1), where the input
    ``len`` is ``input_len`` less the special tokens the tokenizer adds (so that a server adding
    them sees ``input_len``); every prompt starts with the same random prefix of ``prefix_len``
    tokens."""

    name = "random"
    DEFAULT_NUM_REQUESTS = 1000

    def __init__(self, input_len: int, output_len: int, range_ratio: Any = 0.0, prefix_len: int = 0):
        _check_positive(input_len=input_len, output_len=output_len)
        if prefix_len < 0:
            raise InvalidRequestError(f"random_prefix_len must be >= 0, got {prefix_len}", "random_prefix_len")
        self.input_len, self.output_len, self.prefix_len = input_len, output_len, prefix_len
        self.input_ratio, self.output_ratio = parse_range_ratio(range_ratio)

    @classmethod
    def from_args(cls, args: Any) -> RandomDataset:
        return cls(args.random_input_len, args.random_output_len, args.random_range_ratio, args.random_prefix_len)

    def _bounds(self, tokenizer: Any) -> tuple[tuple[int, int], tuple[int, int]]:
        real_input = max(0, self.input_len - int(tokenizer.num_special_tokens_to_add()))
        inputs = (math.floor(real_input * (1 - self.input_ratio)), math.ceil(real_input * (1 + self.input_ratio)))
        outputs = (max(1, math.floor(self.output_len * (1 - self.output_ratio))),
                   max(1, math.ceil(self.output_len * (1 + self.output_ratio))))
        if self.prefix_len + inputs[0] < 1:
            raise InvalidRequestError(
                f"random prompts could have {self.prefix_len + inputs[0]} tokens: raise --random-input-len or "
                "--random-prefix-len, or lower --random-range-ratio", "random_input_len")
        return inputs, outputs

    def sample(self, tokenizer, num_requests, rng):
        n = self.DEFAULT_NUM_REQUESTS if num_requests is None else num_requests
        (in_low, in_high), (out_low, out_high) = self._bounds(tokenizer)
        inputs = rng.integers(in_low, in_high + 1, size=n).tolist()
        outputs = rng.integers(out_low, out_high + 1, size=n).tolist()
        prompter = ExactLengthPrompter(tokenizer, rng)
        prefix, prefix_ids = prompter.text(self.prefix_len)
        samples = []
        for input_len, output_len in zip(inputs, outputs):
            text, ids = prompter.text(input_len, prefix=prefix)
            samples.append(SampleRequest(prefix + text, prefix_ids + ids, output_len))
        return samples


@register_dataset
class SharedPrefixDataset(BenchmarkDataset):
    """``num_groups`` system prompts of ``system_prompt_len`` tokens, each followed by
    ``prompts_per_group`` different questions of ``question_len`` tokens. The token ids of a
    group's prompts all start with the same ``system_prompt_len`` ids (what prefix caching
    reuses). Natural size G·P, in a seeded shuffled order; more requests repeat the set."""

    name = "shared-prefix"

    def __init__(self, num_groups: int, prompts_per_group: int, system_prompt_len: int, question_len: int,
                 output_len: int, shuffle: bool = True):
        _check_positive(num_groups=num_groups, prompts_per_group=prompts_per_group,
                        system_prompt_len=system_prompt_len, question_len=question_len, output_len=output_len)
        self.num_groups, self.prompts_per_group = num_groups, prompts_per_group
        self.system_prompt_len, self.question_len, self.output_len = system_prompt_len, question_len, output_len
        self.shuffle = shuffle

    @classmethod
    def from_args(cls, args: Any) -> SharedPrefixDataset:
        return cls(args.num_groups, args.prompts_per_group, args.system_prompt_len, args.question_len,
                   args.random_output_len)

    def sample(self, tokenizer, num_requests, rng):
        prompter = ExactLengthPrompter(tokenizer, rng)
        samples = []
        for _ in range(self.num_groups):
            system, system_ids = prompter.text(self.system_prompt_len)
            for _ in range(self.prompts_per_group):
                question, question_ids = prompter.text(self.question_len, prefix=system)
                samples.append(SampleRequest(system + question, system_ids + question_ids, self.output_len))
        if self.shuffle:
            samples = [samples[i] for i in rng.permutation(len(samples)).tolist()]
        n = len(samples) if num_requests is None else num_requests
        return [samples[i % len(samples)] for i in range(n)]


@register_dataset
class PrefixRepetitionDataset(BenchmarkDataset):
    """vLLM's ``prefix_repetition``: ``num_prefixes`` random prefixes of ``prefix_len`` tokens,
    each followed by ``num_requests // num_prefixes`` random suffixes of ``suffix_len`` tokens, in
    a seeded shuffled order (so ``num_requests`` rounds down to a multiple of ``num_prefixes``)."""

    name = "prefix_repetition"

    def __init__(self, prefix_len: int, suffix_len: int, num_prefixes: int, output_len: int, shuffle: bool = True):
        _check_positive(prefix_repetition_prefix_len=prefix_len, prefix_repetition_suffix_len=suffix_len,
                        prefix_repetition_num_prefixes=num_prefixes, prefix_repetition_output_len=output_len)
        self.prefix_len, self.suffix_len, self.num_prefixes = prefix_len, suffix_len, num_prefixes
        self.output_len, self.shuffle = output_len, shuffle

    @classmethod
    def from_args(cls, args: Any) -> PrefixRepetitionDataset:
        return cls(args.prefix_repetition_prefix_len, args.prefix_repetition_suffix_len,
                   args.prefix_repetition_num_prefixes, args.prefix_repetition_output_len,
                   not args.disable_shuffle)

    def sample(self, tokenizer, num_requests, rng):
        n = RandomDataset.DEFAULT_NUM_REQUESTS if num_requests is None else num_requests
        per_prefix = n // self.num_prefixes
        if per_prefix == 0:
            raise InvalidRequestError(f"--num-prompts ({n}) must be >= --prefix-repetition-num-prefixes "
                                      f"({self.num_prefixes})", "num_prompts")
        groups = SharedPrefixDataset(self.num_prefixes, per_prefix, self.prefix_len, self.suffix_len,
                                     self.output_len, self.shuffle)
        return groups.sample(tokenizer, None, rng)


def _take(samples: list[SampleRequest], num_requests: int | None, source: str, rng: np.random.Generator,
          oversample: bool = True) -> list[SampleRequest]:
    """The first ``num_requests`` samples (all for None or <= 0); when there are fewer, repeat
    seeded random ones to fill up (vLLM's oversampling) unless ``oversample`` is off.

    Raises:
        InvalidRequestError: the file has no usable prompt.
    """
    if not samples:
        raise InvalidRequestError(f"{source} has no usable prompts", "dataset_path")
    if num_requests is None or num_requests <= 0:
        return samples
    if len(samples) >= num_requests or not oversample:
        return samples[:num_requests]
    extra = rng.integers(0, len(samples), size=num_requests - len(samples)).tolist()
    return samples + [samples[i] for i in extra]


def _read_json(path: str, loader: Callable[[Any], Any]) -> Any:
    try:
        with Path(path).open(encoding="utf-8") as f:
            return loader(f)
    except (OSError, ValueError) as exc:
        raise InvalidRequestError(f"cannot read dataset file {path!r}: {exc}", "dataset_path") from exc


# Datasets read from files and the copy-edit workload live in their own modules; importing them
# registers them.
from kvserve.bench import copy_dataset, file_datasets  # noqa: E402,F401
