"""Hostile-client and API-misuse cases of the pooling routes and the offline pooling API: each
mistake is a clear error naming what is wrong (never a silent choice, an AttributeError or a 500),
and the engine goes on serving the same bits afterwards."""

from __future__ import annotations

import pytest

from pooling_helpers import make_llm, post
from kvserve.errors import CheckpointError, InvalidRequestError
from kvserve.pooling.classifier_config import read_classifier_config
from kvserve.pooling.params import PoolingParams

QUERY = "what is the capital of france"
DOCS = ["Paris is the capital of France.", "hi"]


@pytest.mark.parametrize("body, param", [
    ({"queries": QUERY, "documents": DOCS, "text_1": "other", "text_2": ["x"]}, "text_1"),
    ({"data_1": QUERY, "data_2": DOCS, "documents": ["x"]}, "documents"),
    ({"queries": QUERY, "documents": DOCS, "items": ["x"]}, "items"),
    ({"text_1": QUERY, "text_2": DOCS, "data_2": "x"}, "data_2"),
])
def test_score_refuses_two_spellings_at_once(ce_server, body, param):
    """The sides under two of vLLM's spellings are a client's mistake: one of them would be
    silently dropped. 400 naming the stray field."""
    response = post(ce_server, "/score", body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and "one" in error["message"], error
    ok = post(ce_server, "/score", {"text_1": QUERY, "text_2": DOCS})
    assert ok.status_code == 200 and len(ok.json()["data"]) == 2


@pytest.mark.parametrize("value, words", [([[1, 2.5, 3]], "input[0][1]"), ([[1, 2], "a"], "input[1]"),
                                           ([[1, None]], "input[0][1]")])
def test_input_token_ids_that_are_not_integers(ce_server, value, words):
    """A list of lists that is not token ids is not worded as chat messages."""
    response = post(ce_server, "/classify", {"input": value})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "input" and words in error["message"] and "chat" not in error["message"], error


def test_offline_token_id_that_is_not_an_integer(ce_offline):
    with pytest.raises(InvalidRequestError, match="integer"):
        ce_offline.classify({"prompt_token_ids": [5, 1.5]}, use_tqdm=False)


def test_offline_score_and_prompts_of_the_wrong_type(ce_offline):
    expected = [o.outputs.score for o in ce_offline.score(QUERY, DOCS, use_tqdm=False)]
    with pytest.raises(TypeError, match="pooling_params must be a PoolingParams"):
        ce_offline.score(QUERY, DOCS, pooling_params={"use_activation": False})
    for prompts in (5, None, 1.5):
        with pytest.raises(TypeError, match="prompts must be"):
            ce_offline.classify(prompts, use_tqdm=False)
    raw = ce_offline.score(QUERY, DOCS, pooling_params=PoolingParams(use_activation=False), use_tqdm=False)
    assert all(isinstance(o.outputs.score, float) for o in raw)
    assert [o.outputs.score for o in ce_offline.score(QUERY, DOCS, use_tqdm=False)] == expected


@pytest.mark.parametrize("raw, words", [({"id2label": 5}, "id2label"), ({"id2label": {"x": "a"}}, "id2label"),
                                        ({"id2label": ["a", "b"]}, "id2label")])
def test_classifier_config_with_a_malformed_id2label(raw, words):
    with pytest.raises(CheckpointError, match=words):
        read_classifier_config(raw)


def test_hf_overrides_architectures_must_be_a_list_of_names(bert_cross_encoder):
    for value in ("BertForSequenceClassification", [5]):
        with pytest.raises((CheckpointError, ValueError), match="architectures"):
            make_llm(bert_cross_encoder, hf_overrides={"architectures": value})


def test_hf_overrides_num_labels_is_not_silently_ignored(bert_cross_encoder):
    """As transformers' ``num_labels`` setter (vLLM's ``config.update``): a new count rebuilds
    ``id2label``, so a one-label checkpoint overridden to three labels fails to load by name
    instead of serving one label; a count that is not a positive integer is refused."""
    with pytest.raises(CheckpointError, match="classifier"):
        make_llm(bert_cross_encoder, hf_overrides={"num_labels": 3})
    for value in ("x", 0, True):
        with pytest.raises(ValueError, match="num_labels"):
            make_llm(bert_cross_encoder, hf_overrides={"num_labels": value})
    from kvserve.model.hf_overrides import apply_hf_overrides

    raw = {"id2label": {"0": "LABEL_0"}}
    assert apply_hf_overrides(raw, {"num_labels": 2})["id2label"] == {"0": "LABEL_0", "1": "LABEL_1"}
    assert apply_hf_overrides(raw, {"num_labels": 1})["id2label"] == {"0": "LABEL_0"}


def test_convert_classify_on_a_causal_lm_without_a_head_says_how_to_make_one(tiny_llama):
    from kvserve import LLM
    from kvserve.errors import CheckpointError

    with pytest.raises(CheckpointError, match=r"missing tensor\(s\): score\.weight; a causal LM has no "
                                              r"classification head.*classifier_from_token"):
        LLM(str(tiny_llama), runner="pooling", convert="classify")
