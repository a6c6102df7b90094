"""Per-session caches for tokenizer tests: loading Tekken (131k tokens) takes seconds."""

from __future__ import annotations

import pytest

from kvserve.testing.tokenizer_kinds import sentencepiece_model_path, tekken_json_path
from kvserve.tokenizer import load_tokenizer


@pytest.fixture(scope="session")
def loaded_tokenizer():
    """``(folder) -> tokenizer``: :func:`load_tokenizer`, once per folder. Do not mutate the
    result (tests that change ``chat_template`` load their own)."""
    cache = {}

    def load(folder):
        if folder not in cache:
            cache[folder] = load_tokenizer(folder)
        return cache[folder]

    return load


@pytest.fixture(scope="session")
def mistral_common_tokenizer():
    """``(kind) -> mistral_common MistralTokenizer`` for ``sentencepiece`` or ``tekken``, the
    independent reference for ids and chat encoding."""
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    paths = {"sentencepiece": sentencepiece_model_path, "tekken": tekken_json_path}
    cache = {}

    def get(kind):
        if kind not in cache:
            cache[kind] = MistralTokenizer.from_file(str(paths[kind]()))
        return cache[kind]

    return get
