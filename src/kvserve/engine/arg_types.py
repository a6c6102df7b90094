"""The value types of the command-line flags (argparse ``type=`` functions): sizes with ``k``/``K``
suffixes, bounded numbers, device and dtype names, and the names registries know."""

from __future__ import annotations

import argparse
import re

from kvserve.config import INT4_GROUP_SIZES
from kvserve.generation_config import MODES


_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9}


_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30}


def human_readable_int(text: str) -> int:
    """argparse type for token counts, as vLLM parses them: ``4k`` = 4,000, ``4K`` = 4,096,
    ``25.6k`` = 25,600, ``1m`` = 1,000,000, ``1M`` = 1,048,576, ``g``/``G`` likewise; decimals
    only with the lower-case (decimal) suffixes; otherwise a plain integer."""
    value = text.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgG])", value)
    if match is None:
        try:
            return int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected an integer such as 4096, 4k (4,000) or 4K (4,096), got {text!r}") from None
    number, suffix = match.groups()
    if suffix in _DECIMAL:
        return int(float(number) * _DECIMAL[suffix])
    if "." in number:
        raise argparse.ArgumentTypeError(
            f"decimals are not allowed with the binary suffix {suffix} in {text!r}; did you mean {number}{suffix.lower()}?")
    return int(number) * _BINARY[suffix]


def human_readable_positive_int(text: str) -> int:
    value = human_readable_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def byte_size(text: str) -> int:
    """``4GiB``, ``512MiB``, ``2e9``, a plain integer, or vLLM's ``4G`` (GiB) / ``4g`` (10^9)."""
    if re.fullmatch(r"\s*\d+(?:\.\d+)?[kKmMgG]\s*", text):
        return human_readable_int(text)
    units = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 10**3, "mb": 10**6, "gb": 10**9, "b": 1}
    lowered = text.strip().lower()
    for suffix, factor in units.items():
        if lowered.endswith(suffix):
            return int(float(lowered[: -len(suffix)]) * factor)
    return int(float(lowered))


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text}")
    return value


def load_format(text: str) -> str:
    """argparse type: ``--load-format`` auto, safetensors or dummy (vLLM's other formats named)."""
    if text not in ("auto", "safetensors", "dummy"):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not supported: kvserve reads safetensors weights only (convert .bin/.pt checkpoints "
            "with transformers' save_pretrained(safe_serialization=True)) or makes random ones (dummy); "
            "accepted: auto, safetensors, dummy")
    return text


def positive_float(text: str) -> float:
    """argparse type: a number > 0."""
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text}")
    return value


def fraction(text: str) -> float:
    """argparse type: a number in (0, 1]."""
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def device_name(text: str) -> str:
    if text not in ("auto", "cpu") and not text.startswith("cuda"):
        raise argparse.ArgumentTypeError(f"must be auto, cpu, cuda or cuda:N, got {text!r}")
    return text


_DTYPE_ALIASES = {"half": "float16", "float": "float32"}


def dtype_name(text: str) -> str:
    """argparse type for ``--dtype``: vLLM's names, ``half``/``float`` as aliases."""
    name = _DTYPE_ALIASES.get(text, text)
    if name not in ("auto", "float32", "bfloat16", "float16"):
        raise argparse.ArgumentTypeError(f"must be auto, float32 (float), bfloat16 or float16 (half), got {text!r}")
    return name


def int4_group_size(text: str) -> int:
    """argparse type of ``--quantization-group-size``: 32, 64 or 128."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value not in INT4_GROUP_SIZES:
        raise argparse.ArgumentTypeError(f"{text!r} is not supported; use one of {', '.join(map(str, INT4_GROUP_SIZES))}")
    return value


def generation_config_mode(text: str) -> str:
    """argparse type for ``--generation-config``: ``auto``, ``vllm`` or a folder."""
    if text in MODES:
        return text
    from pathlib import Path

    if not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"must be 'auto', 'vllm' or a folder holding generation_config.json, got {text!r}")
    return text


def lora_dtype_name(text: str) -> str:
    """argparse type of ``--lora-dtype``: ``auto`` or a dtype name (``half``/``float`` aliases)."""
    name = _DTYPE_ALIASES.get(text, text).removeprefix("torch.")
    if name not in ("auto", "float32", "bfloat16", "float16"):
        raise argparse.ArgumentTypeError(f"must be auto, float32, bfloat16 or float16, got {text!r}")
    return name


def reasoning_parser_name(text: str) -> str | None:
    """argparse type of ``--reasoning-parser``: a registered parser name (``""``: none, as vLLM)."""
    from kvserve.reasoning import get_reasoning_parser

    if not text:
        return None
    try:
        get_reasoning_parser(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text
