"""The inputs of scoring, as vLLM 0.32 builds them: the 1:1 / 1:N / N:N pairing and its errors, a
pair's prompt (the tokenizer's pair form with segment ids, the concatenation of an LLM reranker,
a score template), truncation of a pair and of a text, and the compressed segment ids; checked
against the tokenizers' own outputs."""

from __future__ import annotations

import pytest

from kvserve.errors import InvalidRequestError
from kvserve.pooling.classifier_config import ClassifierConfig
from kvserve.pooling.params import PoolingParams
from kvserve.pooling.score_inputs import TextPair, compress_token_type_ids, pair_prompt, pair_token_ids, pair_up
from kvserve.pooling.scoring import ScoreOptions, plan_scoring, truncate_text_to_tokens
from kvserve.testing.encoder_checkpoints import build_encoder_tokenizer

QUERY, DOCS = "what is the capital of france", ["Paris is the capital of France.", "The quick brown fox", "hi"]
TEMPLATE = ("{{ instruction | default('Judge') }}|{{ messages | selectattr('role', 'eq', 'query') | map(attribute="
            "'content') | first }}|{{ messages | selectattr('role', 'eq', 'document') | map(attribute='content') "
            "| first }}")


@pytest.fixture(scope="module")
def wordpiece():
    return build_encoder_tokenizer("wordpiece")


def test_pairing_rules_and_their_errors():
    assert pair_up("q", ["a", "b"]) == [("q", "a"), ("q", "b")]
    assert pair_up(["q"], "a") == [("q", "a")]
    assert pair_up(["q1", "q2"], ["a", "b"]) == [("q1", "a"), ("q2", "b")]
    with pytest.raises(InvalidRequestError, match=r"1:1, 1:N or N:N \(got 2 queries and 3 documents\)") as info:
        pair_up(["q1", "q2"], ["a", "b", "c"], ("queries", "documents"))
    assert info.value.param == "queries"
    with pytest.raises(InvalidRequestError, match="At least one text element") as info:
        pair_up([], ["a"], ("text_1", "text_2"))
    assert info.value.param == "text_1"
    with pytest.raises(InvalidRequestError, match="At least one text_pair element") as info:
        pair_up("q", [], ("query", "documents"))
    assert info.value.param == "documents"


def test_compressed_token_type_ids():
    assert compress_token_type_ids([0, 0, 0, 1, 1]) == 3
    assert compress_token_type_ids([0, 0]) == 2 and compress_token_type_ids([1, 1]) == 0
    for bad in ([0, 1, 0], [0, 2]):
        with pytest.raises(ValueError, match="zeros followed by a sequence of ones"):
            compress_token_type_ids(bad)


@pytest.mark.parametrize("limit, side", [(None, None), (9, None), (9, "left"), (9, "right"), (-1, None)])
def test_a_pair_is_the_tokenizers_pair_and_its_segment_start(wordpiece, limit, side):
    params = PoolingParams(truncate_prompt_tokens=limit, truncation_side=side)
    ids, start = pair_token_ids(wordpiece, TextPair(QUERY, DOCS[0]), params, 64, token_types=True)
    if limit is None or limit == -1 or side is not None:
        whole = wordpiece(QUERY, DOCS[0])
        expected_ids, expected_types = whole["input_ids"], whole["token_type_ids"]
        if limit not in (None, -1):
            cut = slice(len(expected_ids) - limit, None) if side == "left" else slice(0, limit)
            expected_ids, expected_types = expected_ids[cut], expected_types[cut]
    else:  # the tokenizer cuts the pair itself (longest_first), special tokens kept
        cut = wordpiece(QUERY, DOCS[0], truncation=True, max_length=limit)
        expected_ids, expected_types = cut["input_ids"], cut["token_type_ids"]
    assert ids == expected_ids
    assert start == (expected_types.index(1) if 1 in expected_types else None)
    assert pair_token_ids(wordpiece, TextPair(QUERY, DOCS[0]), params, 64, token_types=False)[1] is None


def test_a_pair_prompt_follows_the_model_and_the_template(wordpiece):
    cross = ClassifierConfig(num_labels=1)
    assert pair_prompt(QUERY, DOCS[0], cross, wordpiece) == TextPair(QUERY, DOCS[0])
    llm = ClassifierConfig(num_labels=1, use_sep_token=False)
    assert pair_prompt("<q>", "<d>", llm, wordpiece) == {"prompt": "<q><d>", "add_special_tokens": True}
    templated = pair_prompt("q", "d", llm, wordpiece, TEMPLATE, {"instruction": "Rank"})
    assert templated == {"prompt": "Rank|q|d", "add_special_tokens": True}
    assert pair_prompt("q", "d", cross, wordpiece, TEMPLATE)["prompt"] == "Judge|q|d"
    with pytest.raises(InvalidRequestError, match="reserved keys") as info:
        pair_prompt("q", "d", cross, wordpiece, TEMPLATE, {"tools": []})
    assert info.value.param == "chat_template_kwargs"


def test_text_truncation_cuts_at_token_boundaries(wordpiece):
    text = DOCS[0]
    for n in (1, 2, 3, 5):
        cut = truncate_text_to_tokens(text, wordpiece, n)
        assert wordpiece(cut, add_special_tokens=False)["input_ids"] == \
            wordpiece(text, add_special_tokens=False)["input_ids"][:n]
    assert truncate_text_to_tokens(text, wordpiece, 0) == text


def test_a_scoring_plan(wordpiece):
    cross = ClassifierConfig(num_labels=1)
    plan = plan_scoring("cross-encoder", QUERY, DOCS, classifier=cross, tokenizer=wordpiece, max_model_len=64)
    assert (plan.task, plan.num_queries, plan.prompts) == ("classify", 0, [TextPair(QUERY, d) for d in DOCS])
    bi = plan_scoring("bi-encoder", QUERY, DOCS, classifier=None, tokenizer=wordpiece, max_model_len=64)
    assert (bi.task, bi.num_queries, bi.prompts) == ("embed", 1, [QUERY, *DOCS])
    bi_n = plan_scoring("bi-encoder", ["a", "b"], ["c", "d"], classifier=None, tokenizer=wordpiece, max_model_len=64)
    assert (bi_n.num_queries, bi_n.prompts) == (2, ["a", "b", "c", "d"])
    cut = plan_scoring("cross-encoder", QUERY, DOCS[:1], classifier=cross, tokenizer=wordpiece, max_model_len=64,
                       options=ScoreOptions(max_tokens_per_query=2, max_tokens_per_doc=1))
    assert cut.prompts == [TextPair(truncate_text_to_tokens(QUERY, wordpiece, 2),
                                    truncate_text_to_tokens(DOCS[0], wordpiece, 1))]
    assert len(wordpiece(*cut.prompts[0])["input_ids"]) == 2 + 1 + 3  # [CLS] q [SEP] d [SEP]
    for field, value, message in (("max_tokens_per_query", -1, "non-negative"),
                                  ("max_tokens_per_doc", 64, "less than")):
        with pytest.raises(InvalidRequestError, match=message) as info:
            plan_scoring("cross-encoder", "q", "d", classifier=cross, tokenizer=wordpiece, max_model_len=64,
                         options=ScoreOptions(**{field: value}))
        assert info.value.param == field
    with pytest.raises(InvalidRequestError, match="must hold text") as info:
        plan_scoring("cross-encoder", "q", [{"content": []}], classifier=cross, tokenizer=wordpiece, max_model_len=64,
                     names=("query", "documents"))
    assert info.value.param == "documents"
