"""GGUF tensors -> kvserve's forms (``kvserve.model.gguf_tensors``): every supported GGML type is
read exactly (the dequantized bits equal ``gguf.quants.dequantize``'s), quantized ones stay
integers in the quantized GEMM's formats, and other types are refused by name."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kvserve.errors import CheckpointError
from kvserve.kernels import build, cpu_kernels, cpu_kernels_available, kernels_for_variant
from kvserve.model.gguf_names import gguf_name, llama_rotary_order
from kvserve.model.gguf_tensors import read_tensor
from kvserve.model.quant_linear import QuantizedLinear, unpack_quantized
from kvserve.model.quant_tensor import QuantizedTensor
from kvserve.testing.ggml_kquants import encode_q4_k, encode_q6_k

Q = gguf.GGMLQuantizationType


def write_tensors(path, tensors: dict[str, tuple[np.ndarray, Q | None]]):
    """A GGUF file holding ``tensors`` ({name: (data, raw type or None for float32)}); returns
    its ``{name: ReaderTensor}``."""
    writer = gguf.GGUFWriter(str(path), "llama")
    for name, (data, kind) in tensors.items():
        if kind is None:
            writer.add_tensor(name, data)
        else:
            writer.add_tensor(name, data, raw_shape=None if data.dtype == np.uint8 else data.shape, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {t.name: t for t in gguf.GGUFReader(str(path)).tensors}


def random_blocks(rows: int, cols: int, kind: Q, seed: int) -> np.ndarray:
    """Random bytes in ``kind``'s block layout with finite float16 d/dmin (every integer and
    6-bit scale pattern occurs)."""
    block, size = gguf.GGML_QUANT_SIZES[kind]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    d = rng.uniform(-0.02, 0.02, size=(rows, cols // block, 2)).astype(np.float16).view(np.uint8)
    if kind == Q.Q6_K:
        raw[:, :, 208:210] = d[:, :, :2]
    else:
        raw[:, :, 0:2] = d[:, :, :2]
        if kind == Q.Q4_K:
            raw[:, :, 2:4] = np.abs(d[:, :, 2:4].view(np.float16)).view(np.uint8)
    return raw.reshape(rows, -1)


def exact(value: QuantizedTensor | torch.Tensor) -> np.ndarray:
    return (value.dequantize() if isinstance(value, QuantizedTensor) else value.to(torch.float32)).numpy()


@pytest.fixture(scope="module")
def weights():
    rng = np.random.default_rng(0)
    return rng.standard_normal((48, 512)).astype(np.float32) * 0.05


def test_float_types_are_read_as_stored(tmp_path, weights):
    bf16 = ((weights.view(np.uint32) + 0x8000) >> 16).astype(np.uint16)
    tensors = write_tensors(tmp_path / "f.gguf", {
        "a.weight": (weights, None), "b.weight": (weights.astype(np.float16), Q.F16), "c.weight": (bf16, Q.BF16),
        "norm.weight": (weights[0], None)})
    a, b, c = (read_tensor(tensors[n]) for n in ("a.weight", "b.weight", "c.weight"))
    assert a.dtype == torch.float32 and torch.equal(a, torch.from_numpy(weights))
    assert b.dtype == torch.float16 and torch.equal(b, torch.from_numpy(weights.astype(np.float16)))
    assert c.dtype == torch.bfloat16
    assert np.array_equal(exact(c), gguf.quants.dequantize(tensors["c.weight"].data, Q.BF16).reshape(48, 512))
    assert torch.equal(read_tensor(tensors["norm.weight"]), torch.from_numpy(weights[0]))


@pytest.mark.parametrize(("kind", "bits", "group", "symmetric"), [
    (Q.Q8_0, 8, 32, True), (Q.Q4_0, 4, 32, True), (Q.Q4_K, 4, 32, False), (Q.Q6_K, 8, 16, True)])
def test_quantized_types_repack_exactly(tmp_path, weights, kind, bits, group, symmetric):
    """From gguf's own quantizer (Q8_0, Q4_0), ours (Q4_K, Q6_K: gguf has none) and random bytes:
    the QuantizedTensor's dequantized bits are gguf.quants.dequantize's, rows permuted or not."""
    encoders = {Q.Q4_K: encode_q4_k, Q.Q6_K: encode_q6_k}
    encoded = encoders[kind](weights) if kind in encoders else gguf.quants.quantize(weights, kind)
    tensors = write_tensors(tmp_path / "q.gguf", {"enc.weight": (encoded, kind),
                                                  "rnd.weight": (random_blocks(48, 512, kind, seed=1), kind)})
    for name in ("enc.weight", "rnd.weight"):
        reference = gguf.quants.dequantize(tensors[name].data, kind)
        value = read_tensor(tensors[name])
        assert isinstance(value, QuantizedTensor)
        assert (value.bits, value.group_size, value.symmetric) == (bits, group, symmetric)
        assert np.array_equal(exact(value), reference)
        rows = torch.from_numpy(np.argsort(llama_rotary_order(48, 3)))
        assert np.array_equal(exact(read_tensor(tensors[name], rows)), reference[rows.numpy()])
    quality = np.linalg.norm(exact(read_tensor(tensors["enc.weight"])) - weights) / np.linalg.norm(weights)
    assert quality < {Q.Q8_0: 0.01, Q.Q6_K: 0.03, Q.Q4_0: 0.15, Q.Q4_K: 0.15}[kind], quality


@pytest.mark.skipif(not cpu_kernels_available(), reason="no C++ compiler for the kernels")
@pytest.mark.parametrize("variant", [variant.name for variant in build.host_variants()])
@pytest.mark.parametrize("kind", [Q.Q8_0, Q.Q4_0, Q.Q4_K, Q.Q6_K])
def test_quantized_gemm_runs_the_repacked_weights(tmp_path, kind, variant):
    """The kernel's packed panels give back the same QuantizedTensor (float32 Q4_K scales stay
    float32) and compute x W^T of the dequantized weight (to float32 summation order), with the
    same bits on every instruction set this CPU runs (each variant library against this CPU's)."""
    tensors = write_tensors(tmp_path / "k.gguf", {"w.weight": (random_blocks(72, 512, kind, seed=2), kind)})
    weight = read_tensor(tensors["w.weight"])
    kernels, bias, x = kernels_for_variant(variant), torch.randn(72), torch.randn(5, 512)
    expected = F.linear(x.double(), weight.dequantize().double(), bias.double())
    layer = QuantizedLinear(weight, bias, kernels)
    back = unpack_quantized(layer)
    assert back.scales.dtype == weight.scales.dtype and torch.equal(back.dequantize(), weight.dequantize())
    out = layer(x)
    assert torch.allclose(out.double(), expected, rtol=1e-4, atol=1e-4)
    assert torch.equal(out, QuantizedLinear(weight, bias, cpu_kernels())(x))


def test_unsupported_type_is_refused_by_name(tmp_path, weights):
    tensors = write_tensors(tmp_path / "u.gguf", {"blk.0.ffn_up.weight": (gguf.quants.quantize(weights, Q.Q5_0), Q.Q5_0)})
    with pytest.raises(CheckpointError, match="tensor blk.0.ffn_up.weight has GGML type Q5_0; kvserve reads F32, F16, "
                                              "BF16, Q8_0, Q4_0, Q4_K, Q6_K GGUF tensors"):
        read_tensor(tensors["blk.0.ffn_up.weight"])


def test_names_and_rotary_order():
    assert gguf_name("model.layers.3.self_attn.k_proj.bias") == "blk.3.attn_k.bias"
    assert gguf_name("model.layers.0.self_attn.q_norm.weight") == "blk.0.attn_q_norm.weight"
    assert gguf_name("model.layers.1.mlp.down_proj") == "blk.1.ffn_down"
    assert gguf_name("lm_head.weight") == "output.weight"
    with pytest.raises(KeyError, match="no GGUF name for tensor 'model.layers.0.mlp.experts'"):
        gguf_name("model.layers.0.mlp.experts")
    # Head 0 of head_dim 4: HF rows [r0 r1 | r2 r3] (halves rotated together) -> GGUF [r0 r2 r1 r3].
    assert llama_rotary_order(8, 2).tolist() == [0, 2, 1, 3, 4, 6, 5, 7]
