"""``POST /v1/embeddings`` and ``POST /pooling`` on a live server (loopback), through the official
``openai`` client (float and base64, which the client decodes), LangChain's ``OpenAIEmbeddings``
and raw HTTP: the vectors equal the offline ``LLM.embed`` of the same prompts bit for bit; every
refused request is a 4xx naming its field, and the server goes on serving."""

from __future__ import annotations

import base64
import time

import httpx
import numpy as np
import pytest

from pooling_helpers import KEY, make_llm
from kvserve.api.pooling_protocol import decode_base64
from kvserve.pooling.params import PoolingParams
from kvserve.router.forwarding import FORWARDED_PATHS
from kvserve.testing.live_server import start_live_server

DOCS = ["The quick brown fox jumps over the lazy dog.", "hi", "Paris is the capital of France."]


@pytest.fixture(scope="module")
def matryoshka_bert(encoder_factory):
    return encoder_factory("BertModel", {"pooling": "cls"}, matryoshka_dimensions=[16, 32, 64])


@pytest.fixture(scope="module")
def bert_server(matryoshka_bert):
    server = start_live_server(str(matryoshka_bert), served_model_name="bert-embed", api_key=KEY, dtype="float32")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def qwen3_server(qwen3_last):
    server = start_live_server(str(qwen3_last), served_model_name="qwen3-embed", api_key=KEY, dtype="float32",
                               max_model_len=256)
    yield server
    server.stop()


def offline(model_dir, prompts, **kwargs) -> list[np.ndarray]:
    llm = make_llm(model_dir, max_model_len=256 if "qwen3" in str(model_dir) else None)
    return [np.array(o.outputs.embedding, dtype=np.float32) for o in llm.embed(prompts, use_tqdm=False, **kwargs)]


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=30)


