"""``--hf-overrides`` (vLLM's flag): config.json fields replaced when the folder is read, e.g. to
serve the original Qwen3-Reranker as a classifier (docs/pooling.md)::

    kvserve serve Qwen3-Reranker-0.6B --runner pooling --hf-overrides \\
        '{"architectures": ["Qwen3ForSequenceClassification"], "classifier_from_token": ["no", "yes"],
          "is_original_qwen3_reranker": true}'

A top-level value replaces the file's; a JSON object merges into the file's object of that name
(vLLM's rule for nested configs). Every reader of config.json on the engine's path reads it
through :func:`read_config_json` (the start-up checks, the architecture, the pooling, the loader).

Source: vLLM 0.32 ``vllm/config/model.py`` (``hf_overrides``: ``config.update`` for flat values,
nested dictionaries merged into sub-configs).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvserve.errors import CheckpointError


def parse_hf_overrides(value: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """``--hf-overrides`` JSON text (or an ``LLM(hf_overrides={...})`` dict) -> a dict.

    Raises:
        ValueError: not JSON, not a JSON object, ``architectures`` that is not a list of names, or
            ``num_labels`` that is not a positive integer.
    """
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--hf-overrides must be a JSON object, e.g. '{{\"architectures\": [...]}}': "
                             f"{exc}") from None
    if not isinstance(value, Mapping):
        raise ValueError(f"--hf-overrides must be a JSON object of config.json fields, got {type(value).__name__}")
    architectures = value.get("architectures")
    if architectures is not None and (not isinstance(architectures, list) or not architectures
                                      or not all(isinstance(a, str) for a in architectures)):
        raise ValueError(f"--hf-overrides: architectures must be a non-empty list of architecture names, e.g. "
                         f"[\"Qwen3ForSequenceClassification\"], got {json.dumps(architectures)}")
    num_labels = value.get("num_labels")
    if num_labels is not None and (isinstance(num_labels, bool) or not isinstance(num_labels, int) or num_labels < 1):
        raise ValueError(f"--hf-overrides: num_labels must be a positive integer, got {json.dumps(num_labels)}")
    return dict(value)


def apply_hf_overrides(raw: dict[str, Any], overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """A copy of config.json's ``raw`` with ``overrides`` laid over it (module docstring); a
    ``num_labels`` override of another count rebuilds ``id2label`` as transformers' setter does."""
    merged = dict(raw)
    for key, value in (overrides or {}).items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    overrides = overrides or {}
    num_labels = overrides.get("num_labels")
    if isinstance(num_labels, int) and "id2label" not in overrides and len(merged.get("id2label") or {}) != num_labels:
        # transformers' num_labels setter (vLLM's config.update): a new count rebuilds the labels
        merged["id2label"] = {str(i): f"LABEL_{i}" for i in range(num_labels)}
    return merged


def read_config_json(model_dir: str | Path, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``model_dir/config.json`` with ``overrides`` applied.

    Raises:
        CheckpointError: the file is missing or is not a JSON object.
    """
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"config.json not found: {path} (a model folder needs config.json)")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    return apply_hf_overrides(raw, overrides)
