"""A server with quantized weights says so: ``/v1/models`` (each card's ``quantization``),
``/version`` (what ``kvserve bench`` records as provenance, with the engine's format for the
roofline bound) and the start-up log; a float model reports ``null``."""

from __future__ import annotations

import logging

import httpx
import pytest

from kvserve.kernels import cpu_kernels_available
from kvserve.testing.live_server import start_live_server

pytestmark = pytest.mark.skipif(not cpu_kernels_available(), reason="no C++ compiler for the kernels")


def test_quantization_in_models_version_and_log(tiny_llama, caplog):
    with caplog.at_level(logging.INFO, logger="kvserve.engine.core"):
        server = start_live_server(str(tiny_llama), quantization="int4", quantize_lm_head=True, dtype="float32",
                                   max_model_len=128, num_gpu_blocks_override=32)
    try:
        headers = {"Authorization": f"Bearer {server.api_key}"}
        cards = httpx.get(server.base_url + "/v1/models", headers=headers).json()["data"]
        assert [c["quantization"] for c in cards] == ["int4-g32+lm_head"]
        version = version_of(server)
        assert version["quantization"] == "int4-g32+lm_head"
        # what kvserve bench needs for the roofline bound of a run against this server
        facts = version["engine"]
        assert {k: facts[k] for k in ("model", "dtype", "quantization", "kv_cache_dtype", "device")} == {
            "model": str(tiny_llama), "dtype": "float32", "quantization": "int4-g32+lm_head", "kv_cache_dtype": "auto",
            "device": "cpu"}
        assert isinstance(facts["max_num_seqs"], int) and facts["max_num_seqs"] >= 1
        client = server.make_client()
        reply = client.completions.create(model=server.model, prompt="hello", max_tokens=3, temperature=0)
        assert reply.usage.completion_tokens == 3
    finally:
        server.stop()
    assert "weights int4 (group 32, symmetric); LM head int4 (group 32, symmetric)" in caplog.text


def test_float_model_reports_null(tiny_llama):
    server = start_live_server(str(tiny_llama), dtype="float32", max_model_len=128, num_gpu_blocks_override=32)
    try:
        cards = httpx.get(server.base_url + "/v1/models", headers={"Authorization": f"Bearer {server.api_key}"})
        assert cards.json()["data"][0]["quantization"] is None
        assert version_of(server)["quantization"] is None
    finally:
        server.stop()


def test_gguf_file_in_models_version_and_log(tiny_llama, tmp_path, caplog):
    """``kvserve serve model-Q8_0.gguf``: the file's types in /v1/models and /version, the layers'
    forms in the log, the file's chat template behind /v1/chat/completions."""
    from kvserve.builtin import resolve_model
    from kvserve.testing.gguf_export import export_gguf

    path = export_gguf(tiny_llama, tmp_path / "tiny-Q8_0.gguf", "q8_0")
    assert resolve_model(str(path)) == (str(path), "tiny-Q8_0")
    with caplog.at_level(logging.INFO, logger="kvserve.engine.core"):
        server = start_live_server(str(path), dtype="float32", max_model_len=128, num_gpu_blocks_override=32)
    try:
        headers = {"Authorization": f"Bearer {server.api_key}"}
        cards = httpx.get(server.base_url + "/v1/models", headers=headers).json()["data"]
        assert [c["quantization"] for c in cards] == ["gguf-Q8_0"]
        assert version_of(server)["quantization"] == "gguf-Q8_0"
        reply = server.make_client().chat.completions.create(
            model=server.model, messages=[{"role": "user", "content": "hello"}], max_tokens=3, temperature=0)
        assert reply.usage.completion_tokens <= 3 and reply.usage.prompt_tokens > 3
    finally:
        server.stop()
    assert "weights GGUF Q8_0: int8 (group 32); LM head int8 (group 32)" in caplog.text


def version_of(server) -> dict:
    """``/version`` with the key: the commit, quantization and engine facts need it."""
    return httpx.get(server.base_url + "/version", headers={"Authorization": f"Bearer {server.api_key}"}).json()
