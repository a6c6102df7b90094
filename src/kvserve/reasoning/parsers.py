"""Imports the built-in parsers so that they register (``deepseek_r1``, ``qwen3``, ``openai_gptoss``)."""

import kvserve.reasoning.gpt_oss  # noqa: F401
import kvserve.reasoning.think_tags  # noqa: F401
