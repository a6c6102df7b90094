"""Serving GGUF files (``kvserve.model.gguf_loader``): a file written by kvserve's exporter
(``kvserve.testing.gguf_export``, the one the llama.cpp baselines use) from a random-weight
checkpoint serves the checkpoint's greedy tokens with the same float32 logprob bits at F32 and
F16 (Llama with its q/k rows permuted, Qwen2 with biases and tied embeddings, Qwen3 with q/k
norms); quantized files load the file's integers exactly; the tokenizer and chat template come
from the file; what kvserve does not run is refused in one line."""

from __future__ import annotations

import json
import shutil

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from kvserve import SamplingParams
from kvserve.engine.llm import LLM
from kvserve.errors import CheckpointError
from kvserve.kernels import cpu_kernels_available
from kvserve.model.gguf_names import gguf_name, llama_rotary_order
from kvserve.model.loader import load_model
from kvserve.model.quant_linear import QuantizedLinear
from kvserve.model.stacked_linear import StackedLinear
from kvserve.startup_checks import check_architecture
from kvserve.testing.checkpoints import build_checkpoint
from kvserve.testing.ggml_kquants import q4_k_m_mix
from kvserve.testing.gguf_export import export_gguf
from kvserve.tokenizer import eos_token_ids, load_tokenizer

Q = gguf.GGMLQuantizationType
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=0)
PROMPTS = [[5, 17, 200, 33, 812, 90, 4, 61], [700, 12, 250, 9], [42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52]]
VARIANTS = {
    "llama": ("LlamaForCausalLM", dict(rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "qwen2": ("Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3ForCausalLM", dict(head_dim=32)),
}


def checkpoint(root, variant: str, dtype: str = "float32", **overrides):
    """A random checkpoint with random norms and biases too (all-ones norms would hide a swapped
    name)."""
    architecture, fields = VARIANTS[variant]
    path = build_checkpoint(root / f"{variant}-{dtype}", architecture, "bpe", dtype, seed=3, initializer_range=0.1,
                            **{**fields, **overrides})
    tensors = load_file(path / "model.safetensors")
    generator = torch.Generator().manual_seed(4)
    for name, value in tensors.items():
        if value.dim() == 1:
            tensors[name] = (1 + 0.2 * torch.randn(value.shape, generator=generator)).to(value.dtype)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    return path


def make_llm(model, **kwargs) -> LLM:
    return LLM(str(model), **{**dict(max_model_len=128, num_gpu_blocks_override=64, seed=0, dtype="float32"), **kwargs})


def greedy(llm: LLM) -> list[tuple[list[int], list[float]]]:
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY)
    return [(o.outputs[0].token_ids, [e.logprob for e in o.outputs[0].logprobs]) for o in outputs]


@pytest.mark.parametrize(("variant", "dtype", "outtype"), [
    ("llama", "float32", "f32"), ("qwen2", "float32", "f32"), ("qwen3", "float16", "f16")])
def test_float_gguf_serves_the_checkpoints_bits(tmp_path, variant, dtype, outtype):
    source = checkpoint(tmp_path, variant, dtype)
    path = export_gguf(source, tmp_path / f"model-{outtype}.gguf", outtype)
    ours, reference = make_llm(path), make_llm(source)
    assert ours.llm_engine.core.loaded.arch.architecture == VARIANTS[variant][0]
    assert greedy(ours) == greedy(reference)


def test_without_the_permutation_llama_differs(tmp_path):
    """The q/k rows must be put back (a file written unpermuted loads, and computes other logits)."""
    source = checkpoint(tmp_path, "llama")
    wrong = export_gguf(source, tmp_path / "unpermuted.gguf", "f32", permute=False)
    assert greedy(make_llm(wrong)) != greedy(make_llm(source))


def test_arch_config_from_metadata(tmp_path):
    source = checkpoint(tmp_path, "llama", rms_norm_eps=1e-5, rope_theta=500000.0, num_key_value_heads=1)
    hf = load_model(source).arch
    arch = load_model(export_gguf(source, tmp_path / "m.gguf", "f32")).arch
    for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "rope_theta", "rope_scaling", "max_position_embeddings",
                  "tie_word_embeddings", "attention_bias", "mlp_bias", "bos_token_id"):
        assert getattr(arch, field) == getattr(hf, field), field
    assert arch.rms_norm_eps == pytest.approx(1e-5, rel=1e-7)  # stored as float32
    assert arch.eos_token_ids == (1, 3)  # eos, and end-of-turn as eot


