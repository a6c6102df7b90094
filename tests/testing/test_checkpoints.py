"""build_checkpoint: determinism, dtypes, sharding, config overrides, tokenizer coverage."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from kvserve.errors import CheckpointError
from kvserve.testing.checkpoints import build_checkpoint


def _tensors(folder):
    """All tensors of a checkpoint folder (one file or shards), by name."""
    tensors = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


def test_same_seed_gives_identical_bytes_and_other_seed_differs(tmp_path):
    first = build_checkpoint(tmp_path / "a", seed=3)
    second = build_checkpoint(tmp_path / "b", seed=3)
    other = build_checkpoint(tmp_path / "c", seed=4)
    data = (first / "model.safetensors").read_bytes()
    assert data == (second / "model.safetensors").read_bytes()
    assert data != (other / "model.safetensors").read_bytes()
    assert (first / "config.json").read_text() == (second / "config.json").read_text()


def test_build_does_not_disturb_global_rng(tmp_path):
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    build_checkpoint(tmp_path / "m", seed=0)
    assert torch.equal(torch.rand(4), expected)


@pytest.mark.parametrize(
    "architecture", ["LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"]
)
def test_config_has_tiny_dims_and_tokenizer_ids(checkpoint_factory, architecture):
    folder = checkpoint_factory(architecture)
    config = json.loads((folder / "config.json").read_text())
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    assert config["architectures"] == [architecture]
    assert (config["hidden_size"], config["num_hidden_layers"]) == (64, 2)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (4, 2)
    vocab = tokenizer["model"]["vocab"]
    assert config["vocab_size"] == len(vocab) == 960
    assert vocab["<|begin_of_text|>"] == config["bos_token_id"] == 0
    assert vocab["<|endoftext|>"] == config["eos_token_id"] == 1
    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [1, vocab["<|im_end|>"]] == [1, 3]
    assert (folder / "chat_template.jinja").read_text().startswith("{%- if tools %}")


def test_bf16_weights_are_fp32_weights_rounded(checkpoint_factory):
    fp32 = _tensors(checkpoint_factory("LlamaForCausalLM"))
    bf16 = _tensors(checkpoint_factory("LlamaForCausalLM", dtype="bfloat16"))
    assert fp32.keys() == bf16.keys()
    for name, tensor in bf16.items():
        assert tensor.dtype == torch.bfloat16, name
        assert torch.equal(tensor, fp32[name].to(torch.bfloat16)), name
    folder = checkpoint_factory("LlamaForCausalLM", dtype="bfloat16")
    config = json.loads((folder / "config.json").read_text())
    assert config["dtype"] == config["torch_dtype"] == "bfloat16"


def test_sharded_checkpoint_has_index_covering_all_tensors(checkpoint_factory):
    whole = _tensors(checkpoint_factory("Qwen2ForCausalLM"))
    folder = checkpoint_factory("Qwen2ForCausalLM", max_shard_size="300KB")
    shards = sorted(p.name for p in folder.glob("*.safetensors"))
    assert len(shards) >= 2 and not (folder / "model.safetensors").exists()
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(whole)
    assert set(index["weight_map"].values()) == set(shards)
    for shard in shards:
        for name, tensor in load_file(folder / shard).items():
            assert index["weight_map"][name] == shard
            assert torch.equal(tensor, whole[name])


def test_config_overrides_are_written_in_both_naming_styles(checkpoint_factory):
    folder = checkpoint_factory(
        "MistralForCausalLM",
        rope_scaling={"rope_type": "linear", "factor": 2.0},
        sliding_window=32,
        head_dim=32,
        tie_word_embeddings=True,
    )
    config = json.loads((folder / "config.json").read_text())
    assert config["rope_parameters"] == {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    assert config["rope_scaling"] == {"rope_type": "linear", "factor": 2.0}
    assert config["rope_theta"] == 10000.0
    assert (config["sliding_window"], config["head_dim"]) == (32, 32)
    tensors = _tensors(folder)
    assert "lm_head.weight" not in tensors  # tied: stored once, as the embedding
    assert tensors["model.layers.0.self_attn.q_proj.weight"].shape == (4 * 32, 64)


def test_transformers_loads_the_checkpoint_unchanged(tiny_qwen3):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3)
    state = model.state_dict()
    for name, tensor in _tensors(tiny_qwen3).items():
        assert torch.equal(state[name], tensor), name


@pytest.mark.parametrize(
    ("kind", "vocab_size", "hidden_size", "files"),
    [
        ("sentencepiece", 32768, 64, {"tokenizer.model", "tokenizer.json"}),
        ("tekken", 131072, 32, {"tokenizer.json"}),
    ],
)
def test_real_tokenizers_set_vocab_and_special_ids(checkpoint_factory, kind, vocab_size, hidden_size, files):
    folder = checkpoint_factory("MistralForCausalLM", tokenizer_kind=kind)
    config = json.loads((folder / "config.json").read_text())
    assert (config["vocab_size"], config["hidden_size"]) == (vocab_size, hidden_size)
    assert (config["bos_token_id"], config["eos_token_id"]) == (1, 2)
    assert files <= {p.name for p in folder.iterdir()}
    assert not (folder / "tekken.json").exists()  # would make AutoTokenizer pick mistral_common


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"architecture": "GPT2LMHeadModel"}, "architecture='GPT2LMHeadModel' is not supported"),
        ({"tokenizer_kind": "wordpiece"}, "tokenizer_kind='wordpiece' is not supported"),
        ({"dtype": "int8"}, "dtype='int8' is not supported"),
        ({"vocab_size": 100}, "vocab_size=100 does not cover the bpe tokenizer (960 tokens)"),
    ],
)
def test_bad_arguments_raise_checkpoint_error(tmp_path, kwargs, message):
    with pytest.raises(CheckpointError) as info:
        build_checkpoint(tmp_path / "m", **kwargs)
    assert message in str(info.value)


def test_bpe_training_is_deterministic():
    from kvserve.testing.tokenizer_kinds import build_tokenizer

    train = build_tokenizer.__wrapped__  # the uncached builder
    first, second = train("bpe"), train("bpe")
    assert first.backend_tokenizer.to_str() == second.backend_tokenizer.to_str()
    assert first.backend_tokenizer.to_str() == build_tokenizer("bpe").backend_tokenizer.to_str()
