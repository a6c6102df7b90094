"""``/score``, ``/rerank`` (Jina's and Cohere's shape) and ``/classify`` on live servers (loopback):
the scores equal the offline ``LLM.score`` / ``LLM.classify`` of the same pairs bit for bit, through
raw HTTP, the official ``cohere`` client (``/v2/rerank``) and a LangChain retrieve-then-rerank
pipeline; every refused request is a 4xx naming its field, and the server goes on serving."""

from __future__ import annotations

import time

import httpx
import pytest

from pooling_helpers import KEY, make_llm, post
from kvserve.pooling.params import PoolingParams
from kvserve.router.forwarding import FORWARDED_PATHS
from kvserve.testing.live_server import start_live_server
from kvserve.testing.reranker_checkpoints import QWEN3_RERANKER_OVERRIDES

QUERY = "what is the capital of france"
DOCS = ["The quick brown fox jumps over the lazy dog.", "Paris is the capital of France.", "hi",
        "Berlin is the capital of Germany."]
TEMPLATE = ("<Instruct>: {{ instruction | default('Judge the document') }}\n"
            "<Query>: {{ (messages | selectattr('role', 'eq', 'query') | first).content }}\n"
            "<Document>: {{ (messages | selectattr('role', 'eq', 'document') | first).content }}")


@pytest.fixture(scope="module")
def embed_server(bert_cls):
    server = start_live_server(str(bert_cls), served_model_name="bert-embed", api_key=KEY, dtype="float32")
    yield server
    server.stop()


def offline_scores(llm, query, documents, **kwargs) -> list[float]:
    return [o.outputs.score for o in llm.score(query, documents, use_tqdm=False, **kwargs)]


def assert_refused(server, path: str, body: dict, param: str, match: str) -> None:
    response = post(server, path, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and match in error["message"], error


def test_score_in_every_spelling_equals_offline(ce_server, ce_offline):
    expected = offline_scores(ce_offline, QUERY, DOCS)
    tokenizer = ce_offline.get_tokenizer()
    tokens = sum(len(tokenizer(QUERY, d)["input_ids"]) for d in DOCS)
    for path in ("/score", "/v1/score"):
        for first, second in (("queries", "documents"), ("queries", "items"), ("data_1", "data_2"),
                              ("text_1", "text_2")):
            body = post(ce_server, path, {"model": "bert-ce", first: QUERY, second: DOCS}).json()
            assert body["object"] == "list" and body["id"].startswith("score-") and body["model"] == "bert-ce"
            assert [d["index"] for d in body["data"]] == [0, 1, 2, 3] and body["data"][0]["object"] == "score"
            assert [d["score"] for d in body["data"]] == expected
            assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] == tokens
    pairs = post(ce_server, "/score", {"queries": [QUERY, DOCS[2]], "documents": DOCS[:2]}).json()  # N:N
    assert [d["score"] for d in pairs["data"]] == offline_scores(ce_offline, [QUERY, DOCS[2]], DOCS[:2])
    raw = post(ce_server, "/score", {"text_1": QUERY, "text_2": DOCS, "use_activation": False}).json()
    assert [d["score"] for d in raw["data"]] == offline_scores(ce_offline, QUERY, DOCS,
                                                                pooling_params=PoolingParams(use_activation=False))
    cut = post(ce_server, "/score", {"text_1": QUERY, "text_2": DOCS, "truncate_prompt_tokens": 6}).json()
    assert cut["usage"]["prompt_tokens"] == 6 * len(DOCS)
    assert [d["score"] for d in cut["data"]] == offline_scores(ce_offline, QUERY, DOCS, truncate_prompt_tokens=6)
    named = post(ce_server, "/score", {"text_1": QUERY, "text_2": DOCS[0], "request_id": "abc"}).json()
    assert named["id"] == "score-abc"


def test_rerank_in_jinas_shape(ce_server, ce_offline):
    scores = offline_scores(ce_offline, QUERY, DOCS)
    order = sorted(range(len(DOCS)), key=lambda i: scores[i], reverse=True)
    documents = [DOCS[0], {"text": DOCS[1]}, DOCS[2], {"text": DOCS[3]}]
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        body = post(ce_server, path, {"model": "bert-ce", "query": QUERY, "documents": documents, "top_n": 2}).json()
        assert body["id"].startswith("score-") and body["model"] == "bert-ce"
        assert [r["index"] for r in body["results"]] == order[:2]
        assert [r["relevance_score"] for r in body["results"]] == [scores[i] for i in order[:2]]
        assert [r["document"] for r in body["results"]] == [{"text": DOCS[i]} for i in order[:2]]
        assert body["usage"]["total_tokens"] == sum(len(ce_offline.get_tokenizer()(QUERY, d)["input_ids"])
                                                    for d in DOCS)
    every = post(ce_server, "/rerank", {"query": QUERY, "documents": DOCS, "return_documents": False}).json()
    assert [r["index"] for r in every["results"]] == order and all("document" not in r for r in every["results"])


