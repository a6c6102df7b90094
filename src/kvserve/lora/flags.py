"""``--lora-modules``: vLLM's two spellings, ``name=path`` and a JSON object
``{"name": ..., "path": ..., "base_model_name": ...}``."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

RUNTIME_UPDATING_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


@dataclass(frozen=True)
class LoRAModulePath:
    """One adapter to serve from start-up (vLLM's ``LoRAModulePath``)."""

    name: str
    path: str
    base_model_name: str | None = None


def lora_module(text: str) -> LoRAModulePath:
    """argparse type of one ``--lora-modules`` value.

    Raises:
        argparse.ArgumentTypeError: neither ``name=path`` nor a JSON object with ``name`` and
            ``path`` (and optionally ``base_model_name``).
    """
    text = text.strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise argparse.ArgumentTypeError(f"invalid JSON {text!r}: {exc}") from None
        unknown = sorted(set(data) - {"name", "path", "base_model_name"})
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown key {unknown[0]!r} in {text!r}; keys: name, path, "
                                             "base_model_name")
        name, path = data.get("name"), data.get("path")
        base = data.get("base_model_name")
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            raise argparse.ArgumentTypeError(f"{text!r} needs non-empty \"name\" and \"path\" strings")
        if base is not None and not isinstance(base, str):
            raise argparse.ArgumentTypeError(f"base_model_name must be a string in {text!r}")
        return LoRAModulePath(name, path, base)
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected name=path or a JSON object, got {text!r}")
    return LoRAModulePath(name, path)


def env_allows_runtime_updating(value: str | None) -> bool:
    """vLLM's ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``: true for ``1``/``true`` (any case)."""
    return (value or "").strip().lower() in ("1", "true")
