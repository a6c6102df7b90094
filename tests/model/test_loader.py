"""Checkpoint loading: sharded files, dtypes, tied weights and the errors for broken folders."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from model_fixtures import VARIANTS, flat_prompt_logits, hf_logits, relative_error, save_checkpoint
from safetensors.torch import load_file, save_file

from kvserve.errors import CheckpointError
from kvserve.model.loader import load_model
from kvserve.model.qwen2 import Qwen2ForCausalLM
from kvserve.model.runner import ModelRunner


def copy_of(tiny_checkpoint, tmp_path, variant="llama"):
    path, _ = tiny_checkpoint(variant)
    shutil.copytree(path, tmp_path, dirs_exist_ok=True)
    return tmp_path


def rewrite_weights(folder, edit):
    tensors = load_file(folder / "model.safetensors")
    edit(tensors)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def test_fused_weights_are_hf_tensors_concatenated(tiny_checkpoint):
    path, hf_model = tiny_checkpoint("qwen2")
    loaded = load_model(path)
    assert isinstance(loaded.model, Qwen2ForCausalLM) and loaded.arch.architecture == "Qwen2ForCausalLM"
    ours, ref = loaded.model.model.layers[1], hf_model.model.layers[1]
    attn = ref.self_attn
    assert torch.equal(ours.self_attn.qkv_proj.weight, torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
    assert torch.equal(ours.self_attn.qkv_proj.bias, torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]))
    assert torch.equal(ours.mlp.gate_up_proj.weight, torch.cat([ref.mlp.gate_proj.weight, ref.mlp.up_proj.weight]))
    assert ours.self_attn.o_proj.bias is None
    # Tied embeddings share one tensor.
    assert loaded.model.lm_head.weight.data_ptr() == loaded.model.model.embed_tokens.weight.data_ptr()


def test_untied_lm_head_is_its_own_tensor(tiny_checkpoint):
    path, hf_model = tiny_checkpoint("qwen3")
    model = load_model(path).model
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    assert torch.equal(model.lm_head.weight, hf_model.lm_head.weight)
    assert torch.equal(model.model.layers[0].self_attn.q_norm.weight, hf_model.model.layers[0].self_attn.q_norm.weight)


def test_sharded_checkpoint_loads(tmp_path):
    architecture, overrides = VARIANTS["llama"]
    hf_model = save_checkpoint(tmp_path, architecture, overrides, max_shard_size="50KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    runner = ModelRunner(load_model(tmp_path), num_blocks=8, block_size=16)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    assert relative_error(flat_prompt_logits(runner, [prompt], [[2]])[0], hf_logits(hf_model, prompt)) < 1e-4


@pytest.mark.parametrize(("requested", "expected"), [("auto", torch.bfloat16), ("float32", torch.float32),
                                                     (torch.float16, torch.float16)])
def test_dtype(tiny_checkpoint, requested, expected):
    path, hf_model = tiny_checkpoint("llama", torch.bfloat16)
    loaded = load_model(path, dtype=requested)
    assert loaded.dtype == expected
    assert {p.dtype for p in loaded.model.parameters()} == {expected}
    ref = hf_model.model.norm.weight.to(expected)
    assert torch.equal(loaded.model.model.norm.weight, ref)


def test_bad_dtype(tiny_checkpoint):
    path, _ = tiny_checkpoint("llama")
    with pytest.raises(CheckpointError, match="'int8' is not supported; use 'auto' or one of float32, bfloat16"):
        load_model(path, dtype="int8")


def test_generation_config_read(tiny_checkpoint, tmp_path):
    folder = copy_of(tiny_checkpoint, tmp_path)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 3, "temperature": 0.7}))
    assert load_model(folder).generation_config == {"eos_token_id": 3, "temperature": 0.7}


def test_missing_config(tmp_path):
    with pytest.raises(CheckpointError, match="has no config.json; a Hugging Face model folder holds config.json"):
        load_model(tmp_path)


def test_unknown_architecture_lists_supported(tiny_checkpoint, tmp_path):
    folder = copy_of(tiny_checkpoint, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (folder / "config.json").write_text(json.dumps(config))
    from kvserve.model.registry import supported_architectures

    assert {"LlamaForCausalLM", "MixtralForCausalLM", "Qwen3MoeForCausalLM", "Olmo2ForCausalLM"} <= set(
        supported_architectures())
    with pytest.raises(CheckpointError, match=r"architecture GPT2LMHeadModel .*is not supported; kvserve runs "
                                              + ", ".join(supported_architectures())):
        load_model(folder)


def test_no_safetensors(tiny_checkpoint, tmp_path):
    folder = copy_of(tiny_checkpoint, tmp_path)
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no weights in .*: expected model.safetensors"):
        load_model(folder)


def test_missing_tensor_named(tiny_checkpoint, tmp_path):
    folder = copy_of(tiny_checkpoint, tmp_path)
    rewrite_weights(folder, lambda t: t.pop("model.layers.1.self_attn.k_proj.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensor\(s\): model.layers.1.self_attn.k_proj.weight"):
        load_model(folder)


def test_untied_checkpoint_without_lm_head(tiny_checkpoint, tmp_path):
    folder = copy_of(tiny_checkpoint, tmp_path)
    rewrite_weights(folder, lambda t: t.pop("lm_head.weight"))
    with pytest.raises(CheckpointError, match="lm_head.weight"):
        load_model(folder)


def test_wrong_shape_named(tiny_checkpoint, tmp_path):
    folder = copy_of(tiny_checkpoint, tmp_path)
    rewrite_weights(folder, lambda t: t.update({"model.layers.0.mlp.up_proj.weight": torch.zeros(128, 32)}))
    with pytest.raises(CheckpointError, match=r"'model.layers.0.mlp.up_proj.weight' .* shape \(128, 32\), expected \(128, 64\)"):
        load_model(folder)


def test_unexpected_tensor_rejected_but_inv_freq_ignored(tiny_checkpoint, tmp_path):
    folder = copy_of(tiny_checkpoint, tmp_path)
    rewrite_weights(folder, lambda t: t.update({"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(8)}))
    load_model(folder)
    rewrite_weights(folder, lambda t: t.update({"model.layers.0.extra.weight": torch.ones(8)}))
    with pytest.raises(CheckpointError, match="unexpected tensor 'model.layers.0.extra.weight'"):
        load_model(folder)


def test_shard_listed_in_index_but_absent(tmp_path):
    architecture, overrides = VARIANTS["llama"]
    save_checkpoint(tmp_path, architecture, overrides, max_shard_size="50KB")
    sorted(tmp_path.glob("model-*.safetensors"))[-1].unlink()
    with pytest.raises(CheckpointError, match="shard files that do not exist"):
        load_model(tmp_path)


def test_auto_dtype_without_config_field_uses_stored_tensors(tiny_checkpoint, tmp_path):
    path, _ = tiny_checkpoint("llama", torch.bfloat16)
    shutil.copytree(path, tmp_path, dirs_exist_ok=True)
    config = json.loads((tmp_path / "config.json").read_text())
    config.pop("dtype", None)
    config.pop("torch_dtype", None)
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert load_model(tmp_path).dtype == torch.bfloat16
