"""load_tokenizer: which files it reads, what it refuses; eos_token_ids."""

from __future__ import annotations

import json
import shutil

import pytest

from kvserve.errors import CheckpointError
from kvserve.testing.tokenizer_kinds import MISTRAL_TEMPLATE, sentencepiece_model_path, tekken_json_path
from kvserve.tokenizer import eos_token_ids, load_tokenizer

TEXT = "Café 你好 😀 ok"


def test_missing_folder_and_missing_files_raise_checkpoint_error(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist or is not a folder"):
        load_tokenizer(tmp_path / "absent")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError) as info:
        load_tokenizer(tmp_path)
    assert "expected one of tokenizer.json, tokenizer.model, tekken.json" in str(info.value)


def test_unreadable_tokenizer_json_raises_checkpoint_error(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="cannot read the tokenizer"):
        load_tokenizer(tmp_path)


def test_sentencepiece_model_alone_is_converted(tmp_path, tiny_llama_sentencepiece, loaded_tokenizer):
    shutil.copyfile(sentencepiece_model_path(), tmp_path / "tokenizer.model")
    tokenizer = load_tokenizer(tmp_path)
    reference = loaded_tokenizer(tiny_llama_sentencepiece)
    assert len(tokenizer) == 32768
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    assert ids == reference.encode(TEXT, add_special_tokens=False)
    assert tokenizer.decode(ids) == TEXT


def test_tekken_json_beside_tokenizer_json_is_ignored(tmp_path, tiny_mistral_tekken, loaded_tokenizer):
    shutil.copytree(tiny_mistral_tekken, tmp_path / "both")
    shutil.copyfile(tekken_json_path(), tmp_path / "both" / "tekken.json")
    both = load_tokenizer(tmp_path / "both")
    # Not mistral_common's MistralCommonBackend, which AutoTokenizer picks for a tekken.json.
    assert type(both).__name__ == "TokenizersBackend"
    reference = loaded_tokenizer(tiny_mistral_tekken)
    assert both.encode(TEXT, add_special_tokens=False) == reference.encode(TEXT, add_special_tokens=False)
    assert both.chat_template == MISTRAL_TEMPLATE


@pytest.mark.slow
def test_tekken_json_alone_is_converted(tmp_path, tiny_mistral_tekken, loaded_tokenizer):
    shutil.copyfile(tekken_json_path(), tmp_path / "tekken.json")
    alone = load_tokenizer(tmp_path)
    reference = loaded_tokenizer(tiny_mistral_tekken)
    assert alone.encode(TEXT, add_special_tokens=False) == reference.encode(TEXT, add_special_tokens=False)
    assert len(alone) == 131072


def test_chat_template_override_from_string_or_file(tiny_llama, tmp_path):
    template = "{{ messages[0]['content'] }}!"
    assert load_tokenizer(tiny_llama, chat_template=template).chat_template == template
    (tmp_path / "t.jinja").write_text(template)
    assert load_tokenizer(tiny_llama, chat_template=str(tmp_path / "t.jinja")).chat_template == template
    with pytest.raises(CheckpointError, match="chat template file 'nope.jinja' does not exist"):
        load_tokenizer(tiny_llama, chat_template="nope.jinja")
    assert load_tokenizer(tiny_llama).chat_template.startswith("{%- if tools %}")  # not mutated


@pytest.mark.parametrize(
    ("kind", "expected"), [("bpe", {1, 3}), ("sentencepiece", {2}), ("tekken", {2})]
)
def test_eos_token_ids_of_built_checkpoints(checkpoint_factory, loaded_tokenizer, kind, expected):
    folder = checkpoint_factory("MistralForCausalLM", tokenizer_kind=kind)
    assert eos_token_ids(folder, loaded_tokenizer(folder)) == frozenset(expected)


def test_eos_token_ids_union_of_all_sources(tmp_path, tiny_llama, loaded_tokenizer):
    tokenizer = loaded_tokenizer(tiny_llama)  # eos 1
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"eos_token_id": [7, 8]}}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 9}))
    assert eos_token_ids(tmp_path, tokenizer) == frozenset({1, 7, 8, 9})
    assert eos_token_ids(tmp_path / "absent") == frozenset()


def test_declared_class_that_auto_tokenizer_replaces_falls_back_to_the_file(
    tmp_path, checkpoint_factory, loaded_tokenizer
):
    folder = tmp_path / "m"
    shutil.copytree(checkpoint_factory("Qwen2ForCausalLM", tokenizer_kind="sentencepiece"), folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "LlamaTokenizerFast"  # AutoTokenizer still gives Qwen2Tokenizer
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = load_tokenizer(folder)
    assert type(tokenizer).__name__ == "TokenizersBackend"
    reference = loaded_tokenizer(checkpoint_factory("LlamaForCausalLM", tokenizer_kind="sentencepiece"))
    assert tokenizer.encode(TEXT) == reference.encode(TEXT)