def test_cohere_client_v2_rerank(ce_server, ce_offline):
    import cohere

    client = cohere.ClientV2(api_key=KEY, base_url=ce_server.base_url)
    response = client.rerank(model="bert-ce", query=QUERY, documents=DOCS, top_n=3)
    scores = offline_scores(ce_offline, QUERY, DOCS)
    order = sorted(range(len(DOCS)), key=lambda i: scores[i], reverse=True)[:3]
    assert [r.index for r in response.results] == order
    assert [r.relevance_score for r in response.results] == [scores[i] for i in order]


def test_classify_route(ce_server, ce_offline):
    body = post(ce_server, "/classify", {"model": "bert-ce", "input": DOCS}).json()
    expected = ce_offline.classify(DOCS, use_tqdm=False)
    assert body["object"] == "list" and body["id"].startswith("classify-")
    assert [d["probs"] for d in body["data"]] == [o.outputs.probs for o in expected]
    assert [(d["label"], d["num_classes"]) for d in body["data"]] == [("LABEL_0", 1)] * len(DOCS)
    assert body["usage"]["prompt_tokens"] == sum(len(o.prompt_token_ids) for o in expected)


def test_invocations_route_by_the_body(ce_server, ce_offline):
    classified = post(ce_server, "/invocations", {"input": DOCS[:2]}).json()
    assert classified["id"].startswith("classify-")
    reranked = post(ce_server, "/invocations", {"query": QUERY, "documents": DOCS}).json()
    assert sorted(r["index"] for r in reranked["results"]) == [0, 1, 2, 3]
    scored = post(ce_server, "/invocations", {"text_1": QUERY, "text_2": DOCS}).json()
    assert [d["score"] for d in scored["data"]] == offline_scores(ce_offline, QUERY, DOCS)


def test_an_embedding_model_scores_by_cosine(embed_server, bert_cls):
    expected = offline_scores(make_llm(bert_cls), QUERY, DOCS)
    body = post(embed_server, "/score", {"text_1": QUERY, "text_2": DOCS}).json()
    assert [d["score"] for d in body["data"]] == expected
    reranked = post(embed_server, "/rerank", {"query": QUERY, "documents": DOCS}).json()
    assert [r["relevance_score"] for r in reranked["results"]] == sorted(expected, reverse=True)


def test_a_reranker_with_the_servers_score_template(qwen3_reranker):
    server = start_live_server(str(qwen3_reranker), served_model_name="reranker", api_key=KEY, dtype="float32",
                               runner="pooling", hf_overrides=QWEN3_RERANKER_OVERRIDES, max_model_len=256,
                               settings={"chat_template": TEMPLATE})
    try:
        llm = make_llm(qwen3_reranker, runner="pooling", hf_overrides=QWEN3_RERANKER_OVERRIDES, max_model_len=256)
        body = post(server, "/score", {"queries": QUERY, "documents": DOCS}).json()
        assert [d["score"] for d in body["data"]] == offline_scores(llm, QUERY, DOCS, chat_template=TEMPLATE)
        instructed = post(server, "/rerank", {"query": QUERY, "documents": DOCS, "instruction": "Find capitals"}).json()
        expected = offline_scores(llm, QUERY, DOCS, chat_template=TEMPLATE.replace("'Judge the document'",
                                                                                   "'Find capitals'"))
        assert sorted(r["relevance_score"] for r in instructed["results"]) == sorted(expected)
    finally:
        server.stop()


