"""Fixes on the request path: the KV cache counts its null block when it is sized, seeds anywhere
in vLLM's range work for every choice of an ``n > 1`` request, and tokenization runs off the
server's event loop."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
import torch

from kvserve import LLM, SamplingParams
from kvserve.errors import ConfigError
from kvserve.model.arch_config import ModelArchConfig
from kvserve.model.kv_cache_layout import kv_cache_bytes_per_block
from kvserve.testing.live_server import start_live_server


def test_a_full_context_request_fits_the_cache_the_server_sized(tiny_llama):
    """16 blocks of 16 tokens hold 15 usable blocks (block 0 is the null block): not enough for
    max_model_len 256, refused at start with the budget that works; 17 blocks serve a 255-token
    prompt with max_tokens 1."""
    arch = ModelArchConfig.from_file(tiny_llama / "config.json")
    per_block = kv_cache_bytes_per_block(arch, 16, torch.float32)
    with pytest.raises(ConfigError) as info:
        LLM(str(tiny_llama), dtype="float32", max_model_len=256, kv_cache_memory_bytes=16 * per_block)
    assert f"--kv-cache-memory-bytes {17 * per_block}" in str(info.value) and "240" in str(info.value)
    llm = LLM(str(tiny_llama), dtype="float32", max_model_len=256, kv_cache_memory_bytes=17 * per_block)
    out = llm.generate([list(range(5, 260))], SamplingParams(max_tokens=1, ignore_eos=True))[0]
    assert len(out.prompt_token_ids) == 255 and len(out.outputs[0].token_ids) == 1


@pytest.fixture(scope="module")
def server(tiny_llama):
    srv = start_live_server(str(tiny_llama), served_model_name="tiny", api_key="k", max_model_len=256,
                            num_gpu_blocks_override=64)
    yield srv
    srv.stop()


def post(server, body) -> httpx.Response:
    return httpx.post(server.base_url + "/v1/completions", json={"model": "tiny", **body}, timeout=120,
                      headers={"Authorization": "Bearer k"})


def test_seeds_at_the_ends_of_the_range_and_n_choices(server):
    """The request that used to stop the engine (seed 2**64 - 1, n=2) is outside vLLM's int64
    range: a 400. At the top of the range, seed + index for the second choice passes it and is
    taken modulo 2**64 by the generator; both choices are generated and reproducible."""
    body = {"prompt": "hi", "max_tokens": 4, "n": 2, "temperature": 1.0, "ignore_eos": True}
    refused = post(server, {**body, "seed": 18446744073709551615})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "seed"
    for seed in (2**63 - 1, -(2**63)):
        first, again = post(server, {**body, "seed": seed}), post(server, {**body, "seed": seed})
        assert first.status_code == 200, first.text
        assert [c["text"] for c in first.json()["choices"]] == [c["text"] for c in again.json()["choices"]]
    assert httpx.get(server.base_url + "/health").status_code == 200


def test_a_huge_prompt_is_tokenized_off_the_event_loop(server):
    """A 2.5 MB prompt is refused for its length before it is tokenized; to be truncated
    (``truncate_prompt_tokens``) it is tokenized whole (seconds) while /health keeps answering."""
    text = "It is a truth universally acknowledged. " * 62_500
    refused = post(server, {"prompt": text, "max_tokens": 1})
    assert refused.status_code == 400 and "You passed 2500000 input characters" in refused.text
    result: dict = {}
    worker = threading.Thread(target=lambda: result.update(
        response=post(server, {"prompt": text, "max_tokens": 1, "truncate_prompt_tokens": 8})))
    worker.start()
    answered = 0
    while worker.is_alive():
        start = time.monotonic()
        assert httpx.get(server.base_url + "/health", timeout=10).status_code == 200
        answered += time.monotonic() - start < 1.0
        time.sleep(0.05)
    worker.join()
    assert result["response"].status_code == 200, result["response"].text
    assert result["response"].json()["usage"]["prompt_tokens"] == 8
    assert answered >= 3  # the loop answered many times during the tokenization
