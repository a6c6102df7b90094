"""Fixtures of the LoRA tests: adapters are written once per session next to their base."""

from __future__ import annotations

import pytest
from lora_fixtures import SPECS, make_adapter
from model_fixtures import tiny_checkpoint  # noqa: F401  (re-exported fixture)


@pytest.fixture(autouse=True)
def _one_torch_thread(one_torch_thread):
    """Every test here on one torch thread (tests/conftest.py)."""


@pytest.fixture(scope="session")
def adapter_factory(tmp_path_factory):
    """``(base_dir, spec) -> (adapter folder, reference PeftModel)``, cached per session."""
    cache = {}

    def get(base_dir, spec):
        key = (str(base_dir), spec)
        if key not in cache:
            folder = tmp_path_factory.mktemp(f"lora_r{spec.rank}")
            cache[key] = (folder, make_adapter(base_dir, folder, spec))
        return cache[key]

    return get


@pytest.fixture(scope="session")
def qwen2_with_adapters(checkpoint_factory, adapter_factory):
    """A Qwen2 checkpoint with a tokenizer and the four ``SPECS`` adapters: ``(base_dir,
    [(adapter_dir, reference), ...])``."""
    base = checkpoint_factory("Qwen2ForCausalLM")
    return base, [adapter_factory(base, spec) for spec in SPECS]
