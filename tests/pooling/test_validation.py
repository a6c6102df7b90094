"""A pooling request's checks, made once by the input processor (``kvserve.pooling.validation``),
seen through the offline ``LLM``: Matryoshka ``dimensions`` (vLLM's rules and words, and the
values against sentence-transformers' ``truncate_dim``), ``use_activation``, truncation (text:
the tokenizer's cut, as sentence-transformers' ``max_seq_length``; token ids: by side), empty
and out-of-vocabulary prompts, tasks, and each kind of model refusing the other kind of request."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pooling_helpers import TEXTS, assert_close, embed, make_llm, sentence_transformers_reference
from kvserve import SamplingParams
from kvserve.errors import InvalidRequestError
from kvserve.pooling.params import PoolingParams

MATRYOSHKA = dict(matryoshka_dimensions=[16, 32, 64])


@pytest.fixture(scope="module")
def raw_mean(encoder_factory):
    """BERT, MEAN pooling without Normalize (embeddings not normalised), Matryoshka dimensions."""
    return encoder_factory("BertModel", {"pooling": "mean", "normalize": False}, **MATRYOSHKA)


@pytest.fixture(scope="module")
def raw_llm(raw_mean):
    return make_llm(raw_mean)


def refused(call, param: str, match: str) -> None:
    with pytest.raises(InvalidRequestError, match=match) as info:
        call()
    assert info.value.param == param


def test_matryoshka_dimensions_cut_then_normalise(raw_mean, raw_llm):
    reference = sentence_transformers_reference(raw_mean, TEXTS, truncate_dim=16)
    ours = embed(raw_llm, TEXTS, pooling_params=PoolingParams(dimensions=16, use_activation=True))
    for vector, expected in zip(ours, reference, strict=True):
        assert vector.shape == (16,)
        assert_close(vector, F.normalize(expected, dim=0))
    unnormalised = embed(raw_llm, TEXTS[:1], pooling_params=PoolingParams(dimensions=32))[0]
    assert_close(unnormalised, sentence_transformers_reference(raw_mean, TEXTS[:1], truncate_dim=32)[0])


def test_use_activation_overrides_the_models_default(raw_mean, raw_llm):
    reference = sentence_transformers_reference(raw_mean, TEXTS)
    normalised = embed(raw_llm, TEXTS, pooling_params=PoolingParams(use_activation=True))
    for vector, expected in zip(normalised, reference, strict=True):
        assert_close(vector, F.normalize(expected, dim=0))
        assert abs(vector.norm().item() - 1) < 1e-6


@pytest.mark.parametrize("dimensions, match", [(8, r"only supports Matryoshka dimensions \[16, 32, 64\], got 8"),
                                               (65, r"dimensions in range \[1, 64\], got 65"),
                                               (0, r"dimensions in range \[1, 64\], got 0")])
def test_matryoshka_dimensions_outside_the_models_are_refused(raw_llm, dimensions, match):
    refused(lambda: raw_llm.embed(["x"], PoolingParams(dimensions=dimensions), use_tqdm=False), "dimensions", match)


def test_dimensions_on_a_model_without_matryoshka_are_refused(bert_cls):
    llm = make_llm(bert_cls)
    refused(lambda: llm.embed(["x"], PoolingParams(dimensions=16), use_tqdm=False), "dimensions",
            "does not support Matryoshka embeddings; dimensions must be unset")


def test_text_truncation_keeps_special_tokens_as_sentence_transformers(bert_cls):
    from sentence_transformers import SentenceTransformer

    llm = make_llm(bert_cls)
    st = SentenceTransformer(str(bert_cls), device="cpu")
    st.max_seq_length = 6
    reference = st.encode(TEXTS, batch_size=1, convert_to_tensor=True)
    outputs = llm.embed(TEXTS, truncate_prompt_tokens=6, use_tqdm=False)
    tokenizer = llm.get_tokenizer()
    for text, output, expected in zip(TEXTS, outputs, reference, strict=True):
        ids = tokenizer.encode(text)
        kept = ids if len(ids) <= 6 else ids[:5] + [ids[-1]]  # [CLS] ... [SEP]: the tokenizer's cut
        assert output.prompt_token_ids == kept
        assert_close(torch.tensor(output.outputs.embedding), expected.float())


def test_token_id_truncation_by_side(bert_cls):
    llm = make_llm(bert_cls)
    ids = llm.get_tokenizer().encode(TEXTS[2])
    [right] = llm.embed([ids], truncate_prompt_tokens=5, use_tqdm=False)  # the tokenizer's side: right
    [left] = llm.embed([ids], tokenization_kwargs={"truncate_prompt_tokens": 5, "truncation_side": "left"},
                       use_tqdm=False)
    assert right.prompt_token_ids == ids[:5] and left.prompt_token_ids == ids[-5:]
    assert right.outputs.embedding == llm.embed([ids[:5]], use_tqdm=False)[0].outputs.embedding
    [whole] = llm.embed([ids], truncate_prompt_tokens=-1, use_tqdm=False)
    assert whole.prompt_token_ids == ids


def test_prompt_forms(bert_cls):
    llm = make_llm(bert_cls)
    tokenizer = llm.get_tokenizer()
    text = TEXTS[0]
    outputs = llm.embed([text, {"prompt": text}, {"prompt_token_ids": tokenizer.encode(text)},
                         {"prompt": text, "add_special_tokens": False}], use_tqdm=False)
    assert outputs[0].outputs.embedding == outputs[1].outputs.embedding == outputs[2].outputs.embedding
    assert outputs[3].prompt_token_ids == tokenizer.encode(text, add_special_tokens=False)
    assert outputs[3].outputs.embedding != outputs[0].outputs.embedding


def test_bad_prompts_and_params_are_refused(bert_cls):
    llm = make_llm(bert_cls)
    vocab = llm.llm_engine.vocab_size
    refused(lambda: llm.embed([""], use_tqdm=False), "prompt", "must be provided and non-empty")
    refused(lambda: llm.embed([[]], use_tqdm=False), "prompt", "the prompt is empty")
    refused(lambda: llm.embed([[5, vocab]], use_tqdm=False), "prompt", f"prompt token id {vocab} is outside")
    refused(lambda: llm.embed(["x"], truncate_prompt_tokens=0, use_tqdm=False), "truncate_prompt_tokens", ">= 1")
    refused(lambda: llm.embed(["x"], truncate_prompt_tokens=10_000, use_tqdm=False), "truncate_prompt_tokens",
            "greater than the context length")
    refused(lambda: llm.encode(["x"], pooling_task="classify", use_tqdm=False), "task", "Unsupported task: 'classify'")
    refused(lambda: llm.encode(["x"], pooling_task="score", use_tqdm=False), "task", "`score` task was removed")
    refused(lambda: llm.embed(["x"], PoolingParams(use_activation="yes"), use_tqdm=False), "use_activation",
            "must be true, false or null")
    with pytest.raises(ValueError, match="pooling_task required"):
        llm.encode(["x"])
    with pytest.raises(ValueError, match="tokenization_kwargs"):
        llm.embed(["x"], tokenization_kwargs={"max_length": 3})
    assert not llm.llm_engine.has_unfinished_requests()
    assert len(llm.embed(["still serving"], use_tqdm=False)[0].outputs.embedding) == 64


def test_each_kind_of_model_refuses_the_other_kind_of_request(bert_cls, tiny_llama):
    pooling = make_llm(bert_cls)
    refused(lambda: pooling.generate(["hi"], SamplingParams(max_tokens=2)), "model", "is a pooling model")
    generative = make_llm(tiny_llama, max_model_len=128, num_gpu_blocks_override=32)
    refused(lambda: generative.embed(["hi"], use_tqdm=False), "model", "Try passing `--runner pooling`")
