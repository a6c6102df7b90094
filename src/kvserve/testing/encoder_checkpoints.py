"""Small encoder checkpoints with random weights (BERT, XLM-RoBERTa, ModernBERT, and the BERT /
XLM-RoBERTa sequence classifiers: cross-encoders) and sentence-transformers folders, written
offline for the pooling tests.

A folder from :func:`build_encoder_checkpoint` looks like one downloaded from the Hub::

    <path>/
      config.json, model.safetensors        transformers' ``AutoModel.from_config`` under a seed
                                             (``AutoModelForSequenceClassification`` for a
                                             ``*ForSequenceClassification``: its head too)
      tokenizer.json, tokenizer_config.json  WordPiece ([CLS] text [SEP], BERT's ids; a pair
                                             gets segment ids, as BertTokenizerFast) or byte
                                             BPE (<s> text </s>, RoBERTa's ids: <pad> = 1)
      modules.json, 1_Pooling/config.json,   only with ``sentence_transformers=``: the classic
      [2_Normalize/], sentence_bert_config.json   sentence-transformers layout (as on the Hub)

:func:`add_sentence_transformers` writes the sentence-transformers files into any folder (a
decoder's too: Qwen3-Embedding's layout, last-token pooling).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

ENCODERS: dict[str, str] = {
    "BertModel": "BertConfig",
    "XLMRobertaModel": "XLMRobertaConfig",
    "ModernBertModel": "ModernBertConfig",
    "BertForSequenceClassification": "BertConfig",
    "XLMRobertaForSequenceClassification": "XLMRobertaConfig",
}
ENCODER_DIMS: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 128,
}
_CORPUS = """\
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with one step.
Embeddings map text to vectors; similar texts land near each other in the space.
Paris is the capital of France. Berlin is the capital of Germany. Rome is in Italy.
def add(a, b): return a + b. Numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000.
Café, naïve, über, 東京, 你好, привет, مرحبا, emoji 🙂 and more words for the vocabulary.
"""
BERT_SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
ROBERTA_SPECIAL = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")


@functools.lru_cache(maxsize=None)
def build_encoder_tokenizer(kind: str):
    """``wordpiece`` (BERT: [PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3) or ``roberta`` (byte-level BPE:
    <s> 0, <pad> 1, </s> 2, <unk> 3), trained on a small corpus (cached; do not mutate)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if kind == "wordpiece":
        backend = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        backend.normalizer = normalizers.BertNormalizer(lowercase=True)
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        backend.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=400, special_tokens=list(BERT_SPECIAL), show_progress=False)
        backend.train_from_iterator(_CORPUS.splitlines() * 4, trainer)
        backend.post_processor = processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2))
        return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]",
                                       cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
                                       model_input_names=["input_ids", "token_type_ids", "attention_mask"])
    if kind == "roberta":
        backend = Tokenizer(models.BPE())
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        backend.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=list(ROBERTA_SPECIAL), show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        backend.train_from_iterator(_CORPUS.splitlines() * 4, trainer)
        backend.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
        return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                       unk_token="<unk>", cls_token="<s>", sep_token="</s>", mask_token="<mask>")
    raise ValueError(f"unknown encoder tokenizer {kind!r}; allowed: wordpiece, roberta")


def build_encoder_checkpoint(path: str | Path, architecture: str = "BertModel", dtype: str = "float32", seed: int = 0,
                             sentence_transformers: dict[str, Any] | None = None, **overrides: Any) -> Path:
    """Write a tiny random-weight encoder checkpoint to ``path``.

    Args:
        architecture: ``BertModel``, ``BertForSequenceClassification`` and ``ModernBertModel``
            (WordPiece tokenizer) or ``XLMRobertaModel``, ``XLMRobertaForSequenceClassification``
            (RoBERTa's byte BPE, pad id 1); a classifier's labels by ``num_labels=`` (config).
        dtype: stored dtype (float32, bfloat16, float16).
        seed: seed of the weights.
        sentence_transformers: ``add_sentence_transformers``' keyword arguments, or None.
        **overrides: config fields over the tiny defaults (``matryoshka_dimensions``, ...).

    Returns:
        The folder.
    """
    import torch
    import transformers

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    roberta = architecture.startswith("XLMRoberta")
    tokenizer = build_encoder_tokenizer("roberta" if roberta else "wordpiece")
    fields = dict(ENCODER_DIMS, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    if roberta:
        fields.update(bos_token_id=0, eos_token_id=2, max_position_embeddings=ENCODER_DIMS["max_position_embeddings"] + 2,
                      type_vocab_size=1)
    if architecture == "ModernBertModel":
        fields.update(cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id, bos_token_id=2,
                      eos_token_id=3, local_attention=8, global_attn_every_n_layers=2, num_hidden_layers=3)
    fields.update(overrides)
    config = getattr(transformers, ENCODERS[architecture])(**fields)
    config.architectures = [architecture]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        auto = (transformers.AutoModelForSequenceClassification if architecture.endswith("ForSequenceClassification")
                else transformers.AutoModel)
        model = auto.from_config(config, dtype=torch.float32)
        _randomize_norms(model)
    model.to(getattr(torch, dtype)).save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    if sentence_transformers is not None:
        add_sentence_transformers(path, config.hidden_size, **sentence_transformers)
    return path


def _randomize_norms(model) -> None:
    """LayerNorm weights and biases away from their 1 / 0 initialisation (so a test that forgot a
    norm, or its bias, fails), and every other weight with a wider spread than BERT's 0.02."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name.lower():
                param.add_(torch.randn_like(param) * 0.1)
            elif param.dim() >= 2:
                param.normal_(0.0, 0.08)
            else:
                param.normal_(0.0, 0.02)


def add_sentence_transformers(path: str | Path, hidden_size: int, pooling: str = "cls", normalize: bool = True,
                              max_seq_length: int | None = None, do_lower_case: bool = False,
                              classic: bool = True) -> Path:
    """Write sentence-transformers' files into a model folder: ``modules.json`` (Transformer,
    Pooling in ``1_Pooling``, Normalize in ``2_Normalize`` when ``normalize``), the pooling
    module's ``config.json`` (``pooling``: cls, mean or lasttoken; ``classic``: the
    ``pooling_mode_*`` flags of most Hub folders, else sentence-transformers 5's ``pooling_mode``)
    and ``sentence_bert_config.json``. Returns the folder."""
    path = Path(path)
    prefix = "sentence_transformers.models." if classic else "sentence_transformers.sentence_transformer.modules."
    modules = [{"idx": 0, "name": "0", "path": "", "type": prefix + "Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": prefix + "Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": prefix + "Normalize"})
        (path / "2_Normalize").mkdir(exist_ok=True)
    (path / "modules.json").write_text(json.dumps(modules, indent=2))
    (path / "1_Pooling").mkdir(exist_ok=True)
    if classic:
        modes = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens", "lasttoken")
        chosen = {"cls": "cls_token", "mean": "mean_tokens", "lasttoken": "lasttoken"}[pooling]
        pooling_config = {"word_embedding_dimension": hidden_size,
                          **{f"pooling_mode_{m}": m == chosen for m in modes}, "include_prompt": True}
    else:
        pooling_config = {"embedding_dimension": hidden_size, "pooling_mode": pooling, "include_prompt": True}
    (path / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config, indent=2))
    st_config = {"do_lower_case": do_lower_case} | ({} if max_seq_length is None else {"max_seq_length": max_seq_length})
    (path / "sentence_bert_config.json").write_text(json.dumps(st_config, indent=2))
    return path
