"""Benchmark workloads: a small registry of prompt generators.

==============  ==========================================================================
name            prompts
==============  ==========================================================================
random          random token ids of ``input_len`` (± ``range_ratio``) tokens, exact length
shared-prefix   G groups x P prompts: a group's system prompt of S tokens + a question of Q
sharegpt        first human turn of each ShareGPT conversation; output length from the reply
jsonl           one prompt per line: ``{"prompt": ..., "output_len": N}`` or a JSON string
==============  ==========================================================================

Every dataset is seeded by the ``numpy.random.Generator`` it is given, and counts prompt tokens
with the target model's tokenizer (without special tokens).
"""

from __future__ import annotations

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
    """One prompt of a workload. Lengths in tokens; ``prompt_token_ids`` are its ids."""

    prompt: str
    prompt_token_ids: list[int]
    expected_output_len: int

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


@register_dataset
class RandomDataset(BenchmarkDataset):
    """Random token ids. Lengths are drawn uniformly from
    ``[round(len * (1 - range_ratio)), round(len * (1 + range_ratio))]``."""

    name = "random"
    DEFAULT_NUM_REQUESTS = 1000

    def __init__(self, input_len: int, output_len: int, range_ratio: float = 0.0):
        _check_positive(input_len=input_len, output_len=output_len)
        if not 0.0 <= range_ratio < 1.0:
            raise InvalidRequestError(f"random_range_ratio must be in [0, 1), got {range_ratio}", "random_range_ratio")
        self.input_len, self.output_len, self.range_ratio = input_len, output_len, range_ratio

    @classmethod
    def from_args(cls, args: Any) -> RandomDataset:
        return cls(args.input_len, args.output_len, args.random_range_ratio)

    def _lengths(self, base: int, n: int, rng: np.random.Generator) -> list[int]:
        low = max(1, round(base * (1 - self.range_ratio)))
        high = max(low, round(base * (1 + self.range_ratio)))
        return rng.integers(low, high + 1, size=n).tolist()

    def sample(self, tokenizer, num_requests, rng):
        n = self.DEFAULT_NUM_REQUESTS if num_requests is None else num_requests
        prompter = ExactLengthPrompter(tokenizer, rng)
        inputs, outputs = self._lengths(self.input_len, n, rng), self._lengths(self.output_len, n, rng)
        samples = []
        for input_len, output_len in zip(inputs, outputs):
            text, ids = prompter.text(input_len)
            samples.append(SampleRequest(text, ids, output_len))
        return samples


@register_dataset
class SharedPrefixDataset(BenchmarkDataset):
    """``num_groups`` system prompts of ``system_prompt_len`` tokens, each followed by
    ``prompts_per_group`` different questions of ``question_len`` tokens. The token ids of a
    group's prompts all start with the same ``system_prompt_len`` ids (what prefix caching
    reuses). Natural size G·P, in a seeded shuffled order; more requests repeat the set."""

    name = "shared-prefix"

    def __init__(self, num_groups: int, prompts_per_group: int, system_prompt_len: int, question_len: int,
                 output_len: int):
        _check_positive(num_groups=num_groups, prompts_per_group=prompts_per_group,
                        system_prompt_len=system_prompt_len, question_len=question_len, output_len=output_len)
        self.num_groups, self.prompts_per_group = num_groups, prompts_per_group
        self.system_prompt_len, self.question_len, self.output_len = system_prompt_len, question_len, output_len

    @classmethod
    def from_args(cls, args: Any) -> SharedPrefixDataset:
        return cls(args.num_groups, args.prompts_per_group, args.system_prompt_len, args.question_len,
                   args.output_len)

    def sample(self, tokenizer, num_requests, rng):
        prompter = ExactLengthPrompter(tokenizer, rng)
        samples = []
        for _ in range(self.num_groups):
            system, system_ids = prompter.text(self.system_prompt_len)
            for _ in range(self.prompts_per_group):
                question, question_ids = prompter.text(self.question_len, prefix=system)
                samples.append(SampleRequest(system + question, system_ids + question_ids, self.output_len))
        order = rng.permutation(len(samples)).tolist()
        samples = [samples[i] for i in order]
        n = len(samples) if num_requests is None else num_requests
        return [samples[i % len(samples)] for i in range(n)]


def _take(samples: list[SampleRequest], num_requests: int | None, source: str) -> list[SampleRequest]:
    if num_requests is None:
        return samples
    if len(samples) < num_requests:
        raise InvalidRequestError(
            f"{source} has {len(samples)} usable prompts but {num_requests} were asked for; "
            "lower --num-prompts or omit it to use them all",
            "num_prompts",
        )
    return samples[:num_requests]


def _read_json(path: str, loader: Callable[[Any], Any]) -> Any:
    try:
        with Path(path).open(encoding="utf-8") as f:
            return loader(f)
    except (OSError, ValueError) as exc:
        raise InvalidRequestError(f"cannot read dataset file {path!r}: {exc}", "dataset_path") from exc


# Datasets read from files live in their own module; importing it registers them.
from kvserve.bench import file_datasets  # noqa: E402,F401
