"""Sequence classifiers and rerankers through the engine against independent references on the
same random weights: transformers' ``*ForSequenceClassification`` with pair tokenization (and
sentence-transformers' ``CrossEncoder``) for BERT / XLM-RoBERTa cross-encoders, transformers'
causal LM's "no" / "yes" logits for the Qwen3-Reranker recipe, its seq-cls classes for decoder
classifiers; float32 logits within 1e-6, the activation as vLLM (sigmoid for one label, softmax
over several); a pair's score bit-identical alone and batched; an embedding model's score the
cosine of its embeddings; the refusals with vLLM's words."""

from __future__ import annotations

import random
import warnings

import pytest
import torch
import torch.nn.functional as F

from pooling_helpers import make_llm, sentence_transformers_reference
from kvserve.errors import InvalidRequestError
from kvserve.pooling.params import PoolingParams
from kvserve.pooling.score_inputs import TextPair
from kvserve.testing.reranker_checkpoints import (QWEN3_RERANKER_OVERRIDES, build_original_reranker,
                                                 build_seq_cls_decoder)

QUERY = "what is the capital of france"
DOCS = ["Paris is the capital of France.", "The quick brown fox jumps over the lazy dog.", "hi",
        "Berlin is the capital of Germany. Rome is in Italy, and numbers 10 100 1000."]
TOLERANCE = 1e-6  # float32: the same network, another summation order
# A decoder classifier's score head (std 0.5 here, so the logits are not near zero) over 2 layers of
# RMSNorm, rotary attention and SwiGLU: measured 1.3e-6 on the seq-cls checkpoint below.
DECODER_TOLERANCE = 4e-6


def _quiet_from_pretrained(cls, folder):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls.from_pretrained(str(folder), dtype=torch.float32).eval()


