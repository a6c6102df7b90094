"""Fixtures of the model-runtime tests; the checkpoint builders live in ``model_fixtures.py``."""

import pytest
import torch
from model_fixtures import tiny_checkpoint  # noqa: F401  (re-exported fixture)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models run fastest on one thread; with other work on the machine, OpenMP threads
    contend and a 2-thread run was 20x slower. Restored after each test."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
