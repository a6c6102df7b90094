"""Workloads read from files: ShareGPT conversations and JSONL prompt lists.

ShareGPT format: a JSON list of ``{"conversations": [{"from": "human", "value": ...},
{"from": "gpt", "value": ...}, ...]}``; ``role``/``content`` keys are accepted too. The first turn
is the prompt and the second turn's token count the expected output length, with vLLM's filters
(both at least 4 tokens, prompt at most 1024, prompt + output at most 2048).
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

    def __init__(self, path: str, output_len: int | None = None):
        if output_len is not None and output_len < 1:
            raise InvalidRequestError(f"sharegpt_output_len must be >= 1, got {output_len}", "sharegpt_output_len")
        self.path, self.output_len = path, output_len

    @classmethod
    def from_args(cls, args: Any) -> ShareGPTDataset:
        if not args.dataset_path:
            raise InvalidRequestError("--dataset-name sharegpt needs --dataset-path FILE.json", "dataset_path")
        return cls(args.dataset_path, args.sharegpt_output_len)

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
        for i in rng.permutation(len(pairs)).tolist():
            prompt, reply = pairs[i]
            ids = encode(tokenizer, prompt)
            output_len = self.output_len or len(encode(tokenizer, reply))
            if self.output_len is None and (len(ids) < MIN_LEN or output_len < MIN_LEN):
                continue
            if len(ids) > MAX_PROMPT_LEN or len(ids) + output_len > MAX_TOTAL_LEN:
                continue
            samples.append(SampleRequest(prompt, ids, output_len))
            if num_requests is not None and len(samples) == num_requests:
                break
        return _take(samples, num_requests, f"ShareGPT file {self.path}")


@register_dataset
class JsonlDataset(BenchmarkDataset):
    """One prompt per line, in file order: a JSON string, or an object with ``prompt`` and
    optionally ``output_len`` (or ``max_tokens``); lines without a length get ``output_len``."""

    name = "jsonl"

    def __init__(self, path: str, output_len: int):
        if output_len < 1:
            raise InvalidRequestError(f"output_len must be >= 1, got {output_len}", "output_len")
        self.path, self.output_len = path, output_len

    @classmethod
    def from_args(cls, args: Any) -> JsonlDataset:
        if not args.dataset_path:
            raise InvalidRequestError("--dataset-name jsonl needs --dataset-path FILE.jsonl", "dataset_path")
        return cls(args.dataset_path, args.output_len)

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
        return _take(samples, num_requests, f"JSONL file {self.path}")
