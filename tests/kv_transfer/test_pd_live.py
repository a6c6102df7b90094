"""Disaggregated prefill/decode on real servers: a prefill instance (--kv-role producer), a decode
instance (--kv-role consumer) and ``kvserve route --pd`` in front. The decode instance loads the
prompt's blocks from the prefill instance and gives outputs identical, bit for bit, to a colocated
server's; a prefill instance that is gone leaves the decode instance to compute the prompt
(same output); a bad kv_transfer_params, or one naming a server that is not one of the decode
instance's --kv-producers, is a 400 naming it."""

from __future__ import annotations

import time

import httpx
import pytest

from kvserve.kv_transfer import pd
from kvserve.testing.live_server import free_port, start_live_server
from router.fleet_helpers import RouterProcess

MODEL = "tiny"
KEY = {"Authorization": "Bearer test-key"}
ENGINE = dict(served_model_name=MODEL, max_model_len=256, block_size=16, num_gpu_blocks_override=128,
              dtype="float32", seed=0)
PROMPT = "the quick brown fox jumps over the lazy dog " * 8


@pytest.fixture(scope="module")
def servers(tiny_llama):
    port, dead = free_port(), free_port()
    producer = start_live_server(str(tiny_llama), kv_role="producer", kv_port=port, **ENGINE)
    consumer = start_live_server(str(tiny_llama), kv_role="consumer",
                                 kv_producers=[f"127.0.0.1:{port}", f"127.0.0.1:{dead}"], **ENGINE)
    colocated = start_live_server(str(tiny_llama), **ENGINE)
    yield producer, consumer, colocated, (port, dead)
    for server in (producer, consumer, colocated):
        server.stop()


def body(prompt: str = PROMPT, **extra) -> dict:
    return {"model": MODEL, "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True,
            "logprobs": 2, **extra}


def choice(response: httpx.Response):
    assert response.status_code == 200, response.text
    data = response.json()["choices"][0]
    return data["text"], data["logprobs"]["token_logprobs"], data["logprobs"]["top_logprobs"]


def p2p_tokens(server) -> int:
    return server.core.make_stats().kv_transfer.hits_by_source.get("p2p", 0)


def test_the_router_prefills_on_one_server_and_decodes_on_the_other(servers, tmp_path):
    producer, consumer, colocated, _ = servers
    router = RouterProcess(tmp_path, [], "--worker-urls", consumer.base_url, "--pd", "--prefill-urls",
                           producer.base_url, "--api-key", "test-key").start()
    try:
        planted = {"kv_transfer_params": {"do_remote_prefill": True, "remote_host": "127.0.0.1",
                                          "remote_port": servers[3][1]}}  # a client's own: the router drops it
        for i, extra in enumerate([{}, {"temperature": 1.0, "seed": 7, **planted}]):
            prompt = f"{i} " + PROMPT
            plain = {k: v for k, v in extra.items() if k != "kv_transfer_params"}
            want = choice(httpx.post(colocated.base_url + "/v1/completions", json=body(prompt, **plain), headers=KEY))
            before = p2p_tokens(consumer)
            got = choice(httpx.post(router.url + "/v1/completions", json=body(prompt, **extra), headers=KEY,
                                    timeout=60))
            assert got == want  # text, logprobs and top logprobs, exactly
            assert p2p_tokens(consumer) - before >= 16 * 4  # the prompt's full blocks came from the producer
        chat = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 6, "temperature": 0,
                "stream": True}
        streamed = httpx.post(router.url + "/v1/chat/completions", json=chat, headers=KEY, timeout=60)
        direct = httpx.post(colocated.base_url + "/v1/chat/completions", json=chat, headers=KEY)
        assert streamed.status_code == 200 and _content(streamed.text) == _content(direct.text)
        metrics = httpx.get(consumer.base_url + "/metrics").text
        assert 'prompt_tokens_cached_by_source_total{engine="0",model_name="tiny",source="p2p"}' in metrics
        assert 'kv_connector_bytes_total{direction="load",model_name="tiny",tier="p2p"}' in metrics
        external = [line for line in metrics.splitlines()
                    if line.startswith("kvserve:prompt_tokens_by_source_total") and "external_kv_transfer" in line]
        assert float(external[0].split()[-1]) >= 2 * 16 * 4
        assert 'kvserve_router_pd_prefills_total{outcome="ok"}' in httpx.get(router.url + "/metrics").text
    finally:
        router.stop()


