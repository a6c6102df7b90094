"""LoRA through the HTTP server: ``model`` selects an adapter, ``/v1/models`` lists adapters with
their parent, unknown names get 404, runtime load/unload (vLLM's endpoints) under load loses no
request, and the metrics carry the adapters."""

from __future__ import annotations

import dataclasses
import json
import threading

import httpx
import pytest
from lora_fixtures import peft_logits

from kvserve.lora.flags import LoRAModulePath
from kvserve.testing.live_server import start_live_server

KEY = "test-key"


@pytest.fixture(scope="module")
def server(qwen2_with_adapters):
    base, adapters = qwen2_with_adapters
    live = start_live_server(
        str(base), served_model_name="tiny-qwen2", api_key=KEY, dtype="float32", enable_lora=True, max_loras=2,
        max_lora_rank=64, max_model_len=256, num_gpu_blocks_override=256, max_num_seqs=32,
        settings={"lora_modules": (LoRAModulePath("sql", str(adapters[0][0])),
                                   LoRAModulePath("chat", str(adapters[1][0]), "Qwen/Qwen2-tiny")),
                  "allow_runtime_lora_updating": True})
    yield live
    live.stop()


def _post(server, path: str, body: dict, **kwargs) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60,
                      **kwargs)


def _complete(server, model: str, prompt: list[int], max_tokens: int = 5) -> httpx.Response:
    return _post(server, "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": max_tokens,
                                              "temperature": 0, "ignore_eos": True, "logprobs": 1,
                                              "return_tokens_as_token_ids": True})


def _token_ids(response: httpx.Response) -> list[int]:
    tokens = response.json()["choices"][0]["logprobs"]["tokens"]
    return [int(t.removeprefix("token_id:")) for t in tokens]


def test_model_selects_the_adapter(server, qwen2_with_adapters):
    prompt = [(7 * i + 3) % 200 + 5 for i in range(12)]
    reply = _complete(server, "sql", prompt)
    assert reply.status_code == 200 and reply.json()["model"] == "sql"
    tokens = _token_ids(reply)
    ref = qwen2_with_adapters[1][0][1]
    assert peft_logits(ref, prompt + tokens[:-1])[len(prompt) - 1:].argmax(-1).tolist() == tokens
    base = _complete(server, "tiny-qwen2", prompt)
    assert base.json()["model"] == "tiny-qwen2" and _token_ids(base) != tokens


def test_models_lists_adapters_with_their_parent(server, qwen2_with_adapters):
    cards = httpx.get(server.base_url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}).json()["data"]
    by_id = {card["id"]: card for card in cards}
    assert list(by_id) == ["tiny-qwen2", "sql", "chat"]
    assert by_id["sql"]["parent"] == "tiny-qwen2" and by_id["sql"]["root"] == str(qwen2_with_adapters[1][0][0])
    assert by_id["chat"]["parent"] == "Qwen/Qwen2-tiny" and by_id["tiny-qwen2"]["parent"] is None
    one = httpx.get(server.base_url + "/v1/models/sql", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert one["id"] == "sql" and one["parent"] == "tiny-qwen2"


def test_unknown_adapter_is_404(server):
    reply = _complete(server, "no-such-adapter", [5, 6, 7])
    assert reply.status_code == 404
    error = reply.json()["error"]
    assert error["code"] == "model_not_found" and error["param"] == "model" and "`sql`" in error["message"]
    chat = _post(server, "/v1/chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 404


def test_runtime_load_and_unload_under_load_lose_no_request(server, qwen2_with_adapters):
    """Requests stream while an adapter is loaded, used and unloaded: every admitted request
    finishes whole (those of the unloaded adapter with it); afterwards its name is a 404."""
    adapters = qwen2_with_adapters[1]
    results: list[tuple[str, int, int]] = []
    lock = threading.Lock()
    started = {name: threading.Semaphore(0) for name in ("sql", "tiny-qwen2", "chat", "math")}

    def client(model: str, index: int) -> None:
        body = {"model": model, "prompt": [(index * 13 + k) % 200 + 5 for k in range(10)], "max_tokens": 24,
                "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        chunks, tokens = 0, None
        with httpx.stream("POST", server.base_url + "/v1/completions", json=body, timeout=60,
                          headers={"Authorization": f"Bearer {KEY}"}) as reply:
            for line in reply.iter_lines():
                if line.startswith("data: {"):
                    chunks += 1
                    if chunks == 1:
                        started[model].release()
                    usage = json.loads(line.removeprefix("data: ")).get("usage")
                    tokens = usage["completion_tokens"] if usage else tokens
        with lock:
            results.append((model, reply.status_code, tokens))

    def launch(models):
        threads = [threading.Thread(target=client, args=(m, i)) for i, m in enumerate(models)]
        for t in threads:
            t.start()
        return threads

    first = launch(["sql", "tiny-qwen2", "chat"] * 3)
    loaded = _post(server, "/v1/load_lora_adapter", {"lora_name": "math", "lora_path": str(adapters[2][0])})
    assert loaded.status_code == 200 and "added successfully" in loaded.text
    second = launch(["math"] * 4)
    for _ in range(4):
        assert started["math"].acquire(timeout=60)  # every math request is streaming
    gone = _post(server, "/v1/unload_lora_adapter", {"lora_name": "math"})
    assert gone.status_code == 200 and "removed successfully" in gone.text
    for t in first + second:
        t.join()
    assert sorted(results) == sorted([(m, 200, 24) for m in ["sql", "tiny-qwen2", "chat"] * 3 + ["math"] * 4])
    assert _complete(server, "math", [5, 6]).status_code == 404
    assert _post(server, "/v1/unload_lora_adapter", {"lora_name": "math"}).status_code == 404


def test_runtime_loading_refusals(server, qwen2_with_adapters, tmp_path):
    adapters = qwen2_with_adapters[1]
    twice = _post(server, "/v1/load_lora_adapter", {"lora_name": "sql", "lora_path": str(adapters[3][0])})
    assert twice.status_code == 400 and "already been loaded" in twice.json()["error"]["message"]
    (tmp_path / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 8, "use_dora": true}')
    dora = _post(server, "/v1/load_lora_adapter", {"lora_name": "dora", "lora_path": str(tmp_path)})
    assert dora.status_code == 400 and dora.json()["error"]["param"] == "lora_path"
    assert "use_dora" in dora.json()["error"]["message"]
    base_name = _post(server, "/v1/load_lora_adapter", {"lora_name": "tiny-qwen2", "lora_path": str(adapters[3][0])})
    assert base_name.status_code == 400
    state = server.serving_state
    saved = state.settings
    state.settings = dataclasses.replace(saved, allow_runtime_lora_updating=False)
    try:
        off = _post(server, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": str(adapters[3][0])})
    finally:
        state.settings = saved
    assert off.status_code == 404 and "--allow-runtime-lora-updating" in off.json()["error"]["message"]


def test_metrics_name_the_adapters(server):
    from prometheus_client.parser import text_string_to_metric_families

    assert _complete(server, "chat", [9, 8, 7, 6]).status_code == 200
    text = httpx.get(server.base_url + "/metrics").text
    samples = {s.name: s for family in text_string_to_metric_families(text) for s in family.samples
               if s.labels.get("lora_name", "chat") == "chat"}
    info = samples["kvserve:lora_requests_info"].labels
    # vLLM's label set for this series: no model_name or engine
    assert info == {"max_lora": "2", "waiting_lora_adapters": "", "running_lora_adapters": ""}
    assert samples["kvserve:lora_generation_tokens_total"].value >= 4
    assert samples["kvserve:lora_prompt_tokens_total"].value >= 4
