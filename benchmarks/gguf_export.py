"""Convert a Hugging Face Llama or Qwen2 checkpoint folder to GGUF for llama.cpp.

    /tmp/llamacpp-venv/bin/python benchmarks/gguf_export.py /tmp/qwen-shaped /tmp/qwen-shaped/model-bf16.gguf

Runs in the llama.cpp venv (needs only ``numpy`` and the ``gguf`` package, not torch): it reads
``config.json``, ``tokenizer.json`` and the ``*.safetensors`` files itself. llama.cpp's own
``convert_hf_to_gguf.py`` is not installed with llama-cpp-python; this follows its conventions:

- tensor names: ``model.embed_tokens`` -> ``token_embd``, ``layers.N.self_attn.q_proj`` ->
  ``blk.N.attn_q`` (k, v, o -> attn_k, attn_v, attn_output), ``mlp.gate/up/down_proj`` ->
  ``ffn_gate/up/down``, ``input_layernorm`` -> ``attn_norm``, ``post_attention_layernorm`` ->
  ``ffn_norm``, ``model.norm`` -> ``output_norm``, ``lm_head`` -> ``output`` (absent when tied).
- Llama's q/k weights are permuted from Hugging Face's rotate-half layout to llama.cpp's
  interleaved one (``_permute``); Qwen2 GGUFs use NeoX-style rope and need no permutation.
- 1-D tensors (norms, biases) are stored as F32; matrices in ``--outtype`` (bf16, f16 or f32).
- Tokenizer: ``gpt2`` (byte-level BPE) vocab and merges from ``tokenizer.json``, padded with
  ``[PADn]`` tokens of type UNUSED up to the model's ``vocab_size`` (llama.cpp requires the
  token list to match the embedding rows), pre-tokenizer ``qwen2`` (our tokenizers split with
  Qwen2's regex), special tokens as CONTROL.

The conversion is checked against transformers by ``benchmarks/check_gguf.py``.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from pathlib import Path

import numpy as np

ARCHES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}
LAYER_NAMES = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}


def read_safetensors(path: Path) -> dict[str, tuple[str, np.ndarray]]:
    """``{name: (dtype, array)}`` of one safetensors file; BF16 arrays come back as raw uint16.

    Raises:
        ValueError: a dtype other than F32, F16, BF16.
    """
    data = path.read_bytes()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_len])
    base = 8 + header_len
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in SAFETENSORS_DTYPES:
            raise ValueError(f"{path}: tensor {name} has dtype {info['dtype']}; allowed F32, F16, BF16")
        start, end = info["data_offsets"]
        array = np.frombuffer(data, SAFETENSORS_DTYPES[info["dtype"]], (end - start) // 2 if info["dtype"] != "F32"
                              else (end - start) // 4, base + start).reshape(info["shape"])
        tensors[name] = (info["dtype"], array)
    return tensors


def to_float32(dtype: str, array: np.ndarray) -> np.ndarray:
    if dtype == "BF16":
        return (array.astype(np.uint32) << 16).view(np.float32)
    return array.astype(np.float32)


def _permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """HF rotate-half q/k rows -> llama.cpp's interleaved pairs (as convert_hf_to_gguf's
    ``LlamaModel.permute``)."""
    rows = weights.shape[0]
    return (weights.reshape(n_head, 2, rows // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def gguf_name(hf_name: str) -> str:
    """The GGUF tensor name of a Hugging Face tensor name.

    Raises:
        ValueError: a name this converter does not know.
    """
    fixed = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    if hf_name in fixed:
        return fixed[hf_name]
    parts = hf_name.split(".")
    if parts[:2] == ["model", "layers"]:
        layer, rest, kind = parts[2], ".".join(parts[3:-1]), parts[-1]
        if rest in LAYER_NAMES:
            return f"blk.{layer}.{LAYER_NAMES[rest]}.{kind}"
    raise ValueError(f"no GGUF name for tensor {hf_name!r}")


def add_tensors(writer, model_dir: Path, config: dict, arch: str, outtype: str, permute: bool = True) -> None:
    import gguf

    raw = {"bf16": gguf.GGMLQuantizationType.BF16, "f16": gguf.GGMLQuantizationType.F16}
    for file in sorted(model_dir.glob("*.safetensors")):
        for name, (dtype, array) in read_safetensors(file).items():
            data = to_float32(dtype, array)
            if permute and arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
                heads = config["num_attention_heads"] if "q_proj" in name else config["num_key_value_heads"]
                data = _permute(data, heads)
            if data.ndim == 1 or outtype == "f32":
                writer.add_tensor(gguf_name(name), np.ascontiguousarray(data))
            elif outtype == "f16":
                writer.add_tensor(gguf_name(name), data.astype(np.float16), raw_dtype=raw["f16"])
            else:  # round to nearest even, as torch's float32 -> bfloat16
                bits = data.view(np.uint32)
                rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
                writer.add_tensor(gguf_name(name), rounded, raw_shape=data.shape, raw_dtype=raw["bf16"])


def add_metadata(writer, config: dict, outtype: str) -> None:
    import gguf

    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    rope = config.get("rope_parameters") or {}
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(rope.get("rope_theta", config.get("rope_theta", 10000.0))))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    file_types = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                  "bf16": gguf.LlamaFileType.MOSTLY_BF16}
    writer.add_file_type(file_types[outtype])


def add_tokenizer(writer, model_dir: Path, vocab_size: int) -> None:
    """Byte-level BPE vocab and merges from ``tokenizer.json``, padded to ``vocab_size``.

    Raises:
        ValueError: not a BPE ``tokenizer.json``, or more tokens than ``vocab_size``.
    """
    import gguf

    data = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    if data["model"]["type"] != "BPE":
        raise ValueError(f"{model_dir}/tokenizer.json is {data['model']['type']}; only byte-level BPE is converted")
    by_id = {i: tok for tok, i in data["model"]["vocab"].items()}
    special = {t["id"]: t["content"] for t in data.get("added_tokens", [])}
    by_id.update(special)
    if max(by_id) >= vocab_size:
        raise ValueError(f"the tokenizer has id {max(by_id)} but the model's vocab_size is {vocab_size}")
    tokens, types = [], []
    for i in range(vocab_size):
        if i in special:
            tokens.append(special[i]), types.append(gguf.TokenType.CONTROL)
        elif i in by_id:
            tokens.append(by_id[i]), types.append(gguf.TokenType.NORMAL)
        else:
            tokens.append(f"[PAD{i}]"), types.append(gguf.TokenType.UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    config = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    ids = {tok: i for i, tok in special.items()}
    for field, add in (("bos_token", writer.add_bos_token_id), ("eos_token", writer.add_eos_token_id),
                       ("pad_token", writer.add_pad_token_id)):
        if isinstance(config.get(field), str) and config[field] in ids:
            add(ids[config[field]])
    writer.add_add_bos_token(False)


def export_gguf(model_dir: str | Path, out: str | Path, outtype: str = "bf16", permute: bool = True) -> Path:
    """Write ``out`` from the checkpoint folder ``model_dir``; returns ``out``. ``permute=False``
    skips Llama's q/k permutation (only to show, in check_gguf.py, that it is needed).

    Raises:
        ValueError: an architecture other than LlamaForCausalLM / Qwen2ForCausalLM, an unknown
            tensor, or a tokenizer that is not byte-level BPE.
    """
    import gguf

    model_dir, out = Path(model_dir), Path(out)
    config = json.loads((model_dir / "config.json").read_text())
    architecture = config["architectures"][0]
    if architecture not in ARCHES:
        raise ValueError(f"architecture {architecture} is not converted; allowed: {', '.join(ARCHES)}")
    writer = gguf.GGUFWriter(str(out), ARCHES[architecture])
    writer.add_name(model_dir.name)
    add_metadata(writer, config, outtype)
    add_tokenizer(writer, model_dir, config["vocab_size"])
    add_tensors(writer, model_dir, config, ARCHES[architecture], outtype, permute)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Hugging Face Llama/Qwen2 folder -> GGUF")
    p.add_argument("model_dir")
    p.add_argument("out")
    p.add_argument("--outtype", choices=("bf16", "f16", "f32"), default="bf16")
    p.add_argument("--no-permute", action="store_true", help="skip Llama's q/k permutation (a wrong file)")
    args = p.parse_args(argv)
    path = export_gguf(args.model_dir, args.out, args.outtype, permute=not args.no_permute)
    print(f"{path}: {path.stat().st_size / 1e6:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
