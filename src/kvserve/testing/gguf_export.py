"""Convert a Hugging Face Llama/Mistral/Qwen2/Qwen3 checkpoint folder to GGUF (for llama.cpp
baselines and kvserve's GGUF tests).

    python benchmarks/gguf_export.py /tmp/qwen-shaped /tmp/qwen-shaped/model-bf16.gguf [--outtype q8_0]

Runs in kvserve's Python (numpy and the ``gguf`` package; the tensors never go through torch): it
reads ``config.json``, ``tokenizer.json`` and the ``*.safetensors`` files itself. llama.cpp's own ``convert_hf_to_gguf.py`` is not
installed with llama-cpp-python; this follows its conventions:

- tensor names from ``kvserve.model.gguf_names`` (``model.embed_tokens`` -> ``token_embd``,
  ``layers.N.self_attn.q_proj`` -> ``blk.N.attn_q``, ...; ``lm_head`` -> ``output``, absent when
  tied).
- Llama/Mistral (GGUF architecture ``llama``): q/k weights (and biases) permuted from Hugging
  Face's rotate-half layout to llama.cpp's interleaved one; Qwen2/Qwen3 use NeoX-style rope and
  need no permutation.
- 1-D tensors (norms, biases) are stored as F32; matrices in ``--outtype``: f32, f16, bf16, or
  q8_0 / q4_0 (quantized by ``gguf.quants.quantize``, bit-exact with ggml's reference
  quantizers); ``export_gguf(quantize=...)`` may choose another type per tensor (tests build
  Q4_K/Q6_K tensors themselves).
- Tokenizer: ``gpt2`` (byte-level BPE) vocab and merges from ``tokenizer.json``, padded with
  ``[PADn]`` tokens of type UNUSED up to the model's ``vocab_size`` (llama.cpp requires the
  token list to match the embedding rows), pre-tokenizer ``qwen2`` (our tokenizers split with
  Qwen2's regex), special tokens as CONTROL; bos/eos from ``tokenizer_config.json``, the other
  end-of-generation id of ``generation_config.json`` as eot; the chat template as
  ``tokenizer.chat_template``.

The conversion is checked against transformers by ``benchmarks/check_gguf.py`` (llama.cpp) and
``tests/model/test_gguf_serving.py`` (kvserve).
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from pathlib import Path
from typing import Callable

import numpy as np

from kvserve.model.gguf_names import gguf_name, llama_rotary_order

ARCHES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
          "Qwen3ForCausalLM": "qwen3"}
OUTTYPES = ("bf16", "f16", "f32", "q8_0", "q4_0")
SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}
# (name, float32 matrix) -> (data to write, GGMLQuantizationType) or None for --outtype's choice.
Quantizer = Callable[[str, np.ndarray], "tuple[np.ndarray, object] | None"]


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


def _rotary_heads(name: str, config: dict) -> int | None:
    """Heads of a q/k projection tensor (llama.cpp permutes these), else None."""
    if ".q_proj." in name:
        return config["num_attention_heads"]
    if ".k_proj." in name:
        return config["num_key_value_heads"]
    return None


def _encode(data: np.ndarray, outtype: str):
    """(data, raw_dtype or None) of a matrix in ``outtype``."""
    import gguf

    kinds = gguf.GGMLQuantizationType
    if outtype == "f32":
        return np.ascontiguousarray(data), None
    if outtype == "f16":
        return data.astype(np.float16), kinds.F16
    if outtype == "bf16":  # round to nearest even, as torch's float32 -> bfloat16
        bits = data.view(np.uint32)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16), kinds.BF16
    kind = kinds.Q8_0 if outtype == "q8_0" else kinds.Q4_0
    return gguf.quants.quantize(np.ascontiguousarray(data), kind), kind


def add_tensors(writer, model_dir: Path, config: dict, arch: str, outtype: str, permute: bool = True,
                quantize: Quantizer | None = None) -> None:
    for file in sorted(model_dir.glob("*.safetensors")):
        for name, (dtype, array) in read_safetensors(file).items():
            data = to_float32(dtype, array)
            heads = _rotary_heads(name, config)
            if permute and arch == "llama" and heads is not None:
                data = np.ascontiguousarray(data[llama_rotary_order(data.shape[0], heads)])
            target = gguf_name(name)
            if data.ndim == 1:
                writer.add_tensor(target, np.ascontiguousarray(data))
                continue
            encoded = quantize(target, data) if quantize is not None else None
            data, raw_dtype = encoded if encoded is not None else _encode(data, outtype)
            if raw_dtype is None:
                writer.add_tensor(target, data)
            else:
                writer.add_tensor(target, data, raw_shape=None if data.dtype == np.uint8 else data.shape,
                                  raw_dtype=raw_dtype)


def add_metadata(writer, config: dict, outtype: str) -> None:
    import gguf

    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    rope = {**(config.get("rope_scaling") or {}), **(config.get("rope_parameters") or {})}
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
    if rope.get("rope_type", rope.get("type")) == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(rope["factor"]))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    file_types = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                  "bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
                  "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}
    writer.add_file_type(file_types[outtype])


def add_tokenizer(writer, model_dir: Path, vocab_size: int) -> None:
    """Byte-level BPE vocab and merges from ``tokenizer.json``, padded to ``vocab_size``; special
    token ids and the chat template.

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
    _add_special_tokens(writer, model_dir, {tok: i for i, tok in special.items()})
    writer.add_add_bos_token(False)
    template = _chat_template(model_dir)
    if template is not None:
        writer.add_chat_template(template)


