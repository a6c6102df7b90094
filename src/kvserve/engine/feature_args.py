"""The flags of the optional features, in their vLLM groups: LoRA serving (``LoRAConfig``) and
structured outputs with the reasoning parser (``StructuredOutputsConfig``), and their configs."""

from __future__ import annotations

import argparse
import dataclasses
import json

from kvserve.config import LoRAConfig
from kvserve.engine.arg_types import lora_dtype_name, positive_int, reasoning_parser_name
from kvserve.errors import ConfigError
from kvserve.structured_output.config import StructuredOutputsConfig


def add_lora_args(group) -> None:
    group.add_argument("--enable-lora", action=argparse.BooleanOptionalAction, default=False,
                       help="serve LoRA adapters over the base model (requests name one as `model`; "
                            "docs/lora.md)")
    group.add_argument("--max-loras", type=positive_int, default=1,
                       help="most distinct adapters in one batch (default 1, as vLLM)")
    group.add_argument("--max-lora-rank", type=positive_int, default=16,
                       help="largest adapter rank accepted (default 16); every adapter slot is this wide")
    group.add_argument("--max-cpu-loras", type=positive_int, default=None,
                       help="adapters kept loaded in CPU memory, least recently used dropped beyond it "
                            "(default: --max-loras)")
    group.add_argument("--lora-dtype", type=lora_dtype_name, default="auto",
                       help="dtype of adapter weights: auto (the model's), float32, bfloat16, float16")


def lora_config_from_args(args: argparse.Namespace) -> LoRAConfig | None:
    """``--enable-lora`` and its flags (None without ``--enable-lora``).

    Raises:
        ConfigError: inconsistent values (``--max-cpu-loras`` below ``--max-loras``).
    """
    if not getattr(args, "enable_lora", False):
        return None
    return LoRAConfig(max_loras=args.max_loras, max_lora_rank=args.max_lora_rank,
                      max_cpu_loras=args.max_cpu_loras, lora_dtype=args.lora_dtype)


def add_structured_output_args(group) -> None:
    group.add_argument("--structured-outputs-config", default=None, metavar="JSON",
                       help="vLLM's JSON, e.g. '{\"backend\": \"guidance\"}': backend (xgrammar, the default; "
                            "guidance = llguidance; auto), disable_any_whitespace, disable_additional_properties, "
                            "and kvserve's compile_timeout_s (a slower compile is a 400), max_compile_workers, "
                            "cache_size")
    group.add_argument("--guided-decoding-backend", default=None, metavar="NAME",
                       help="vLLM's older flag: the same as --structured-outputs-config '{\"backend\": NAME}'")
    group.add_argument("--guided-decoding-disable-any-whitespace", action="store_true", default=None,
                       help="vLLM's older flag: disable_any_whitespace")
    group.add_argument("--guided-decoding-disable-additional-properties", action="store_true", default=None,
                       help="vLLM's older flag: disable_additional_properties")
    from kvserve.reasoning import reasoning_parser_names

    group.add_argument("--reasoning-parser", type=reasoning_parser_name, default=None,
                       metavar="{" + ",".join(reasoning_parser_names()) + "}",
                       help="kvserve serve: split the model's <think>...</think> (openai_gptoss: GPT-OSS's "
                            "harmony analysis channel) into the chat message's reasoning (and "
                            "reasoning_content); structured outputs and forced tool calls start after the reasoning")


def structured_outputs_config_from_args(args: argparse.Namespace) -> StructuredOutputsConfig:
    """``--structured-outputs-config`` (a JSON object or a dict from the offline ``LLM``) and
    vLLM's older ``--guided-decoding-*`` flags laid over it.

    Raises:
        ConfigError: not JSON, an unknown key, or a value out of range.
    """
    raw = args.structured_outputs_config
    try:
        values = dict(json.loads(raw) if isinstance(raw, str) else (raw or {}))
    except (json.JSONDecodeError, TypeError, ValueError) as exc:
        raise ConfigError(f"--structured-outputs-config must be a JSON object: {exc}") from None
    for flag, key in (("guided_decoding_backend", "backend"),
                      ("guided_decoding_disable_any_whitespace", "disable_any_whitespace"),
                      ("guided_decoding_disable_additional_properties", "disable_additional_properties")):
        if getattr(args, flag, None) is not None:
            values[key] = getattr(args, flag)
    known = {f.name for f in dataclasses.fields(StructuredOutputsConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"--structured-outputs-config: unknown key {unknown[0]!r}; "
                          f"known: {', '.join(sorted(known))}")
    try:
        return StructuredOutputsConfig(**values)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"--structured-outputs-config: {exc}") from None
