"""When StructuredOutputManager builds its grammar backend: at once for a server
(``build_now``), at the first constrained request for an offline engine (as vLLM's does), and
once either way."""

from __future__ import annotations

import threading

import pytest

from kvserve.engine.arg_utils import engine_config_from_kwargs
from kvserve.engine.input_processor import build_input_processor
from kvserve.structured_output import manager as manager_module
from kvserve.structured_output.errors import StructuredOutputError
from kvserve.structured_output.manager import StructuredOutputManager
from kvserve.structured_output.params import StructuredOutputsParams
from kvserve.tokenizer import load_tokenizer


@pytest.fixture
def builds(monkeypatch):
    calls = []

    def fake_backend(tokenizer, vocab_size, stop_token_ids, config):
        calls.append(threading.get_native_id())
        raise RuntimeError("no backend in this test")

    monkeypatch.setattr(manager_module, "create_backend", fake_backend)
    return calls


def _compile_fails(manager):
    with pytest.raises(StructuredOutputError, match="not available on this server: no backend in this test"):
        manager.compile(StructuredOutputsParams(regex="[a-z]+"))


def test_offline_engine_builds_at_the_first_constrained_request(builds):
    manager = StructuredOutputManager(tokenizer=None, vocab_size=8, stop_token_ids=[0], build_now=False)
    threading.Event().wait(0.2)
    assert builds == []
    _compile_fails(manager)
    _compile_fails(manager)
    assert len(builds) == 1 and builds[0] != threading.get_native_id()


def test_server_builds_at_start(builds):
    manager = StructuredOutputManager(tokenizer=None, vocab_size=8, stop_token_ids=[0], build_now=True)
    manager.start_build().exception(timeout=30)
    assert len(builds) == 1
    _compile_fails(manager)
    assert len(builds) == 1


def test_input_processor_builds_only_when_asked(builds, tiny_llama):
    config = engine_config_from_kwargs(str(tiny_llama))
    tokenizer = load_tokenizer(str(tiny_llama))
    offline = build_input_processor(config, tokenizer, 256, 64)
    served = build_input_processor(config, tokenizer, 256, 64, build_backend_now=True)
    served.structured_outputs.start_build().exception(timeout=30)
    assert len(builds) == 1
    _compile_fails(offline.structured_outputs)
    assert len(builds) == 2