def _add_special_tokens(writer, model_dir: Path, ids: dict[str, int]) -> None:
    config = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    found = {}
    for field, add in (("bos_token", writer.add_bos_token_id), ("eos_token", writer.add_eos_token_id),
                       ("pad_token", writer.add_pad_token_id)):
        if isinstance(config.get(field), str) and config[field] in ids:
            found[field] = ids[config[field]]
            add(found[field])
    generation = model_dir / "generation_config.json"
    eos = json.loads(generation.read_text()).get("eos_token_id") if generation.is_file() else None
    others = [i for i in (eos if isinstance(eos, list) else []) if i != found.get("eos_token")]
    if others:
        writer.add_eot_token_id(others[0])


def _chat_template(model_dir: Path) -> str | None:
    path = model_dir / "chat_template.jinja"
    if path.is_file():
        return path.read_text(encoding="utf-8")
    config = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    return config.get("chat_template") if isinstance(config.get("chat_template"), str) else None


def export_gguf(model_dir: str | Path, out: str | Path, outtype: str = "bf16", permute: bool = True,
                quantize: Quantizer | None = None) -> Path:
    """Write ``out`` from the checkpoint folder ``model_dir``; returns ``out``. ``permute=False``
    skips Llama's q/k permutation (only to show, in check_gguf.py, that it is needed);
    ``quantize(gguf_name, float32 matrix)`` may return ``(data, GGMLQuantizationType)`` for a
    matrix (None: ``outtype``).

    Raises:
        ValueError: an architecture other than those of ``ARCHES``, an unknown ``outtype`` or
            tensor, or a tokenizer that is not byte-level BPE.
    """
    import gguf

    model_dir, out = Path(model_dir), Path(out)
    if outtype not in OUTTYPES:
        raise ValueError(f"outtype {outtype!r} is not written; allowed: {', '.join(OUTTYPES)}")
    config = json.loads((model_dir / "config.json").read_text())
    architecture = config["architectures"][0]
    if architecture not in ARCHES:
        raise ValueError(f"architecture {architecture} is not converted; allowed: {', '.join(ARCHES)}")
    writer = gguf.GGUFWriter(str(out), ARCHES[architecture])
    writer.add_name(model_dir.name)
    add_metadata(writer, config, outtype)
    add_tokenizer(writer, model_dir, config["vocab_size"])
    add_tensors(writer, model_dir, config, ARCHES[architecture], outtype, permute, quantize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Hugging Face Llama/Mistral/Qwen2/Qwen3 folder -> GGUF")
    p.add_argument("model_dir")
    p.add_argument("out")
    p.add_argument("--outtype", choices=OUTTYPES, default="bf16")
    p.add_argument("--no-permute", action="store_true", help="skip Llama's q/k permutation (a wrong file)")
    args = p.parse_args(argv)
    path = export_gguf(args.model_dir, args.out, args.outtype, permute=not args.no_permute)
    print(f"{path}: {path.stat().st_size / 1e6:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
