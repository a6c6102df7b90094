"""Workloads read from files: ShareGPT conversations, vLLM's custom and spec_bench JSONL, and
kvserve's JSONL prompt lists.

ShareGPT format: a JSON list of ``{"conversations": [{"from": "human", "value": ...},
{"from": "gpt", "value": ...}, ...]}``; ``role``/``content`` keys are accepted too. The first turn
is the prompt and the second turn's token count the expected output length, with vLLM's filters
(prompt at least 4 tokens, the reply too unless ``--sharegpt-output-len`` fixes the length, prompt
at most 1024, prompt + output at most 2048).

As vLLM's, file datasets are shuffled by the seed (``--disable-shuffle`` keeps file order; kvserve's
jsonl is never shuffled) and repeat seeded random prompts when the file has fewer than
``--num-prompts`` (``--no-oversample`` sends what there is).
"""

from __future__ import annotations

import json
from typing import Any

from kvserve.bench.datasets import BenchmarkDataset, SampleRequest, _read_json, _take, register_dataset
from kvserve.bench.prompts import encode
from kvserve.errors import InvalidRequestError

MIN_LEN, MAX_PROMPT_LEN, MAX_TOTAL_LEN = 4, 1024, 2048


def _turn_text(turn: Any) -> str | None:
    if not isinstance(turn, dict):
        return None
    text = turn.get("value", turn.get("content"))
    return text if isinstance(text, str) else None


@register_dataset
class ShareGPTDataset(BenchmarkDataset):
    """First two turns of each conversation, shuffled by the seed.

    Args:
        path: the JSON file.
        output_len: fixed output length for every prompt instead of the reply's length.
    """

    name = "sharegpt"

    def __init__(self, path: str, output_len: int | None = None, shuffle: bool = True, oversample: bool = True):
        if output_len is not None and output_len < 1:
            raise InvalidRequestError(f"sharegpt_output_len must be >= 1, got {output_len}", "sharegpt_output_len")
        self.path, self.output_len, self.shuffle, self.oversample = path, output_len, shuffle, oversample

    @classmethod
    def from_args(cls, args: Any) -> ShareGPTDataset:
        if not args.dataset_path:
            raise InvalidRequestError("--dataset-name sharegpt needs --dataset-path FILE.json", "dataset_path")
        return cls(args.dataset_path, args.sharegpt_output_len, not args.disable_shuffle, not args.no_oversample)

    def _pairs(self) -> list[tuple[str, str]]:
        data = _read_json(self.path, json.load)
        if not isinstance(data, list):
            raise InvalidRequestError(f"{self.path}: a ShareGPT file is a JSON list of conversations", "dataset_path")
        pairs = []
        for entry in data:
            turns = entry.get("conversations", entry.get("conversation")) if isinstance(entry, dict) else None
            if not isinstance(turns, list) or len(turns) < 2:
                continue
            prompt, reply = _turn_text(turns[0]), _turn_text(turns[1])
            if prompt is not None and reply is not None:
                pairs.append((prompt, reply))
        return pairs

    def sample(self, tokenizer, num_requests, rng):
        pairs = self._pairs()
        samples = []
        order = rng.permutation(len(pairs)).tolist() if self.shuffle else range(len(pairs))
        for i in order:
            prompt, reply = pairs[i]
            ids = encode(tokenizer, prompt)
            output_len = self.output_len or len(encode(tokenizer, reply))
            if len(ids) < MIN_LEN or (self.output_len is None and output_len < MIN_LEN):
                continue
            if len(ids) > MAX_PROMPT_LEN or len(ids) + output_len > MAX_TOTAL_LEN:
                continue
            samples.append(SampleRequest(prompt, ids, output_len))
            if num_requests is not None and len(samples) == num_requests:
                break
        return _take(samples, num_requests, f"ShareGPT file {self.path}", rng, self.oversample)


@register_dataset
class JsonlDataset(BenchmarkDataset):
    """One prompt per line, in file order: a JSON string, or an object with ``prompt`` and
    optionally ``output_len`` (or ``max_tokens``); lines without a length get ``output_len``."""

    name = "jsonl"

    def __init__(self, path: str, output_len: int, oversample: bool = True):
        if output_len < 1:
            raise InvalidRequestError(f"output_len must be >= 1, got {output_len}", "output_len")
        self.path, self.output_len, self.oversample = path, output_len, oversample

    @classmethod
    def from_args(cls, args: Any) -> JsonlDataset:
        if not args.dataset_path:
            raise InvalidRequestError("--dataset-name jsonl needs --dataset-path FILE.jsonl", "dataset_path")
        return cls(args.dataset_path, args.random_output_len, not args.no_oversample)

    def _parse_line(self, lineno: int, line: str) -> tuple[str, int]:
        where = f"{self.path} line {lineno}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidRequestError(f"{where} is not JSON: {exc}", "dataset_path") from exc
        if isinstance(item, str):
            return item, self.output_len
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
            raise InvalidRequestError(f'{where}: expected a JSON string or {{"prompt": "...", "output_len": N}}',
                                      "dataset_path")
        output_len = item.get("output_len", item.get("max_tokens", self.output_len))
        if not isinstance(output_len, int) or output_len < 1:
            raise InvalidRequestError(f"{where}: output_len must be an integer >= 1, got {output_len!r}",
                                      "dataset_path")
        return item["prompt"], output_len

    def sample(self, tokenizer, num_requests, rng):
        lines = _read_json(self.path, lambda f: f.read().splitlines())
        samples = []
        for lineno, line in enumerate(lines, start=1):
            if line.strip():
                prompt, output_len = self._parse_line(lineno, line)
                samples.append(SampleRequest(prompt, encode(tokenizer, prompt), output_len))
        return _take(samples, num_requests, f"JSONL file {self.path}", rng, self.oversample)


