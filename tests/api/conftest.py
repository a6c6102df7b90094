"""The ``live_server`` fixture: a real kvserve (engine thread + uvicorn) on 127.0.0.1."""

from __future__ import annotations

import pytest

from kvserve.testing.live_server import start_live_server


@pytest.fixture(scope="session")
def live_server(tiny_llama):
    server = start_live_server(
        str(tiny_llama), served_model_name="tiny-llama", api_key="test-key",
        max_model_len=256, block_size=16, num_gpu_blocks_override=256, max_num_seqs=64,
    )
    server.client = server.make_client()
    yield server
    server.stop()