def assert_refused(server, path: str, body: dict, param: str, match: str) -> None:
    response = post(server, path, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and match in error["message"], error


def test_openai_client_float_and_base64_equal_offline(bert_server, matryoshka_bert):
    client = bert_server.make_client()
    expected = offline(matryoshka_bert, DOCS)
    decoded = client.embeddings.create(model="bert-embed", input=DOCS)  # the client asks for base64 and decodes it
    floats = client.embeddings.create(model="bert-embed", input=DOCS, encoding_format="float", user="someone")
    for response in (decoded, floats):
        assert [d.index for d in response.data] == [0, 1, 2] and response.model == "bert-embed"
        for data, vector in zip(response.data, expected, strict=True):
            assert np.array_equal(np.array(data.embedding, dtype=np.float32), vector)
    tokens = sum(len(t) for t in make_llm(matryoshka_bert).get_tokenizer()(DOCS)["input_ids"])
    assert (floats.usage.prompt_tokens, floats.usage.total_tokens) == (tokens, tokens)


def test_response_shape_and_encodings(bert_server, matryoshka_bert):
    body = post(bert_server, "/v1/embeddings", {"model": "bert-embed", "input": DOCS[0]}).json()
    assert body["object"] == "list" and body["id"].startswith("embd-") and isinstance(body["created"], int)
    assert body["data"][0]["object"] == "embedding" and body["usage"]["completion_tokens"] == 0
    floats = np.array(body["data"][0]["embedding"], dtype=np.float32)
    as_b64 = post(bert_server, "/v1/embeddings", {"input": DOCS[0], "encoding_format": "base64"}).json()
    payload = as_b64["data"][0]["embedding"]
    assert np.array_equal(np.frombuffer(base64.b64decode(payload), dtype="<f4"), floats)  # OpenAI's little-endian
    half = post(bert_server, "/v1/embeddings", {"input": DOCS[0], "encoding_format": "base64", "embed_dtype": "float16",
                                                "endianness": "big"}).json()["data"][0]["embedding"]
    assert np.array_equal(decode_base64(half, "float16", "big"), floats.astype(np.float16).astype(np.float32))
    named = post(bert_server, "/v1/embeddings", {"input": "x", "request_id": "abc"}).json()
    assert named["id"] == "embd-abc"


def test_token_id_inputs_dimensions_and_truncation(bert_server, matryoshka_bert):
    client = bert_server.make_client()
    ids = make_llm(matryoshka_bert).get_tokenizer()(DOCS)["input_ids"]
    as_ids = client.embeddings.create(model="bert-embed", input=ids, encoding_format="float")
    one = client.embeddings.create(model="bert-embed", input=ids[0], encoding_format="float")
    expected = offline(matryoshka_bert, ids)
    assert all(np.array_equal(np.array(d.embedding, dtype=np.float32), v) for d, v in zip(as_ids.data, expected))
    assert np.array_equal(np.array(one.data[0].embedding, dtype=np.float32), expected[0])
    cut = client.embeddings.create(model="bert-embed", input=DOCS, dimensions=16, encoding_format="float")
    expected_cut = offline(matryoshka_bert, DOCS, pooling_params=PoolingParams(dimensions=16))
    assert all(np.array_equal(np.array(d.embedding, dtype=np.float32), v) for d, v in zip(cut.data, expected_cut))
    truncated = post(bert_server, "/v1/embeddings", {"input": DOCS[0], "truncate_prompt_tokens": 4}).json()
    assert truncated["usage"]["prompt_tokens"] == 4
    expected_truncated = offline(matryoshka_bert, DOCS[:1], truncate_prompt_tokens=4)[0]
    assert np.array_equal(np.array(truncated["data"][0]["embedding"], dtype=np.float32), expected_truncated)


def test_pooling_route(bert_server, matryoshka_bert):
    body = post(bert_server, "/pooling", {"model": "bert-embed", "input": DOCS, "task": "embed"}).json()
    assert body["object"] == "list" and body["id"].startswith("pool-")
    assert [d["object"] for d in body["data"]] == ["pooling"] * 3
    for data, vector in zip(body["data"], offline(matryoshka_bert, DOCS), strict=True):
        assert np.array_equal(np.array(data["data"], dtype=np.float32), vector)
    assert_refused(bert_server, "/pooling", {"input": "x", "task": "classify"}, "task", "Unsupported task")


def test_chat_messages_are_rendered_with_the_template(qwen3_server, qwen3_last):
    messages = [{"role": "system", "content": "Embed this."}, {"role": "user", "content": DOCS[2]}]
    llm = make_llm(qwen3_last, max_model_len=256)
    rendered = llm.get_tokenizer().apply_chat_template(messages, tokenize=True, add_generation_prompt=False)
    rendered = list(rendered["input_ids"] if isinstance(rendered, dict) or hasattr(rendered, "keys") else rendered)
    expected = np.array(llm.embed([rendered], use_tqdm=False)[0].outputs.embedding, dtype=np.float32)
    for body in ({"messages": messages}, {"input": messages}, {"messages": [messages, messages]}):
        response = post(qwen3_server, "/v1/embeddings", body).json()
        for data in response["data"]:
            assert np.array_equal(np.array(data["embedding"], dtype=np.float32), expected)
        assert response["usage"]["prompt_tokens"] == len(rendered) * len(response["data"])


def test_langchain_openai_embeddings(qwen3_server, qwen3_last):
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(base_url=qwen3_server.base_url + "/v1", api_key=KEY, model="qwen3-embed",
                                  check_embedding_ctx_length=False, max_retries=0)
    documents = embeddings.embed_documents(DOCS)
    query = embeddings.embed_query("Where is Paris?")
    expected = offline(qwen3_last, [*DOCS, "Where is Paris?"])
    for got, vector in zip([*documents, query], expected, strict=True):
        assert np.array_equal(np.array(got, dtype=np.float32), vector)


def test_refusals_name_the_field_and_the_server_goes_on(qwen3_server):
    vocab = qwen3_server.engine.vocab_size
    cases = [
        ("/v1/embeddings", {"input": "x", "dimensions": 8}, "dimensions", "does not support Matryoshka embeddings"),
        ("/v1/embeddings", {"input": []}, "input", "input must not be empty"),
        ("/v1/embeddings", {"input": ""}, "input", "must be provided and non-empty"),
        ("/v1/embeddings", {}, "input", "input is required"),
        ("/v1/embeddings", {"input": [[5, vocab]]}, "input", f"prompt token id {vocab} is outside the vocabulary"),
        ("/v1/embeddings", {"input": [1, "a"]}, "input", "input must be a string, a list of strings"),
        ("/v1/embeddings", {"input": "x", "normalize": True}, "normalize", "use `use_activation` instead"),
        ("/v1/embeddings", {"input": "x", "encoding_format": "bytes"}, "encoding_format", "binary response"),
        ("/v1/embeddings", {"input": "x", "embed_dtype": "fp8_e4m3"}, "embed_dtype", "not supported"),
        ("/v1/embeddings", {"input": "x", "padding": "max_length"}, "padding", "not padded"),
        ("/v1/embeddings", {"input": "x", "truncate_prompt_tokens": 10_000}, "truncate_prompt_tokens", "greater"),
        ("/v1/embeddings", {"input": "x" * 50, "messages": [{"role": "user", "content": "y"}]}, "messages",
         "either input or messages"),
        ("/v1/completions", {"prompt": "hello", "max_tokens": 3}, "model", "is a pooling model"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello"}]}, "model", "is a pooling model"),
    ]
    for path, body, param, match in cases:
        assert_refused(qwen3_server, path, {"model": "qwen3-embed", **body}, param, match)
    response = post(qwen3_server, "/v1/embeddings", {"model": "unknown", "input": "x"})
    assert response.status_code == 404 and response.json()["error"]["param"] == "model"
    assert httpx.get(qwen3_server.base_url + "/health").status_code == 200
    ok = post(qwen3_server, "/v1/embeddings", {"model": "qwen3-embed", "input": DOCS})
    assert ok.status_code == 200 and len(ok.json()["data"]) == 3
    deadline = time.monotonic() + 10  # the engine thread drops a request just after handing its output over
    while qwen3_server.engine.num_unfinished_requests and time.monotonic() < deadline:
        time.sleep(0.01)
    assert qwen3_server.engine.num_unfinished_requests == 0


def test_a_generative_model_refuses_embeddings(tiny_llama):
    server = start_live_server(str(tiny_llama), served_model_name="gen", api_key=KEY, max_model_len=128,
                               num_gpu_blocks_override=32)
    try:
        for path in ("/v1/embeddings", "/pooling"):
            assert_refused(server, path, {"model": "gen", "input": "hello"}, "model",
                           "Try passing `--runner pooling` to use the model as a pooling model.")
        completion = post(server, "/v1/completions", {"model": "gen", "prompt": "hello", "max_tokens": 2})
        assert completion.status_code == 200
    finally:
        server.stop()


def test_the_router_forwards_the_pooling_routes():
    assert {"/v1/embeddings", "/pooling"} <= FORWARDED_PATHS


def test_invocations_on_a_pooling_model_are_embeddings(bert_server, matryoshka_bert):
    body = post(bert_server, "/invocations", {"input": DOCS}).json()
    assert body["object"] == "list" and body["id"].startswith("embd-")
    for data, vector in zip(body["data"], offline(matryoshka_bert, DOCS), strict=True):
        assert np.array_equal(np.array(data["embedding"], dtype=np.float32), vector)


def test_requests_sharing_a_request_id_each_get_their_own_vectors(bert_server, matryoshka_bert):
    """vLLM's ``request_id`` names the response (``embd-<id>``); two calls in flight with the same
    one were the same engine request ids (a 500 for all but one)."""
    from concurrent.futures import ThreadPoolExecutor
    prompts = [[f"doc {i}", DOCS[i % 3]] for i in range(12)]
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda p: post(bert_server, "/v1/embeddings", {"input": p, "request_id": "same"}),
                                prompts))
    assert [a.status_code for a in answers] == [200] * 12, [a.text for a in answers if a.status_code != 200][:1]
    for prompt, answer in zip(prompts, answers):
        assert answer.json()["id"] == "embd-same"
        for data, vector in zip(answer.json()["data"], offline(matryoshka_bert, prompt), strict=True):
            assert np.array_equal(np.array(data["embedding"], dtype=np.float32), vector)


def test_too_many_inputs_for_the_queue_name_input(bert_server):
    assert_refused(bert_server, "/v1/embeddings", {"input": ["w"] * 5000}, "input", "split it into smaller requests")
    assert post(bert_server, "/v1/embeddings", {"input": "x"}).status_code == 200
