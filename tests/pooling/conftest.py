"""Pooling-model checkpoints (random weights, written once per session) and the references they
are checked against: sentence-transformers where the folder has ``modules.json``, transformers'
``AutoModel`` otherwise; for the classifiers and rerankers, transformers'
``AutoModelForSequenceClassification`` / ``AutoModelForCausalLM`` and sentence-transformers'
``CrossEncoder``."""

from __future__ import annotations

import shutil

import pytest

from kvserve.testing.encoder_checkpoints import add_sentence_transformers, build_encoder_checkpoint
from kvserve.testing.live_server import start_live_server
from pooling_helpers import KEY, make_llm


@pytest.fixture(autouse=True)
def _one_torch_thread(one_torch_thread):
    """Every test here on one torch thread (tests/conftest.py)."""


@pytest.fixture(scope="session")
def encoder_factory(tmp_path_factory):
    """``(architecture, sentence_transformers=None, **overrides) -> folder``, each built once."""
    built = {}

    def build(architecture: str, sentence_transformers: dict | None = None, **overrides):
        key = repr((architecture, sorted((sentence_transformers or {}).items()), sorted(overrides.items())))
        if key not in built:
            folder = tmp_path_factory.mktemp(architecture)
            built[key] = build_encoder_checkpoint(folder, architecture, sentence_transformers=sentence_transformers,
                                                  **overrides)
        return built[key]

    return build


@pytest.fixture(scope="session")
def bert_cls(encoder_factory):
    """BertModel with sentence-transformers CLS pooling and Normalize (classic module names)."""
    return encoder_factory("BertModel", {"pooling": "cls"})


@pytest.fixture(scope="session")
def xlmr_mean(encoder_factory):
    """XLMRobertaModel with sentence-transformers MEAN pooling and Normalize (sentence-transformers
    5's module names and ``pooling_mode``)."""
    return encoder_factory("XLMRobertaModel", {"pooling": "mean", "classic": False})


@pytest.fixture(scope="session")
def qwen3_last(checkpoint_factory, tmp_path_factory):
    """A Qwen3ForCausalLM folder with Qwen3-Embedding's sentence-transformers layout (last-token
    pooling, Normalize)."""
    folder = tmp_path_factory.mktemp("qwen3-embedding")
    shutil.copytree(checkpoint_factory("Qwen3ForCausalLM"), folder, dirs_exist_ok=True)
    return add_sentence_transformers(folder, 64, pooling="lasttoken")


@pytest.fixture(scope="session")
def bert_cross_encoder(encoder_factory):
    """BertForSequenceClassification with one label (a cross-encoder; pairs carry segment ids)."""
    return encoder_factory("BertForSequenceClassification", num_labels=1)


@pytest.fixture(scope="session")
def xlmr_cross_encoder(encoder_factory):
    """XLMRobertaForSequenceClassification with one label (<s> q </s></s> d </s>, one segment type)."""
    return encoder_factory("XLMRobertaForSequenceClassification", num_labels=1)


@pytest.fixture(scope="session")
def qwen3_reranker(tmp_path_factory):
    """A Qwen3ForCausalLM shaped as the original Qwen3-Reranker ("no" / "yes" tokens), to be served
    with QWEN3_RERANKER_OVERRIDES."""
    from kvserve.testing.reranker_checkpoints import build_original_reranker

    return build_original_reranker(tmp_path_factory.mktemp("qwen3-reranker"))


@pytest.fixture(scope="module")
def ce_server(bert_cross_encoder):
    """A live server of the BERT cross-encoder (served name ``bert-ce``, key ``KEY``)."""
    server = start_live_server(str(bert_cross_encoder), served_model_name="bert-ce", api_key=KEY, dtype="float32")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def ce_offline(bert_cross_encoder):
    return make_llm(bert_cross_encoder)
