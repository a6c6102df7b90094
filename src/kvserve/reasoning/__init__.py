"""Reasoning output: ``reasoning_content`` split from ``content`` (``--reasoning-parser``).

* :mod:`.abstract` — the :class:`ReasoningParser` interface, registry and split-invariant
  streaming, with interface notes for wiring it into chat serving and structured outputs;
* :mod:`.think_tags` — ``deepseek_r1`` and ``qwen3`` (``<think>...</think>``);
* :mod:`.gpt_oss` — ``openai_gptoss`` (GPT-OSS's harmony channels).
"""

from kvserve.reasoning.abstract import (
    ReasoningDelta,
    ReasoningParser,
    get_reasoning_parser,
    reasoning_parser_names,
    register_reasoning_parser,
)

__all__ = ["ReasoningDelta", "ReasoningParser", "get_reasoning_parser", "reasoning_parser_names",
           "register_reasoning_parser"]
