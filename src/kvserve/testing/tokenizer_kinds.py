"""The three tokenizer kinds that test checkpoints ship, built offline.

``bpe``
    A byte-level BPE (about 1,000 tokens) trained in-process with ``tokenizers`` on the small
    embedded corpus below (English, accented Latin, CJK, emoji). Its normalizer (NFC),
    pre-tokenizer (Qwen2's split regex, then byte-level without regex) and decoder are exactly the
    ones ``transformers.Qwen2Tokenizer`` rebuilds, because ``AutoTokenizer`` forces that class for
    ``model_type`` ``qwen2``/``qwen3`` and replaces the pre-tokenizer: with this choice the
    ids are the same whichever class loads the files. Special tokens: ``<|begin_of_text|>`` (bos,
    id 0), ``<|endoftext|>`` (eos, pad and unk, id 1), ``<|im_start|>`` (2), ``<|im_end|>`` (3,
    end of turn). ChatML chat template.
``sentencepiece``
    The real SentencePiece model of Mistral-7B-Instruct v0.3 shipped in ``mistral_common``
    (``mistral_instruct_tokenizer_240323.model.v3``, 32,768 pieces, byte fallback), converted
    by ``transformers.LlamaTokenizer`` and corrected to give ``sentencepiece``'s exact ids (see
    ``_match_sentencepiece``). Adds BOS ``<s>`` = 1 when encoding with special tokens, like the
    Llama/Mistral tokenizers; eos ``</s>`` = 2. Mistral chat template.
``tekken``
    The real Tekken tokenizer ``tekken_240911.json`` (131,072 tokens) shipped in
    ``mistral_common``, converted by ``transformers``' Tekken converter to ``tokenizer.json``.
    bos ``<s>`` = 1, eos ``</s>`` = 2. Mistral chat template.

Building a kind is cached per process (training and conversion take up to ~3 s); the cached
tokenizer objects are never mutated, only saved.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

TokenizerKind = Literal["bpe", "sentencepiece", "tekken"]
TOKENIZER_KINDS: tuple[str, ...] = ("bpe", "sentencepiece", "tekken")

# Qwen2's pre-tokenizer regex (transformers.models.qwen2.tokenization_qwen2.PRETOKENIZE_REGEX).
QWEN2_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

BPE_SPECIAL_TOKENS = ("<|begin_of_text|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>")
BPE_VOCAB_SIZE = 1024

CHATML_TEMPLATE = (
    "{%- if tools %}{{ '<|im_start|>system\\nTools: ' + (tools | tojson) + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ raise_exception('Unknown role ' + message['role'] + '; roles must be system, user, "
    "assistant or tool') }}"
    "{%- endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Mistral's v3 instruct format, as mistral_common encodes it: <s>[INST]user[/INST]assistant</s>
# (a system message is its own [INST] block here; mistral_common prepends it to the last user turn).
MISTRAL_TEMPLATE = (
    "{{ bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['role'] in ['system', 'user'] %}{{ '[INST]' + message['content'] + '[/INST]' }}"
    "{%- elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{%- else %}{{ raise_exception('Unknown role ' + message['role'] + '; roles must be "
    "system, user or assistant') }}"
    "{%- endif %}"
    "{%- endfor %}"
)

# Small corpus for the in-session BPE: plain English, accented Latin, CJK, emoji, code, digits.
_CORPUS = """\
The quick brown fox jumps over the lazy dog. A serving engine batches requests together.
Once upon a time there was a little model that wanted to answer every question it was asked.
It read the prompt, computed the keys and values, and wrote them into blocks of the cache.
When the cache was full, the scheduler preempted the youngest request and tried again later.
Hello, world! How are you today? I am fine, thank you. What is the capital of France? Paris.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2024 3.14159 -7 1e-5 50% $20 #1 @user a+b=c x*y/z
def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(i)\n
{"name": "kvserve", "version": "0.1.0", "tags": ["llm", "serving"], "ok": true, "n": null}
Café, naïve, façade, résumé, jalapeño, über, São Paulo, Ærø, Łódź, smörgåsbord, crème brûlée.
Ça va très bien. Él está aquí. Größe, Straße, Übung. Ñandú. Déjà vu. Zürich. Kraków. Dvořák.
你好，世界。今天天气很好。我们一起去公园散步吧。机器学习模型需要大量的数据。
こんにちは世界。東京は日本の首都です。ありがとうございます。
안녕하세요 세계. 감사합니다. Привет, мир! Как дела? Γειά σου κόσμε. مرحبا بالعالم. שלום עולם.
Emoji: 😀 😃 😄 😁 😆 😅 😂 🤣 🚀 🎉 ❤️ 👍 🙏 🔥 ✨ 🌍 🐍 🦀 👨‍👩‍👧‍👦 🇫🇷 🇯🇵
"""


@dataclass(frozen=True)
class TokenizerSpec:
    """Ids a checkpoint's config must agree with.

    Attributes:
        vocab_size: number of token ids the model's embedding must cover.
        bos_token_id: beginning-of-sequence id.
        eos_token_id: end-of-sequence id written to ``config.json``.
        generation_eos_token_ids: ids that end generation, written to ``generation_config.json``
            (eos plus the chat template's end-of-turn token where that differs).
        pad_token_id: padding id, or ``None``.
    """

    vocab_size: int
    bos_token_id: int
    eos_token_id: int
    generation_eos_token_ids: tuple[int, ...]
    pad_token_id: int | None


def mistral_common_data_dir() -> Path:
    """Folder of the tokenizer files shipped in the ``mistral_common`` package."""
    import mistral_common

    return Path(mistral_common.__file__).parent / "data"


def sentencepiece_model_path() -> Path:
    """Path of the SentencePiece ``tokenizer.model`` used by the ``sentencepiece`` kind."""
    return mistral_common_data_dir() / "mistral_instruct_tokenizer_240323.model.v3"


def tekken_json_path() -> Path:
    """Path of the Tekken vocabulary used by the ``tekken`` kind."""
    return mistral_common_data_dir() / "tekken_240911.json"


def _train_bpe():
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE,
        special_tokens=list(BPE_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Repeating the corpus lets merges of rarer scripts (CJK, emoji bytes) reach the vocab.
    backend.train_from_iterator(_CORPUS.splitlines() * 4, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BPE_SPECIAL_TOKENS[0],
        eos_token=BPE_SPECIAL_TOKENS[1],
        pad_token=BPE_SPECIAL_TOKENS[1],
        unk_token=BPE_SPECIAL_TOKENS[1],
        chat_template=CHATML_TEMPLATE,
    )


def _load_sentencepiece():
    import json
    import shutil
    import tempfile

    from tokenizers import Tokenizer
    from transformers import LlamaTokenizer, PreTrainedTokenizerFast

    # LlamaTokenizer converts a folder's tokenizer.model; a bare vocab_file= is not read in v5.
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copyfile(sentencepiece_model_path(), Path(tmp) / "tokenizer.model")
        converted = LlamaTokenizer.from_pretrained(tmp)
    data = _match_sentencepiece(json.loads(converted.backend_tokenizer.to_str()))
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(data)),
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        chat_template=MISTRAL_TEMPLATE,
    )


def _match_sentencepiece(data: dict) -> dict:
    """Make transformers' conversion of the SentencePiece model give SentencePiece's own ids.

    transformers 5's ``LlamaConverter`` output differs from ``sentencepiece`` in three ways,
    each fixed here (checked against ``SentencePieceProcessor.encode`` on random text):

    * merges are ranked by piece id, but SentencePiece BPE merges the highest-*scoring* pair
      first; whitespace runs (``▁▁``, ``▁▁▁``...) have low ids but score -1e9, so runs of spaces
      split differently. Merges are re-ranked by the merged piece's score (ties: by id).
    * its ``Metaspace`` pre-tokenizer adds the dummy ``▁`` prefix only when the text does not
      already start with a space; SentencePiece always adds it. The Llama/Mistral
      ``tokenizer.json`` form (normalizer ``Prepend("▁")`` + ``Replace(" ", "▁")``, no
      pre-tokenizer) always adds it.
    * no BOS is added; SentencePiece Llama/Mistral tokenizers add ``<s>`` (id 1).
    """
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=str(sentencepiece_model_path()))
    rank = {processor.id_to_piece(i): (-processor.get_score(i), i) for i in range(len(processor))}

    def merge_key(merge):
        left, right = merge if isinstance(merge, list) else merge.split(" ")
        return rank[left + right]

    data["model"]["merges"] = sorted(data["model"]["merges"], key=merge_key)
    data["normalizer"] = {
        "type": "Sequence",
        "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        ],
    }
    data["pre_tokenizer"] = None
    bos = {"SpecialToken": {"id": "<s>", "type_id": 0}}
    data["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, bos, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}},
    }
    return data


def _load_tekken():
    from transformers.integrations.mistral.tokenizer import convert_tekken_tokenizer

    return convert_tekken_tokenizer(str(tekken_json_path()), chat_template=MISTRAL_TEMPLATE)


@functools.lru_cache(maxsize=None)
def build_tokenizer(kind: str):
    """The Hugging Face tokenizer of one kind (cached per process; do not mutate it).

    Args:
        kind: ``bpe``, ``sentencepiece`` or ``tekken``.

    Returns:
        A ``transformers`` tokenizer with bos/eos set and a chat template.

    Raises:
        ValueError: for an unknown kind.
    """
    builders = {"bpe": _train_bpe, "sentencepiece": _load_sentencepiece, "tekken": _load_tekken}
    if kind not in builders:
        raise ValueError(f"unknown tokenizer_kind {kind!r}; allowed: {', '.join(TOKENIZER_KINDS)}")
    return builders[kind]()


def tokenizer_spec(kind: str) -> TokenizerSpec:
    """Vocabulary size and special ids of a tokenizer kind (see the module docstring)."""
    tokenizer = build_tokenizer(kind)
    eos = tokenizer.eos_token_id
    generation_eos = (eos,)
    if kind == "bpe":
        generation_eos = (eos, tokenizer.convert_tokens_to_ids("<|im_end|>"))
    return TokenizerSpec(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos,
        generation_eos_token_ids=generation_eos,
        pad_token_id=tokenizer.pad_token_id,
    )
