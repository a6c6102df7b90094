"""Gemma 2 and 3 (kvserve.model.gemma): config.json as Google publishes it (the fields transformers'
config classes supply filled in as transformers fills them), the multimodal checkpoints served as
their language model under both tensor spellings, and meaningless values refused by name. The text
models' logits and greedy tokens against transformers are in test_model_numerics.py /
test_generate.py (variants ``gemma2``, ``gemma3``, ``gemma3_capped``)."""

from __future__ import annotations

import pytest
import torch
from model_fixtures import _BASE, VARIANTS, flat_prompt_logits, hf_logits, relative_error
from safetensors.torch import load_file, save_file

from kvserve.errors import CheckpointError
from kvserve.model.arch_config import ModelArchConfig
from kvserve.model.gemma import Gemma3ForConditionalGeneration
from kvserve.model.loader import load_model
from kvserve.model.runner import ModelRunner

# google/gemma-3-1b-it's config.json (rope_scaling null, the local theta as rope_local_base_freq,
# no layer_types: transformers derives them from sliding_window_pattern).
GEMMA3_1B = dict(architectures=["Gemma3ForCausalLM"], attention_bias=False, attn_logit_softcapping=None, bos_token_id=2,
                 eos_token_id=[1, 106], final_logit_softcapping=None, head_dim=256,
                 hidden_activation="gelu_pytorch_tanh", hidden_size=1152, intermediate_size=6912,
                 max_position_embeddings=32768, model_type="gemma3_text", num_attention_heads=4,
                 num_hidden_layers=26, num_key_value_heads=1, pad_token_id=0, query_pre_attn_scalar=256,
                 rms_norm_eps=1e-06, rope_local_base_freq=10000, rope_scaling=None, rope_theta=1000000,
                 sliding_window=512, sliding_window_pattern=6, torch_dtype="bfloat16", vocab_size=262144)
# google/gemma-3-4b-it's: a text_config of six fields over transformers' Gemma3TextConfig defaults.
GEMMA3_4B = dict(architectures=["Gemma3ForConditionalGeneration"], boi_token_index=255999, eoi_token_index=256000,
                 eos_token_id=[1, 106], image_token_index=262144, initializer_range=0.02, mm_tokens_per_image=256,
                 model_type="gemma3",
                 text_config=dict(hidden_size=2560, intermediate_size=10240, model_type="gemma3_text",
                                  num_hidden_layers=34, rope_scaling=dict(factor=8.0, rope_type="linear"),
                                  sliding_window=1024),
                 torch_dtype="bfloat16", vision_config=dict(model_type="siglip_vision_model", hidden_size=1152))


def _transformers_text_config(raw: dict):
    import transformers

    fields = {k: v for k, v in raw.items() if k not in ("architectures", "model_type", "torch_dtype")}
    if "text_config" in raw:
        return transformers.Gemma3Config(**fields).text_config
    return transformers.Gemma3TextConfig(**fields)


@pytest.mark.parametrize("raw", [GEMMA3_1B, GEMMA3_4B], ids=["1b", "4b-multimodal"])
def test_published_configs_read_as_transformers_reads_them(raw):
    ref = _transformers_text_config(raw)
    arch = ModelArchConfig.from_dict(raw)
    assert arch.architecture == raw["architectures"][0]
    for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "rms_norm_eps", "max_position_embeddings", "sliding_window"):
        assert getattr(arch, field) == getattr(ref, field), field
    assert arch.hidden_act == ref.hidden_activation == "gelu_pytorch_tanh"
    assert arch.layer_sliding_windows == tuple(ref.sliding_window if t == "sliding_attention" else None
                                               for t in ref.layer_types)
    assert arch.layer_sliding_windows.count(None) == ref.num_hidden_layers // 6  # one full layer in six
    assert arch.rope_theta == ref.rope_parameters["full_attention"]["rope_theta"]
    assert arch.local_rope_theta == ref.rope_parameters["sliding_attention"]["rope_theta"]
    full = ref.rope_parameters["full_attention"]
    if full["rope_type"] == "default":
        assert arch.rope_scaling is None
    else:
        assert (arch.rope_scaling.rope_type, arch.rope_scaling.factor) == (full["rope_type"], full["factor"])
    assert arch.eos_token_ids == (1, 106) and arch.torch_dtype == "bfloat16"
    assert arch.raw["query_pre_attn_scalar"] == ref.query_pre_attn_scalar


