"""Engine-level structured-output options (vLLM's ``--structured-outputs-config``); torch-free, so
the engine configuration can hold them."""

from __future__ import annotations

from dataclasses import dataclass

BACKEND_CHOICES = ("auto", "xgrammar", "guidance")


# Whitespace between JSON tokens, llama.cpp's rule (its json.gbnf ``ws ::= | " " | "\n" [ \t]{0,20}``):
# nothing, one space, or one newline and up to 20 spaces or tabs of indentation. Pretty-printed
# JSON 10 levels deep at indent 2 fits, and a weak model can no longer write "\n" until max_tokens
# (xgrammar's and vLLM's flexible default is any run). disable_any_whitespace: none at all.
MAX_JSON_WHITESPACE = 20
JSON_WHITESPACE_REGEX = rf"(?: |\n[ \t]{{0,{MAX_JSON_WHITESPACE}}})?"
JSON_WHITESPACE_EBNF = rf'("" | " " | "\n" [ \t]{{0, {MAX_JSON_WHITESPACE}}})'


@dataclass(frozen=True)
class StructuredOutputsConfig:
    """Engine-level options (vLLM's ``--structured-outputs-config``), built once from flags.

    Attributes:
        backend: ``auto`` (the default, as vLLM's: xgrammar, and llguidance for the schemas
            xgrammar cannot enforce), ``xgrammar``, or ``guidance`` (llguidance).
        disable_any_whitespace: compact JSON for every request.
        disable_additional_properties: ``additionalProperties: false`` by default (guidance).
        compile_timeout_s: a compile slower than this is refused (HTTP 400).
        max_compile_workers: threads compiling specs (xgrammar and llguidance release the GIL).
        cache_size: compiled grammars kept (LRU) by canonical spec.
        max_spec_bytes: largest spec text accepted.
        max_rollback_tokens: tokens a matcher can roll back (speculative decoding), 0 for none.
    """

    backend: str = "auto"
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    compile_timeout_s: float = 10.0
    max_compile_workers: int = 2
    cache_size: int = 512
    max_spec_bytes: int = 1 << 20
    max_rollback_tokens: int = 0

    def __post_init__(self) -> None:
        if self.backend not in BACKEND_CHOICES:
            raise ValueError(
                f"structured outputs backend must be one of {', '.join(BACKEND_CHOICES)}; "
                f"got {self.backend!r}"
            )
        if self.compile_timeout_s <= 0 or self.max_compile_workers < 1 or self.cache_size < 0:
            raise ValueError("compile_timeout_s > 0, max_compile_workers >= 1, cache_size >= 0")
