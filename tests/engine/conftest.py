"""Engine tests run on the session's tiny Llama checkpoint (see tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def model_dir(tiny_llama):
    return tiny_llama