def dequantized(path, name: str, rows: int, heads: int | None = None) -> np.ndarray:
    tensor = next(t for t in gguf.GGUFReader(str(path)).tensors if t.name == name)
    values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(rows, -1)
    return values if heads is None else values[np.argsort(llama_rotary_order(rows, heads))]


def dequantized_checkpoint(path, source, out):
    """``source``'s folder with every tensor replaced by the GGUF file's dequantized values
    (gguf.quants.dequantize, q/k rows of llama files put back): the float model the file holds."""
    shutil.copytree(source, out)
    tensors = load_file(source / "model.safetensors")
    config = json.loads((source / "config.json").read_text())
    for name, value in tensors.items():
        heads = {"q_proj": config["num_attention_heads"], "k_proj": config["num_key_value_heads"]}
        kind = name.split(".")[-2]
        permuted = config["architectures"][0] == "LlamaForCausalLM" and kind in heads
        rows = value.shape[0]
        values = dequantized(path, gguf_name(name), rows, heads[kind] if permuted else None)
        tensors[name] = torch.from_numpy(values.reshape(value.shape).copy()).to(value.dtype)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out


def agreement(ours, reference) -> float:
    """Share of greedy tokens equal to the reference's, each sequence counted up to its first
    difference."""
    same = 0
    for (a, _), (b, _) in zip(ours, reference):
        same += next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
    return same / sum(len(b) for _, b in reference)


def agreements(path, source, tmp_path) -> tuple[float, float]:
    """Greedy agreement of the GGUF file served with (its dequantized weights as a float
    checkpoint, the source checkpoint)."""
    served = greedy(make_llm(path))
    same_model = agreement(served, greedy(make_llm(dequantized_checkpoint(path, source, tmp_path / "deq"))))
    return same_model, agreement(served, greedy(make_llm(source)))


@pytest.mark.skipif(not cpu_kernels_available(), reason="no C++ compiler for the kernels")
@pytest.mark.parametrize(("outtype", "bits", "bound"), [("q8_0", 8, 0.01), ("q4_0", 4, 0.15)])
def test_q8_0_and_q4_0_load_the_files_integers(tmp_path, outtype, bits, bound):
    source = checkpoint(tmp_path, "llama")
    path = export_gguf(source, tmp_path / f"m-{outtype}.gguf", outtype)
    loaded = load_model(path, dtype="float32")
    attn = loaded.model.model.layers[1].self_attn
    assert isinstance(attn.qkv_proj, QuantizedLinear) and attn.qkv_proj.bits == bits
    expected = np.concatenate([dequantized(path, "blk.1.attn_q.weight", 64, 4),
                               dequantized(path, "blk.1.attn_k.weight", 32, 2),
                               dequantized(path, "blk.1.attn_v.weight", 32)])
    assert np.array_equal(attn.qkv_proj.dequantized_weight().numpy(), expected)
    assert np.array_equal(loaded.model.lm_head.dequantized_weight().numpy(), dequantized(path, "output.weight", loaded.arch.vocab_size))
    assert torch.equal(loaded.model.model.embed_tokens.weight, torch.from_numpy(dequantized(path, "token_embd.weight", loaded.arch.vocab_size)))
    float_weight = load_model(source).model.model.layers[1].self_attn.qkv_proj.weight
    error = (attn.qkv_proj.dequantized_weight() - float_weight).norm() / float_weight.norm()
    assert error < bound, error
    assert loaded.weight_format == f"GGUF {outtype.upper()}: {attn.qkv_proj.format()}; LM head {attn.qkv_proj.format()}"
    same_model, share = agreements(path, source, tmp_path)
    print(f"{outtype}: weight error {error:.4f}, greedy agreement with the source {share:.2f}, with the file's "
          f"dequantized weights as a float checkpoint {same_model:.2f}")
    assert same_model >= 0.9
    # Random weights' logits are nearly flat: int4's ~9% weight error changes the first tokens
    # (as --quantization int4's does, docs/benchmarks.md section 5.4); the trained model's
    # perplexity is the quality measure (tests/engine/test_gguf_quality.py).
    if bits == 8:
        assert share >= 0.5


