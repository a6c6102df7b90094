"""Fixtures of the model-runtime tests; the checkpoint builders live in ``model_fixtures.py``."""

import pytest
from model_fixtures import tiny_checkpoint  # noqa: F401  (re-exported fixture)


@pytest.fixture(autouse=True)
def _one_torch_thread(one_torch_thread):
    """Every test here on one torch thread (tests/conftest.py)."""