def _content(sse: str) -> str:
    import json

    parts = []
    for line in sse.splitlines():
        if line.startswith("data: {"):
            for c in json.loads(line[6:])["choices"]:
                parts.append(c["delta"].get("content") or "")
    return "".join(parts)


def test_the_producer_answers_where_its_blocks_are(servers):
    producer, _, _, (port, _) = servers
    data = httpx.post(producer.base_url + "/v1/completions", headers=KEY,
                      json=body(max_tokens=1, kv_transfer_params={"do_remote_decode": True})).json()
    params = data["kv_transfer_params"]
    assert params == {"do_remote_prefill": True, "do_remote_decode": False, "remote_host": "127.0.0.1",
                      "remote_port": port, "remote_engine_id": producer.core.kv_transfer.fingerprint}
    plain = httpx.post(producer.base_url + "/v1/completions", headers=KEY, json=body(max_tokens=1)).json()
    assert plain["kv_transfer_params"] is None


def test_a_prefill_instance_that_is_gone_or_another_model_leaves_the_decode_instance_to_compute(servers,
                                                                                                monkeypatch):
    _, consumer, colocated, (port, dead) = servers
    monkeypatch.setattr(pd, "FETCH_TIMEOUT_S", 1.0)
    failures = consumer.core.kv_transfer.consumer.failures
    for name, params in [("gone", {"do_remote_prefill": True, "remote_host": "127.0.0.1", "remote_port": dead}),
                         ("other", {"do_remote_prefill": True, "remote_host": "127.0.0.1", "remote_port": port,
                                    "remote_engine_id": "another-model"})]:
        prompt = f"{name} " + PROMPT
        got = choice(httpx.post(consumer.base_url + "/v1/completions", headers=KEY, timeout=60,
                                json=body(prompt, kv_transfer_params=params)))
        assert got == choice(httpx.post(colocated.base_url + "/v1/completions", json=body(prompt), headers=KEY))
        failures += 1
        assert consumer.core.kv_transfer.consumer.failures == failures
    started = time.monotonic()  # the dead producer is not waited on again for a while
    httpx.post(consumer.base_url + "/v1/completions", headers=KEY, timeout=60,
               json=body("again " + PROMPT, kv_transfer_params={"do_remote_prefill": True, "remote_host": "127.0.0.1",
                                                                "remote_port": dead}))
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize("params,words", [
    ("yes", "should be a valid dictionary"),
    ({"do_remote_decode": True}, "do_remote_decode needs a server started with --kv-role producer"),
    ({"do_remote_prefill": True}, "needs remote_host and remote_port"),
    ({"do_remote_prefill": True, "remote_host": "h", "remote_port": 0}, "remote_port must be an integer"),
    ({"do_remote_prefill": True, "remote_host": "10.9.9.9", "remote_port": 5},
     "10.9.9.9:5 is not one of this server's producers"),
    ({"remote_port": "x"}, "remote_port must be an integer"),
    ({"remote_engine_id": {"x": 1}}, "remote_engine_id must be a string"),
    ({"remote_block_ids": [1]}, "unknown key 'remote_block_ids'"),
    ({"do_remote_prefill": "yes"}, "do_remote_prefill must be a boolean"),
])
def test_bad_kv_transfer_params_are_400s_naming_them(servers, params, words):
    _, consumer, _, _ = servers
    response = httpx.post(consumer.base_url + "/v1/completions", headers=KEY, json=body(kv_transfer_params=params))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "kv_transfer_params" and words in error["message"]


def test_a_server_without_a_role_refuses_them(servers):
    _, _, colocated, _ = servers
    response = httpx.post(colocated.base_url + "/v1/completions", headers=KEY,
                          json=body(kv_transfer_params={"do_remote_decode": True}))
    assert response.status_code == 400 and "no --kv-role" in response.json()["error"]["message"]