@pytest.mark.skipif(not cpu_kernels_available(), reason="no C++ compiler for the kernels")
def test_q4_k_and_q6_k_mix(tmp_path):
    """q/k in Q4_K and v in Q6_K fill one projection as a StackedLinear of two formats."""
    source = checkpoint(tmp_path, "qwen2", hidden_size=256, intermediate_size=512, head_dim=64)
    path = export_gguf(source, tmp_path / "m-k.gguf", "f32", quantize=q4_k_m_mix)
    loaded = load_model(path, dtype="float32")
    qkv = loaded.model.model.layers[0].self_attn.qkv_proj
    assert isinstance(qkv, StackedLinear) and [p.format() for p in qkv.parts] == [
        "int4 (group 32, zero points)", "int8 (group 16)"]
    assert np.array_equal(qkv.parts[0].dequantized_weight().numpy(), np.concatenate(
        [dequantized(path, "blk.0.attn_q.weight", 256), dequantized(path, "blk.0.attn_k.weight", 128)]))
    assert np.array_equal(qkv.parts[1].dequantized_weight().numpy(), dequantized(path, "blk.0.attn_v.weight", 128))
    assert torch.equal(qkv.parts[1].bias, load_model(source).model.model.layers[0].self_attn.qkv_proj.bias[384:])
    assert loaded.model.model.layers[0].mlp.down_proj.format() == "int8 (group 16)"
    same_model, share = agreements(path, source, tmp_path)
    print(f"Q4_K/Q6_K: greedy agreement with the source {share:.2f}, with the file's dequantized weights as a "
          f"float checkpoint {same_model:.2f}")
    assert same_model >= 0.9


def test_tokenizer_and_chat_template_from_the_file(tmp_path):
    source = checkpoint(tmp_path, "qwen2")
    path = export_gguf(source, tmp_path / "t.gguf", "f16")
    ours, reference = load_tokenizer(path), load_tokenizer(source)
    for text in ("Hello, world! How are you today?", "Numbers: 3.14159 and 2024", "日本語のテキスト 🙂",
                 "<|im_start|>user\nhi<|im_end|>\n", "  two  spaces\n\nnewlines"):
        assert ours.encode(text, add_special_tokens=False) == reference.encode(text, add_special_tokens=False), text
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    assert (ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            == reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    assert eos_token_ids(path, ours) == eos_token_ids(source, reference) == {1, 3}
    llm = make_llm(tmp_path)  # the folder holding one .gguf and no config.json
    assert llm.llm_engine.config.model.quantization.label == "gguf-F16"
    text = llm.chat(messages, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))[0].outputs[0].text
    assert text == make_llm(source).chat(messages, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))[0].outputs[0].text


def test_refusals_name_what_is_unsupported(tmp_path):
    other = gguf.GGUFWriter(str(tmp_path / "gemma.gguf"), "gemma2")
    other.write_header_to_file(), other.write_kv_data_to_file(), other.write_tensors_to_file(), other.close()
    with pytest.raises(CheckpointError, match="GGUF general.architecture 'gemma2' is not supported; kvserve runs "
                                              "llama, qwen2, qwen3 GGUF files"):
        check_architecture(tmp_path / "gemma.gguf")
    source = checkpoint(tmp_path, "llama")
    q5 = export_gguf(source, tmp_path / "q5.gguf", "f32",
                     quantize=lambda n, d: (gguf.quants.quantize(d, Q.Q5_0), Q.Q5_0) if "ffn_up" in n else None)
    with pytest.raises(CheckpointError, match="tensor blk.0.ffn_up.weight has GGML type Q5_0; kvserve reads"):
        load_model(q5)
    with pytest.raises(ValueError, match="--quantization int8 does not apply to the GGUF file q5.gguf"):
        make_llm(q5, quantization="int8")
    with pytest.raises(CheckpointError, match="holds 2 GGUF files \\(gemma.gguf, q5.gguf\\); serve one of them"):
        check_architecture(tmp_path)
    with pytest.raises(CheckpointError, match="GGUF file '.*missing.gguf' does not exist"):
        check_architecture(tmp_path / "missing.gguf")
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert check_architecture(tmp_path) == "LlamaForCausalLM"  # config.json wins over a .gguf beside it