def _reference_logits(folder, pairs: list[tuple[str, str]], token_types: bool = True) -> list[torch.Tensor]:
    """transformers' sequence classifier on each pair alone, tokenized as a pair."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = _quiet_from_pretrained(AutoModelForSequenceClassification, folder)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    logits = []
    for query, document in pairs:
        encoded = tokenizer(query, document, return_tensors="pt")
        if not token_types:
            encoded.pop("token_type_ids", None)
        with torch.no_grad():
            logits.append(model(**encoded).logits[0])
    return logits


def _scores(llm, query, documents, **kwargs) -> torch.Tensor:
    return torch.tensor([o.outputs.score for o in llm.score(query, documents, use_tqdm=False, **kwargs)])


@pytest.mark.parametrize("model", ["bert_cross_encoder", "xlmr_cross_encoder"])
def test_cross_encoder_scores_equal_transformers_and_cross_encoder(request, model):
    folder = request.getfixturevalue(model)
    llm = make_llm(folder)
    logits = torch.stack(_reference_logits(folder, [(QUERY, d) for d in DOCS]))[:, 0]
    raw = _scores(llm, QUERY, DOCS, pooling_params=PoolingParams(use_activation=False))
    activated = _scores(llm, QUERY, DOCS)
    assert (raw - logits).abs().max().item() <= TOLERANCE
    assert (activated - torch.sigmoid(logits)).abs().max().item() <= TOLERANCE  # one label: sigmoid, as vLLM
    from sentence_transformers import CrossEncoder

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        predicted = CrossEncoder(str(folder), device="cpu").predict([(QUERY, d) for d in DOCS], batch_size=1,
                                                                   convert_to_tensor=True)
    assert (activated - predicted.float().cpu()).abs().max().item() <= TOLERANCE


def test_bert_pairs_carry_their_segment_ids(bert_cross_encoder):
    llm = make_llm(bert_cross_encoder)
    request = llm.llm_engine.input_processor.process_pooling("r", TextPair(QUERY, DOCS[0]), PoolingParams())
    encoded = llm.get_tokenizer()(QUERY, DOCS[0])
    assert request.prompt_token_ids == encoded["input_ids"]
    assert request.token_type_start == encoded["token_type_ids"].index(1)
    raw = _scores(llm, QUERY, DOCS[:1], pooling_params=PoolingParams(use_activation=False))
    one = llm.encode(TextPair(QUERY, DOCS[0]), PoolingParams(use_activation=False), pooling_task="classify",
                     use_tqdm=False)
    assert one[0].outputs.data.tolist() == raw.tolist()
    one_segment = _reference_logits(bert_cross_encoder, [(QUERY, DOCS[0])], token_types=False)[0]
    assert (raw[0] - one_segment[0]).abs().item() > 1e-3  # the segment ids change the logit


def test_several_labels_softmax_and_score_refused(encoder_factory):
    folder = encoder_factory("BertForSequenceClassification", num_labels=3)
    llm = make_llm(folder)
    outputs = llm.classify(DOCS, use_tqdm=False)
    raw = llm.classify(DOCS, PoolingParams(use_activation=False), use_tqdm=False)
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = _quiet_from_pretrained(AutoModelForSequenceClassification, folder)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    for text, out, logits_out in zip(DOCS, outputs, raw, strict=True):
        with torch.no_grad():
            logits = model(**tokenizer(text, return_tensors="pt")).logits[0]
        assert out.outputs.num_classes == 3
        assert (torch.tensor(logits_out.outputs.probs) - logits).abs().max().item() <= TOLERANCE
        assert (torch.tensor(out.outputs.probs) - torch.softmax(logits, -1)).abs().max().item() <= TOLERANCE
    with pytest.raises(InvalidRequestError, match=r"Scoring API is only enabled for num_labels == 1\.") as info:
        llm.score(QUERY, DOCS, use_tqdm=False)
    assert info.value.param == "model"


def _reranker_reference(folder, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """(softmax over the [no, yes] logits at the last position, sigmoid(yes - no)) of
    transformers' causal LM, each text alone."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = _quiet_from_pretrained(AutoModelForCausalLM, folder)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    no, yes = tokenizer.convert_tokens_to_ids(["no", "yes"])
    softmax, sigmoid = [], []
    for text in texts:
        with torch.no_grad():
            last = model(**tokenizer(text, return_tensors="pt")).logits[0, -1]
        softmax.append(torch.softmax(last[[no, yes]], -1)[1])
        sigmoid.append(torch.sigmoid(last[yes] - last[no]))
    return torch.stack(softmax), torch.stack(sigmoid)


@pytest.mark.parametrize("tied", [False, True])
def test_qwen3_reranker_recipe_equals_the_lm_yes_no_softmax(tmp_path, tied):
    folder = build_original_reranker(tmp_path, tie_word_embeddings=tied)
    llm = make_llm(folder, runner="pooling", hf_overrides=QWEN3_RERANKER_OVERRIDES)
    scores = _scores(llm, QUERY, DOCS)
    softmax, sigmoid = _reranker_reference(folder, [QUERY + d for d in DOCS])  # an LLM reranker: no separator
    assert (softmax - sigmoid).abs().max().item() <= TOLERANCE
    assert (scores - softmax).abs().max().item() <= TOLERANCE
    template = ("<Instruct>: {{ instruction | default('Given a web search query, retrieve relevant passages') }}\n"
                "<Query>: {{ (messages | selectattr('role', 'eq', 'query') | first).content }}\n"
                "<Document>: {{ (messages | selectattr('role', 'eq', 'document') | first).content }}")
    templated = _scores(llm, QUERY, DOCS[:2], chat_template=template)
    expected, _ = _reranker_reference(folder, [
        f"<Instruct>: Given a web search query, retrieve relevant passages\n<Query>: {QUERY}\n<Document>: {d}"
        for d in DOCS[:2]])
    assert (templated - expected).abs().max().item() <= TOLERANCE


