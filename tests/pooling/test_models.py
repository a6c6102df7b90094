"""Embeddings of every pooling kind equal the reference on random-weight checkpoints (float32,
cosine >= 0.99999): sentence-transformers for folders with ``modules.json`` (CLS, MEAN, LAST;
Normalize), transformers' ``AutoModel`` hidden states pooled by hand otherwise (the
architecture's default pooling, normalised). Covers ``kvserve.model.bert`` (BERT, XLM-RoBERTa
with its position offset), ``kvserve.model.modernbert`` (local and global layers) and decoders
adapted by ``--runner pooling`` (Qwen3-Embedding's layout, Llama without sentence-transformers)."""

from __future__ import annotations

import random
import shutil

import pytest
import torch
import torch.nn.functional as F

from pooling_helpers import TEXTS, assert_close, embed, make_llm, sentence_transformers_reference, transformers_hidden
from kvserve.errors import InvalidRequestError
from kvserve.testing.encoder_checkpoints import add_sentence_transformers

ST_CASES = {
    "bert-cls": ("BertModel", {"pooling": "cls"}),
    "xlmr-mean": ("XLMRobertaModel", {"pooling": "mean", "classic": False}),
    "modernbert-mean": ("ModernBertModel", {"pooling": "mean"}),
    "bert-mean-unnormalized": ("BertModel", {"pooling": "mean", "normalize": False}),
}


@pytest.mark.parametrize("case", list(ST_CASES))
def test_encoder_equals_sentence_transformers(encoder_factory, case):
    architecture, st = ST_CASES[case]
    folder = encoder_factory(architecture, st)
    llm = make_llm(folder)
    assert llm.llm_engine.core.loaded.arch.architecture == architecture
    for ours, reference in zip(embed(llm, TEXTS), sentence_transformers_reference(folder, TEXTS), strict=True):
        assert_close(ours, reference)


def test_decoder_last_token_equals_sentence_transformers(qwen3_last):
    llm = make_llm(qwen3_last)  # --runner auto: a sentence-transformers folder is a pooling model
    assert llm.llm_engine.core.pooler_config.pooling_type == "LAST"
    for ours, reference in zip(embed(llm, TEXTS), sentence_transformers_reference(qwen3_last, TEXTS), strict=True):
        assert_close(ours, reference)


def test_decoder_mean_over_prompts_longer_than_the_step_budget(checkpoint_factory, tmp_path):
    shutil.copytree(checkpoint_factory("Qwen3ForCausalLM"), tmp_path, dirs_exist_ok=True)
    add_sentence_transformers(tmp_path, 64, pooling="mean")
    llm = make_llm(tmp_path, max_num_batched_tokens=8)  # raised to max_model_len: prompts run whole
    assert llm.llm_engine.core.config.scheduler.max_num_batched_tokens == llm.llm_engine.max_model_len
    outputs = llm.embed(TEXTS, use_tqdm=False)
    assert max(len(o.prompt_token_ids) for o in outputs) > 8
    for output, reference in zip(outputs, sentence_transformers_reference(tmp_path, TEXTS), strict=True):
        assert_close(torch.tensor(output.outputs.embedding), reference)


def _default_pooled(folder, token_ids: list[int], pooling: str) -> torch.Tensor:
    hidden = transformers_hidden(folder, token_ids)
    return F.normalize(hidden[0] if pooling == "CLS" else hidden[-1], dim=0)


def test_llama_with_runner_pooling_pools_the_last_token(tiny_llama):
    llm = make_llm(tiny_llama, runner="pooling")
    tokenizer = llm.get_tokenizer()
    for text, ours in zip(TEXTS, embed(llm, TEXTS)):
        assert_close(ours, _default_pooled(tiny_llama, tokenizer.encode(text), "LAST"))


def test_modernbert_without_sentence_transformers_pools_cls(encoder_factory):
    folder = encoder_factory("ModernBertModel")
    llm = make_llm(folder)  # --runner auto: an encoder is a pooling model
    config = llm.llm_engine.core.pooler_config
    assert (config.pooling_type, config.use_activation, config.encoder_only) == ("CLS", True, True)
    tokenizer = llm.get_tokenizer()
    long_text = " ".join(TEXTS)  # longer than the local layers' window of 8: both mask kinds matter
    for text, ours in zip([*TEXTS, long_text], embed(llm, [*TEXTS, long_text])):
        assert_close(ours, _default_pooled(folder, tokenizer.encode(text), "CLS"))


def test_xlm_roberta_positions_start_after_the_padding_id(encoder_factory):
    folder = encoder_factory("XLMRobertaModel")  # max_position_embeddings 130, pad_token_id 1
    llm = make_llm(folder)
    assert llm.llm_engine.max_model_len == 128
    rng = random.Random(3)
    full = [0] + [rng.randrange(4, 300) for _ in range(126)] + [2]  # 128 tokens, no padding id inside
    (ours,) = embed(llm, [full])
    assert_close(ours, _default_pooled(folder, full, "CLS"))
    with pytest.raises(InvalidRequestError, match="maximum context length is 128 tokens") as info:
        llm.embed([full + [5]], use_tqdm=False)
    assert info.value.param == "prompt"