def test_refusals_name_the_field_and_the_server_goes_on(ce_server):
    vocab = ce_server.engine.vocab_size
    cases = [
        ("/rerank", {"query": QUERY, "documents": []}, "documents", "At least one text_pair element"),
        ("/rerank", {"query": QUERY, "documents": DOCS, "top_n": -1}, "top_n", "greater than or equal to 0"),
        ("/rerank", {"documents": DOCS}, "query", "query is required"),
        ("/rerank", {"query": QUERY, "documents": [DOCS[0], {"content": []}]}, "documents.1", "must be text"),
        ("/rerank", {"query": QUERY, "documents": DOCS, "max_tokens_per_doc": 10_000}, "max_tokens_per_doc",
         "must be less than max_model_len"),
        ("/score", {"queries": [QUERY, QUERY], "documents": DOCS}, "queries", "1:1, 1:N or N:N"),
        ("/score", {"text_1": QUERY}, "text_2", "text_2 is required"),
        ("/score", {"data_1": [], "data_2": DOCS}, "data_1", "At least one text element"),
        ("/score", {}, "queries", "give the texts to score"),
        ("/score", {"text_1": QUERY, "text_2": DOCS, "truncate_prompt_tokens": 10_000}, "truncate_prompt_tokens",
         "greater than the context length"),
        ("/score", {"text_1": QUERY, "text_2": "x " * 400}, "text_2", "maximum context length"),
        ("/score", {"text_1": QUERY, "text_2": DOCS, "padding": "max_length"}, "padding", "not padded"),
        ("/score", {"text_1": QUERY, "text_2": DOCS, "normalize": True}, "normalize", "use `use_activation` instead"),
        ("/classify", {"input": [[5, vocab]]}, "input", f"prompt token id {vocab} is outside the vocabulary"),
        ("/classify", {"input": "x", "dimensions": 4}, "dimensions", "only supports ['use_activation']"),
        ("/classify", {"input": "x", "encoding_format": "base64"}, "encoding_format", "applies to embeddings"),
        ("/classify", {"input": "x", "embed_dtype": "float16"}, "embed_dtype", "applies to embeddings"),
        ("/v1/embeddings", {"input": "x"}, "task", "Embedding API is not supported by this model"),
        ("/v1/completions", {"prompt": "hello", "max_tokens": 3}, "model", "is a pooling model"),
    ]
    for path, body, param, match in cases:
        assert_refused(ce_server, path, {"model": "bert-ce", **body}, param, match)
    assert post(ce_server, "/rerank", {"model": "unknown", "query": QUERY, "documents": DOCS}).status_code == 404
    ok = post(ce_server, "/rerank", {"query": QUERY, "documents": DOCS})
    assert ok.status_code == 200 and len(ok.json()["results"]) == 4
    deadline = time.monotonic() + 10  # the engine thread drops a request just after handing its output over
    while ce_server.engine.num_unfinished_requests and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ce_server.engine.num_unfinished_requests == 0


def test_a_generative_model_refuses_scoring(tiny_llama):
    server = start_live_server(str(tiny_llama), served_model_name="gen", api_key=KEY, max_model_len=128,
                               num_gpu_blocks_override=32)
    try:
        for path, body in (("/score", {"text_1": QUERY, "text_2": DOCS}), ("/rerank", {"query": QUERY,
                                                                                      "documents": DOCS})):
            assert_refused(server, path, {"model": "gen", **body}, "model", "does not support the Score API")
        assert_refused(server, "/classify", {"model": "gen", "input": "x"}, "model",
                       "does not support the Classification API")
        assert post(server, "/v1/completions", {"model": "gen", "prompt": "hello", "max_tokens": 2}).status_code == 200
    finally:
        server.stop()


def test_the_router_forwards_the_scoring_routes_and_the_schema_lists_them(ce_server):
    paths = {"/classify", "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank"}
    assert paths <= FORWARDED_PATHS
    schema = httpx.get(ce_server.base_url + "/openapi.json", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert paths <= set(schema["paths"])
    assert {"query", "documents", "top_n"} <= set(schema["components"]["schemas"]["RerankRequest"]["properties"])


def test_langchain_retrieval_then_rerank(embed_server, ce_server, bert_cross_encoder):
    """Two live servers: the embedding model retrieves the top k documents of an in-memory vector
    store (LangChain, OpenAI embeddings client), the cross-encoder reranks them over /rerank; the
    final order is the order of the reference cross-encoder's scores."""
    from langchain_core.documents import Document
    from langchain_core.vectorstores import InMemoryVectorStore
    from langchain_openai import OpenAIEmbeddings
    from sentence_transformers import CrossEncoder

    corpus = DOCS + ["Rome is in Italy.", "Numbers 0 1 2 3 4 5.", "A journey of a thousand miles begins with one step.",
                     "Embeddings map text to vectors."]
    embeddings = OpenAIEmbeddings(base_url=embed_server.base_url + "/v1", api_key=KEY, model="bert-embed",
                                  check_embedding_ctx_length=False, max_retries=0)
    store = InMemoryVectorStore(embeddings)
    store.add_documents([Document(page_content=text, metadata={"id": i}) for i, text in enumerate(corpus)])
    retrieved = store.as_retriever(search_kwargs={"k": 5}).invoke(QUERY)
    assert len(retrieved) == 5
    texts = [d.page_content for d in retrieved]
    reranked = post(ce_server, "/rerank", {"model": "bert-ce", "query": QUERY, "documents": texts}).json()["results"]
    final = [texts[r["index"]] for r in reranked]
    reference = CrossEncoder(str(bert_cross_encoder), device="cpu").predict([(QUERY, t) for t in texts], batch_size=1)
    assert final == [texts[i] for i in sorted(range(len(texts)), key=lambda i: reference[i], reverse=True)]
    assert [r["document"]["text"] for r in reranked] == final
