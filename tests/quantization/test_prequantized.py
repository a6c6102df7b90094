"""GPTQ and AWQ checkpoints (``kvserve.model.prequantized``): written here from known integers by an
independent numpy implementation of the formats (``prequantized_writer``), loaded by kvserve.

- each linear's dequantized weight equals the format's ``scale * (q - zero)`` exactly (GPTQ v1 and
  v2, symmetric and with zero points, act order and not, group sizes 32/64/128/-1; AWQ GEMM), on
  every instruction set of the kernel (each variant library this CPU runs); act-order rows are
  batch-invariant;
- a whole checkpoint loads exactly, and greedy decoding in float32 gives transformers' tokens on
  the dequantized float weights (``transformers`` cannot read GPTQ/AWQ without optimum/gptqmodel,
  which are not installed: the reference is the float model of the format's weights), logprobs
  within float32 summation-order noise;
- the method shows in the label (``/v1/models``, ``/version``), the start-up line, and flags or
  fields kvserve does not load are refused in one line naming them.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch
from prequantized_writer import (pack_along_rows, quantization_config, quantize_linear, torch_reference,
                                 write_prequantized)

from kvserve import SamplingParams
from kvserve.checkpoint_quantization import read_checkpoint_quantization
from kvserve.config import CheckpointQuantization
from kvserve.engine.arg_utils import engine_config_from_kwargs
from kvserve.engine.llm import LLM
from kvserve.errors import CheckpointError
from kvserve.kernels import build, cpu_kernels, cpu_kernels_available, kernels_for_variant
from kvserve.model.loader import load_model
from kvserve.model.prequantized import read_linear
from kvserve.model.quant_linear import QuantizedLinear

pytestmark = pytest.mark.skipif(not cpu_kernels_available(), reason="no C++ compiler for the kernels")

# (method, checkpoint_format, sym, desc_act, group_size, bits)
LINEAR_CASES = [
    ("gptq", "gptq_v2", False, False, 32, 4),
    ("gptq", "gptq_v2", False, True, 64, 4),
    ("gptq", "gptq", True, True, 128, 4),
    ("gptq", "gptq", False, False, -1, 4),
    ("gptq", "gptq_v2", True, False, 32, 4),
    ("gptq", "gptq", True, True, 32, 8),
    ("gptq", "gptq_v2", True, False, -1, 8),
    ("awq", "gemm", False, False, 64, 4),
    ("awq", "gemm", False, False, -1, 4),
]


VARIANTS = [variant.name for variant in build.host_variants()]  # every instruction set this CPU runs


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(("method", "fmt", "sym", "desc_act", "group", "bits"), LINEAR_CASES)
def test_linear_dequantizes_to_the_format_definition(method, fmt, sym, desc_act, group, bits, variant):
    """N = 136 (two 64-column panels and a part), K = 256; the layer's weight is exactly the
    format's, its rows alone equal its rows in a batch, and it computes x @ W^T (up to float32
    summation order)."""
    rng = np.random.default_rng(7)
    w = rng.standard_normal((136, 256)).astype(np.float32)
    packed, w_ref, _ = quantize_linear(w, method, group, desc_act, sym, fmt, rng, bits=bits)
    spec = CheckpointQuantization(method, bits, group, desc_act, sym, fmt)
    tensors = {kind: torch.from_numpy(t) for kind, t in packed.items()}
    weight, perm = read_linear(tensors, spec, "layer", 256, 136)
    assert (perm is not None) == desc_act and weight.symmetric == sym and weight.bits == bits
    x = torch.from_numpy(rng.standard_normal((9, 256)).astype(np.float32))
    layer = QuantizedLinear(weight, None, kernels_for_variant(variant), input_perm=perm)
    assert torch.equal(layer.dequantized_weight(), torch.from_numpy(w_ref))
    out = layer(x)
    assert torch.allclose(out, x @ torch.from_numpy(w_ref).T, rtol=1e-5, atol=1e-4)
    assert all(torch.equal(layer(x[i:i + 1]), out[i:i + 1]) for i in range(9))
    assert torch.equal(layer(x.to(torch.bfloat16))[3:4], layer(x[3:4].to(torch.bfloat16)))


def test_asymmetric_8_bit_is_refused():
    rng = np.random.default_rng(5)
    packed, _, _ = quantize_linear(rng.standard_normal((16, 64)).astype(np.float32), "gptq", 32, False, False,
                                   "gptq_v2", rng, bits=8)
    spec = CheckpointQuantization("gptq", 8, 32, False, False, "gptq_v2")
    with pytest.raises(CheckpointError, match="tensor layer.qzeros: 8-bit zero points other than 128"):
        read_linear({kind: torch.from_numpy(t) for kind, t in packed.items()}, spec, "layer", 64, 16)


def test_gptq_v1_zero_points_are_the_stored_value_plus_one():
    """checkpoint_format gptq (v1) stores zero - 1: a stored 15 is a zero point of 16 (the format's
    definition; AutoGPTQ's and vLLM's v1 reading), exactly representable in the float32 offsets."""
    rng = np.random.default_rng(3)
    scales = rng.uniform(0.01, 0.1, (1, 8)).astype(np.float16)
    q = rng.integers(0, 16, (8, 32))
    packed = {"qweight": torch.from_numpy(pack_along_rows(q.T)), "qzeros": torch.tensor([[-1]], dtype=torch.int32),
              "scales": torch.from_numpy(scales), "g_idx": torch.zeros(32, dtype=torch.int32)}
    spec = CheckpointQuantization("gptq", 4, -1, False, False, "gptq")
    weight, _ = read_linear(packed, spec, "layer", 32, 8)
    expected = (scales.astype(np.float64).T * (q - 16)).astype(np.float32)
    assert torch.equal(QuantizedLinear(weight, None, cpu_kernels()).dequantized_weight(), torch.from_numpy(expected))




# -- whole checkpoints ----------------------------------------------------------------------------

CHECKPOINTS = {
    # name: (architecture, writer arguments)
    "gptq_act_order": ("LlamaForCausalLM", dict(method="gptq", group_size=32, desc_act=True, sym=False)),
    "gptq_v1_sym": ("Qwen2ForCausalLM", dict(method="gptq", group_size=64, sym=True, checkpoint_format="gptq")),
    "awq": ("Qwen2ForCausalLM", dict(method="awq", group_size=32)),
    "gptq_int8": ("LlamaForCausalLM", dict(method="gptq", group_size=-1, desc_act=True, sym=True, bits=8)),
    # With the zero biases older GPTQ writers store for bias-free layers (skipped, as vLLM does).
    "gptq_lm_head": ("LlamaForCausalLM", dict(method="gptq", group_size=64, sym=False, lm_head=True,
                                              extra_bias=0.0)),
}


@pytest.fixture(scope="module")
def prequantized(checkpoint_factory, tmp_path_factory):
    """name -> (quantized folder, float reference folder, reference weights), built once."""
    built = {}

    def get(name: str):
        if name not in built:
            architecture, options = CHECKPOINTS[name]
            source = checkpoint_factory(architecture)
            out, ref = tmp_path_factory.mktemp(name), tmp_path_factory.mktemp(name + "_ref")
            built[name] = (out, ref, torch_reference(write_prequantized(source, out, ref, **options)))
        return built[name]

    return get


@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_checkpoint_loads_every_linear_exactly(prequantized, name):
    out, _, refs = prequantized(name)
    loaded = load_model(out, dtype="float32")
    model = loaded.model
    spec = loaded.quantization.checkpoint
    assert loaded.quantization.method == spec.method == CHECKPOINTS[name][1]["method"]
    for prefix, layer in ((f"model.layers.{i}", model.model.layers[i]) for i in range(2)):
        fused = {"self_attn.qkv_proj": ("q_proj", "k_proj", "v_proj"), "mlp.gate_up_proj": ("gate_proj", "up_proj")}
        for ours, shards in fused.items():
            module = layer.get_submodule(ours)
            parent = ours.rpartition(".")[0]
            assert isinstance(module, QuantizedLinear)
            expected = torch.cat([refs[f"{prefix}.{parent}.{s}"] for s in shards])
            assert torch.equal(module.dequantized_weight(), expected), ours
        for ours in ("self_attn.o_proj", "mlp.down_proj"):
            assert torch.equal(layer.get_submodule(ours).dequantized_weight(), refs[f"{prefix}.{ours}"]), ours
    assert loaded.weight_format.startswith(f"{spec.layout}: int{spec.bits} (")
    if spec.lm_head:
        assert torch.equal(model.lm_head.dequantized_weight(), refs["lm_head"])
        assert loaded.quantization.label == "gptq-int4-g64+lm_head"
        assert loaded.weight_format.endswith("; LM head int4 (group 64, zero points)")
    else:
        assert not isinstance(model.lm_head, QuantizedLinear)
        assert loaded.weight_format.endswith("; LM head float32")


def hf_greedy(ref_dir, prompts, max_tokens):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(ref_dir), dtype=torch.float32).eval()
    results = []
    with torch.no_grad():
        for prompt in prompts:
            out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=max_tokens,
                                 min_new_tokens=max_tokens, pad_token_id=0, output_logits=True,
                                 return_dict_in_generate=True)
            tokens = out.sequences[0, len(prompt):].tolist()
            logprobs = [torch.log_softmax(step[0].float(), -1)[t].item() for step, t in zip(out.logits, tokens)]
            results.append((tokens, logprobs))
    return results


@pytest.mark.parametrize("name", ["gptq_act_order", "awq"])
def test_float32_greedy_matches_the_dequantized_float_model(prequantized, name):
    """kvserve on the quantized folder against transformers on the format's float weights:
    identical tokens; logprobs equal up to float32 summation order (the int4 kernel sums each
    group, then scales: not the float GEMM's order; measured: at most 4.8e-7 apart over 4 prompts x
    32 tokens on each of these checkpoints and 8-bit act-order GPTQ)."""
    out, ref, _ = prequantized(name)
    prompts = [[(5 * i + 2) % 200 + 3 for i in range(21)], [(3 * i + 7) % 200 + 3 for i in range(6)]]
    llm = LLM(str(out), dtype="float32", max_model_len=128, num_gpu_blocks_override=64, seed=0)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=0)
    ours = [(o.outputs[0].token_ids, [e.logprob for e in o.outputs[0].logprobs])
            for o in llm.generate(prompts, params)]
    theirs = hf_greedy(ref, prompts, 12)
    for (tokens, logprobs), (hf_tokens, hf_logprobs) in zip(ours, theirs, strict=True):
        assert list(tokens) == hf_tokens
        assert np.allclose(logprobs, hf_logprobs, rtol=0, atol=1e-5), (logprobs, hf_logprobs)


def test_bfloat16_logprobs_alone_and_batched_equal(prequantized):
    """Act-order GPTQ in bfloat16 (the CPU default with AMX/AVX512-BF16): a request's tokens and
    logprob bits do not depend on the batch it runs in (the permutation is a copy, the kernel's
    sequence is fixed)."""
    out, _, _ = prequantized("gptq_act_order")
    prompts = [[(7 * i + 3) % 200 + 3 for i in range(n)] for n in (5, 17, 30)]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=0)
    llm = LLM(str(out), dtype="bfloat16", max_model_len=128, num_gpu_blocks_override=64, enable_prefix_caching=False)

    def scored(outputs):
        return [(list(o.outputs[0].token_ids), [e.logprob for e in o.outputs[0].logprobs]) for o in outputs]

    solo = [scored(llm.generate([p], params))[0] for p in prompts]
    assert scored(llm.generate(prompts, params)) == solo


def test_label_in_models_version_and_start_up_line(prequantized, caplog):
    """Detected from config.json (as vLLM does): the label /v1/models and /version report (what
    ``kvserve bench`` records as provenance), and the start-up line."""
    import httpx

    from kvserve.testing.live_server import start_live_server

    out, _, _ = prequantized("gptq_act_order")
    config = engine_config_from_kwargs(str(out))
    assert config.model.quantization.label == "gptq-int4-g32-act_order"
    assert engine_config_from_kwargs(str(out), quantization="gptq").model.quantization == config.model.quantization
    awq_dir, _, _ = prequantized("awq")
    assert engine_config_from_kwargs(str(awq_dir)).model.quantization.label == "awq-int4-g32"
    with caplog.at_level(logging.INFO, logger="kvserve.engine.core"):
        server = start_live_server(str(out), dtype="float32", max_model_len=64, num_gpu_blocks_override=16)
    try:
        cards = httpx.get(server.base_url + "/v1/models", headers={"Authorization": f"Bearer {server.api_key}"})
        assert [c["quantization"] for c in cards.json()["data"]] == ["gptq-int4-g32-act_order"]
        assert version_of(server)["quantization"] == "gptq-int4-g32-act_order"
    finally:
        server.stop()
    assert "weights gptq (gptq_v2): int4 (group 32, zero points, act order); LM head float32" in caplog.text


def test_flags_that_contradict_the_checkpoint_are_refused(prequantized, tiny_llama):
    out, _, _ = prequantized("gptq_act_order")
    with pytest.raises(ValueError, match="--quantization awq contradicts the checkpoint: .* quantized with gptq"):
        engine_config_from_kwargs(str(out), quantization="awq")
    with pytest.raises(ValueError, match="--quantization int4 contradicts the checkpoint"):
        engine_config_from_kwargs(str(out), quantization="int4")
    with pytest.raises(ValueError, match="--quantize-lm-head applies to int8/int4 made at load"):
        engine_config_from_kwargs(str(out), quantize_lm_head=True)
    with pytest.raises(ValueError, match="--quantization gptq: .* has no quantization_config in config.json"):
        engine_config_from_kwargs(str(tiny_llama), quantization="gptq")


# -- refusals ------------------------------------------------------------------------------------

REFUSED_FIELDS = [
    (dict(quant_method="fp8"), "quantization_config.quant_method = 'fp8': kvserve loads gptq and awq"),
    (dict(quant_method="bitsandbytes"), "quant_method = 'bitsandbytes'"),
    (dict(bits=3), "quantization_config.bits = 3: kvserve loads 4 and 8-bit gptq checkpoints"),
    (dict(bits=2), "quantization_config.bits = 2"),
    (dict(group_size=0), "quantization_config.group_size = 0"),
    (dict(checkpoint_format="marlin"), "quantization_config.checkpoint_format = 'marlin': kvserve reads GPTQ's own"),
    (dict(pack_dtype="int16"), "quantization_config.pack_dtype = 'int16'"),
    (dict(dynamic={r"+:.*\.18\..*": {"bits": 8}}), r"quantization_config.dynamic = .*per-module"),
    (dict(desc_act="yes"), "quantization_config.desc_act = 'yes': expected bool"),
    (dict(quant_method="awq", version="gemv"), "quantization_config.version = 'gemv': kvserve reads AWQ's GEMM"),
    (dict(quant_method="awq", version="gemv_fast"), "version = 'gemv_fast'"),
    (dict(quant_method="awq", zero_point=False), "quantization_config.zero_point = false"),
    (dict(quant_method="awq", bits=None, w_bit=8), "quantization_config.bits = 8: kvserve loads 4-bit awq"),
]


@pytest.mark.parametrize(("fields", "words"), REFUSED_FIELDS)
def test_unsupported_fields_are_refused_by_name(tmp_path, fields, words):
    stored = {**quantization_config("gptq", 128), **fields}
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"],
                                                      "quantization_config": stored}))
    with pytest.raises(CheckpointError, match=words):
        read_checkpoint_quantization(tmp_path)


def test_gptq_exclusions_and_side_files(tmp_path):
    stored = {**quantization_config("gptq", 128), "dynamic": {r"-:.*\.mlp\..*": {}}}
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": stored}))
    assert read_checkpoint_quantization(tmp_path).group_size == 128
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (tmp_path / "quantize_config.json").write_text(json.dumps({"bits": 4, "group_size": 128}))
    with pytest.raises(CheckpointError, match="quantize_config.json describes a quantized checkpoint but"):
        read_checkpoint_quantization(tmp_path)


@pytest.mark.parametrize(("options", "words"), [
    (dict(desc_act=True, shared_order=False),
     r"tensors model.layers.0.self_attn.q_proj.g_idx and model.layers.0.self_attn.k_proj.g_idx differ"),
    (dict(lm_head=True, declare_lm_head=False),
     "quantization_config.lm_head = false but the checkpoint stores the LM head quantized"),
    (dict(extra_bias=0.5), r"unexpected tensor 'model.layers.0.mlp.down_proj.bias' in model.safetensors"),
])
def test_checkpoints_that_disagree_with_themselves_are_refused(checkpoint_factory, tmp_path, options, words):
    source = checkpoint_factory("LlamaForCausalLM")
    write_prequantized(source, tmp_path / "q", tmp_path / "ref", group_size=32, **options)
    with pytest.raises(CheckpointError, match=words):
        load_model(tmp_path / "q", dtype="float32")


def version_of(server) -> dict:
    """``/version`` with the key: the commit, quantization and engine facts need it."""
    import httpx

    return httpx.get(server.base_url + "/version", headers={"Authorization": f"Bearer {server.api_key}"}).json()
