"""Run the attention tests on one torch thread (tiny tensors; restored after each test)."""

import pytest


@pytest.fixture(autouse=True)
def _one_torch_thread(one_torch_thread):
    """Every test here on one torch thread (tests/conftest.py)."""
