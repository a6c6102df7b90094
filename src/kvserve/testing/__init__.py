"""Offline test fixtures: tiny random-weight Hugging Face checkpoints and their tokenizers."""

from kvserve.testing.checkpoints import ARCHITECTURES, build_checkpoint
from kvserve.testing.tokenizer_kinds import TOKENIZER_KINDS, build_tokenizer

__all__ = ["ARCHITECTURES", "TOKENIZER_KINDS", "build_checkpoint", "build_tokenizer"]