def test_decoder_classifiers_native_and_converted(tmp_path):
    folder = build_seq_cls_decoder(tmp_path / "seq-cls")
    native = make_llm(folder)
    converted = make_llm(folder, convert="classify", hf_overrides={"architectures": ["Qwen3ForCausalLM"]})
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = _quiet_from_pretrained(AutoModelForSequenceClassification, folder)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    for llm in (native, converted):
        assert llm.llm_engine.input_processor.pooler_config.architecture == "Qwen3ForSequenceClassification"
        for text, out in zip(DOCS, llm.classify(DOCS, PoolingParams(use_activation=False), use_tqdm=False)):
            with torch.no_grad():
                logits = model(**tokenizer(text, return_tensors="pt")).logits[0]
            assert (torch.tensor(out.outputs.probs) - logits).abs().max().item() <= DECODER_TOLERANCE


def _documents(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    words = " ".join(DOCS).split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(1, 30))) for _ in range(count)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("model", ["bert_cross_encoder", "qwen3_reranker"])
def test_a_pairs_score_is_bit_identical_alone_and_batched(request, model, dtype):
    folder = request.getfixturevalue(model)
    extra = dict(runner="pooling", hf_overrides=QWEN3_RERANKER_OVERRIDES) if model == "qwen3_reranker" else {}
    llm = make_llm(folder, dtype=dtype, **extra)
    documents = _documents(6, seed=3) + DOCS
    params = PoolingParams(use_activation=False)
    alone = [llm.score(QUERY, [d], use_tqdm=False, pooling_params=params)[0].outputs.score for d in documents]
    batched = [o.outputs.score for o in llm.score(QUERY, documents, use_tqdm=False, pooling_params=params)]
    reversed_batch = [o.outputs.score for o in llm.score(QUERY, documents[::-1], use_tqdm=False,
                                                         pooling_params=params)][::-1]
    assert alone == batched == reversed_batch


def test_an_embedding_model_scores_the_cosine_of_its_embeddings(bert_cls):
    llm = make_llm(bert_cls)
    scores = _scores(llm, QUERY, DOCS)
    embedded = [torch.tensor(o.outputs.embedding) for o in llm.embed([QUERY, *DOCS], use_tqdm=False)]
    assert scores.tolist() == [F.cosine_similarity(embedded[0], e, dim=0).item() for e in embedded[1:]]
    reference = sentence_transformers_reference(bert_cls, [QUERY, *DOCS])
    expected = torch.stack([F.cosine_similarity(reference[0], e, dim=0) for e in reference[1:]])
    assert (scores - expected).abs().max().item() <= TOLERANCE
    pairs = llm.score([QUERY, DOCS[1]], DOCS[:2], use_tqdm=False)  # N:N
    assert [p.outputs.score for p in pairs] == [F.cosine_similarity(embedded[0], embedded[1], dim=0).item(),
                                                F.cosine_similarity(embedded[2], embedded[2], dim=0).item()]
    tokenizer = llm.get_tokenizer()
    assert pairs[0].prompt_token_ids == tokenizer(QUERY)["input_ids"] + [tokenizer.pad_token_id] + \
        tokenizer(DOCS[0])["input_ids"]


def test_refusals_with_vllms_words(tiny_llama, bert_cls, bert_cross_encoder):
    with pytest.raises(InvalidRequestError, match="does not support the Score API") as info:
        make_llm(tiny_llama).score(QUERY, DOCS, use_tqdm=False)
    assert info.value.param == "model"
    with pytest.raises(InvalidRequestError, match="Classification API is not supported by this model"):
        make_llm(bert_cls).classify(DOCS, use_tqdm=False)
    cross = make_llm(bert_cross_encoder)
    with pytest.raises(InvalidRequestError, match="Embedding API is not supported by this model"):
        cross.embed(DOCS, use_tqdm=False)
    with pytest.raises(InvalidRequestError, match=r"1:1, 1:N or N:N"):
        cross.score([QUERY, QUERY], DOCS, use_tqdm=False)
    with pytest.raises(InvalidRequestError, match="only supports \\['use_activation'\\]") as info:
        cross.classify(DOCS, PoolingParams(dimensions=4), use_tqdm=False)
    assert info.value.param == "dimensions"
    with pytest.raises(ValueError, match="You cannot overwrite"):
        cross.score(QUERY, DOCS, use_tqdm=False, pooling_params=PoolingParams(task="embed"))