@register_dataset
class CustomDataset(BenchmarkDataset):
    """vLLM's ``custom``: one JSON object with a ``prompt`` per line, sent in the tokenizer's chat
    template (as one user message, generation prompt added) unless ``skip_chat_template``, each
    asking for ``output_len`` tokens. Prompt lengths count the tokenizer's special tokens, as vLLM.
    ``num_requests`` <= 0 takes every line."""

    name = "custom"
    field = "prompt"

    def __init__(self, path: str, output_len: int, skip_chat_template: bool = False,
                 chat_template_kwargs: dict | None = None, shuffle: bool = True, oversample: bool = True,
                 category: str | None = None):
        if output_len < 1:
            raise InvalidRequestError(f"output length must be >= 1 (a length from the file, -1, is not "
                                      f"supported), got {output_len}", "custom_output_len")
        self.path, self.output_len, self.skip_chat_template = path, output_len, skip_chat_template
        self.chat_template_kwargs = chat_template_kwargs or {}
        self.shuffle, self.oversample, self.category = shuffle, oversample, category

    @classmethod
    def from_args(cls, args: Any) -> CustomDataset:
        if not args.dataset_path:
            raise InvalidRequestError(f"--dataset-name {cls.name} needs --dataset-path FILE.jsonl", "dataset_path")
        return cls(args.dataset_path, args.custom_output_len, args.skip_chat_template, args.chat_template_kwargs,
                   not args.disable_shuffle, not args.no_oversample)

    def _prompt(self, lineno: int, item: Any) -> str | None:
        if not isinstance(item, dict) or not isinstance(item.get(self.field), str):
            raise InvalidRequestError(f'{self.path} line {lineno}: expected a JSON object with a "{self.field}" '
                                      "string", "dataset_path")
        return item[self.field]

    def _prompts(self) -> list[str]:
        lines = _read_json(self.path, lambda f: f.read().splitlines())
        prompts = []
        for lineno, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InvalidRequestError(f"{self.path} line {lineno} is not JSON: {exc}", "dataset_path") from exc
            prompt = self._prompt(lineno, item)
            if prompt is not None:
                prompts.append(prompt)
        return prompts

    def sample(self, tokenizer, num_requests, rng):
        prompts = self._prompts()
        if self.shuffle:
            prompts = [prompts[i] for i in rng.permutation(len(prompts)).tolist()]
        if num_requests is not None and num_requests > 0:
            prompts = prompts[:num_requests]
        samples = []
        for prompt in prompts:
            if not self.skip_chat_template:
                prompt = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                       add_generation_prompt=True, **self.chat_template_kwargs)
            samples.append(SampleRequest(prompt, list(tokenizer(prompt)["input_ids"]), self.output_len))
        return _take(samples, num_requests, f"{self.name} file {self.path}", rng, self.oversample)


@register_dataset
class SpecBenchDataset(CustomDataset):
    """vLLM's ``spec_bench`` (Spec-Bench ``question.jsonl``): each line's first turn
    (``turns[0]``), only lines of ``--spec-bench-category`` when given; otherwise as ``custom``."""

    name = "spec_bench"

    @classmethod
    def from_args(cls, args: Any) -> SpecBenchDataset:
        if not args.dataset_path:
            raise InvalidRequestError("--dataset-name spec_bench needs --dataset-path question.jsonl",
                                      "dataset_path")
        return cls(args.dataset_path, args.spec_bench_output_len, args.skip_chat_template,
                   args.chat_template_kwargs, not args.disable_shuffle, not args.no_oversample,
                   args.spec_bench_category)

    def _prompt(self, lineno: int, item: Any) -> str | None:
        turns = item.get("turns") if isinstance(item, dict) else None
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
            raise InvalidRequestError(f'{self.path} line {lineno}: expected a JSON object with "turns": '
                                      '["first question", ...]', "dataset_path")
        if self.category and item.get("category") != self.category:
            return None
        return turns[0]