@pytest.mark.parametrize(("field", "value", "words"), [
    ("attn_logit_softcapping", 50.0, r"attn_logit_softcapping=50.0 is not supported for Gemma3ForCausalLM \(trans"),
    ("final_logit_softcapping", "30", "final_logit_softcapping must be a positive number or null"),
    ("use_bidirectional_attention", True, "use_bidirectional_attention"),
    ("query_pre_attn_scalar", 0, "query_pre_attn_scalar must be a positive number"),
])
def test_unsupported_switches_are_refused_by_name(field, value, words):
    from kvserve.attention.torch_backend import TorchAttentionBackend

    arch = ModelArchConfig.from_dict({**GEMMA3_1B, "num_hidden_layers": 2, "vocab_size": 64, field: value})
    with pytest.raises(CheckpointError, match=words), torch.device("meta"):
        Gemma3ForConditionalGeneration(arch, TorchAttentionBackend())


# google/gemma-2-2b-it's config.json, less the fields transformers would fill: they are filled as it fills them.
GEMMA2_2B = dict(architectures=["Gemma2ForCausalLM"], model_type="gemma2", hidden_size=2304, intermediate_size=9216,
                 num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                 vocab_size=256000, torch_dtype="float32", eos_token_id=[1, 107])


def test_gemma2_meaningless_caps_are_refused_by_name():
    from kvserve.attention.torch_backend import TorchAttentionBackend
    from kvserve.model.gemma import Gemma2ForCausalLM

    arch = ModelArchConfig.from_dict({**GEMMA2_2B, "num_hidden_layers": 2, "attn_logit_softcapping": -50.0})
    with pytest.raises(CheckpointError, match="attn_logit_softcapping must be a positive number or null, got -50.0"), \
            torch.device("meta"):
        Gemma2ForCausalLM(arch, TorchAttentionBackend())


def test_gemma2_fields_transformers_fills_are_filled_alike():
    import transformers

    ref = transformers.Gemma2Config(**{k: v for k, v in GEMMA2_2B.items() if k not in ("architectures", "model_type")})
    arch = ModelArchConfig.from_dict(GEMMA2_2B)
    assert arch.layer_sliding_windows == tuple(ref.sliding_window if t == "sliding_attention" else None
                                               for t in ref.layer_types)
    assert arch.layer_sliding_windows[:2] == (4096, None) and arch.local_rope_theta is None
    assert arch.rope_theta == ref.rope_parameters["rope_theta"] and arch.rope_scaling is None
    for key in ("attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar"):
        assert arch.raw[key] == getattr(ref, key), key
    assert ModelArchConfig.from_dict({**GEMMA2_2B, "final_logit_softcapping": None}).raw["final_logit_softcapping"] is None


def _multimodal_checkpoint(path):
    """A tiny Gemma3ForConditionalGeneration (a two-layer SigLIP tower) saved by transformers;
    its reference on text-only inputs."""
    import transformers

    _, text = VARIANTS["gemma3"]
    text_config = transformers.Gemma3TextConfig(**{**_BASE, **text})
    vision = transformers.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                             num_attention_heads=2, image_size=28, patch_size=14)
    config = transformers.Gemma3Config(text_config=text_config, vision_config=vision, mm_tokens_per_image=4,
                                       image_token_index=250, boi_token_index=251, eoi_token_index=252)
    torch.manual_seed(0)
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(0.0, 0.2)
    model.save_pretrained(str(path))
    return model


def test_multimodal_checkpoint_serves_its_language_model_under_both_spellings(tmp_path):
    ref = _multimodal_checkpoint(tmp_path)
    names = list(load_file(tmp_path / "model.safetensors"))
    assert any(n.startswith("vision_tower.") for n in names)  # the tower is there and not loaded
    prompts = [[(7 * i + 3) % 240 for i in range(13)], [5, 9, 2, 200, 17]]
    for spelling in ("as published", "as transformers' modules name them"):
        loaded = load_model(tmp_path)
        assert type(loaded.model) is Gemma3ForConditionalGeneration
        runner = ModelRunner(loaded, num_blocks=16, block_size=4)
        ours = flat_prompt_logits(runner, prompts, [[0, 1, 2, 3], [4, 5]])
        for prompt, logits in zip(prompts, ours, strict=True):
            assert relative_error(logits, hf_logits(ref, prompt)) < 1e-4, spelling
        # Then the names of transformers' modules (some fine-tunes store these): model.language_model.*,
        # model.vision_tower.*, model.multi_modal_projector.*
        tensors = load_file(tmp_path / "model.safetensors")
        save_file({n.replace("language_model.model.", "model.language_model.").replace("vision_tower.",
                                                                                       "model.vision_tower.")
                   .replace("multi_modal_projector.", "model.multi_modal_projector."): t
                   for n, t in tensors.items()}, tmp_path / "model.safetensors", metadata={"format": "pt"})


def test_a_tensor_outside_the_tower_is_still_refused(tmp_path):
    _multimodal_checkpoint(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["language_model.model.layers.0.extra.weight"] = torch.zeros(2)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="unexpected tensor 'language_model.model.layers.0.extra.weight'"):
        load_model(tmp_path)
