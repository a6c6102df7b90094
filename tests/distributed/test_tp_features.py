"""Engine features under tensor parallelism, TP 2 against TP 1 on the same checkpoint and flags:

- chunked prefill (``max_num_batched_tokens=8`` splits every prompt into chunks): the same greedy
  tokens, and sampled / prompt logprobs within 1e-5;
- structured outputs (a JSON schema and a regex, greedy and seeded sampling, in one batch with an
  unconstrained request): the same text and tokens. Rank 0 applies the grammar bitmask to the
  gathered logits, so the other ranks never see a grammar;
- LoRA adapters written by ``peft`` (each rank applies its slice): two adapters and the base model
  in one batch give float32 logits within 1e-5 of TP 1 and the same greedy tokens, also after a
  third adapter evicts one from its slot; over HTTP, an adapter of ``--lora-modules`` and one
  loaded at run time (``/v1/load_lora_adapter``) reach both ranks;
- speculative decoding with a draft model: the draft runs whole on rank 0 (the proposer is the
  driver's; its K/V cache uses the target's block ids), the target verifies on every rank; greedy
  output has the bits of TP 2 without speculation, with the target itself as draft (all accepted)
  and with another model (most rejected).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import httpx
import pytest

from kvserve import SamplingParams
from kvserve.engine.llm import LLM
from kvserve.lora.flags import LoRAModulePath
from kvserve.lora.request import LoRARequest
from kvserve.structured_output.params import StructuredOutputsParams
from kvserve.testing.live_server import start_live_server

sys.path.insert(0, str(Path(__file__).parents[1] / "lora"))
from lora_fixtures import AdapterSpec, make_adapter  # noqa: E402

COMMON = dict(max_model_len=256, block_size=16, seed=0, dtype="float32", dist_timeout=60.0,
              num_gpu_blocks_override=64, max_num_batched_tokens=8)
PROMPTS = [[5, 17, 29, 41, 53, 65, 77, 89, 101, 113, 125, 137, 149, 161, 173, 185, 197, 209, 221],
           [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17], [300, 200, 100, 50, 25, 12, 6, 3, 400]]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[a-z]{1,6}$"},
                                           "n": {"type": "integer"}},
          "required": ["name", "n"], "additionalProperties": False}
REGEX = r"[a-c]{2,5}-[0-9]{1,3}"


@pytest.fixture(scope="module")
def engines(tiny_llama):
    """(TP 1, TP 2) with chunked prefill of 8 tokens per step."""
    reference = LLM(str(tiny_llama), tensor_parallel_size=1, **COMMON)
    sharded = LLM(str(tiny_llama), tensor_parallel_size=2, **COMMON)
    yield reference, sharded
    sharded.shutdown()


def run(llm: LLM, prompts, params) -> list[tuple[list[int], list[float], str, list[float]]]:
    outputs = llm.generate(prompts, params)
    return [(o.outputs[0].token_ids, [lp.logprob for lp in o.outputs[0].logprobs], o.outputs[0].text,
             [lp.logprob for lp in (o.prompt_logprobs or [])[1:]]) for o in outputs]


def assert_same(got, want) -> None:
    for (ids, lps, text, prompt_lps), (want_ids, want_lps, want_text, want_prompt_lps) in zip(got, want, strict=True):
        assert ids == want_ids and text == want_text
        assert lps == pytest.approx(want_lps, rel=1e-5, abs=1e-5)
        assert prompt_lps == pytest.approx(want_prompt_lps, rel=1e-5, abs=1e-5)


@pytest.mark.slow
def test_tp2_chunked_prefill_matches_tp1(engines):
    reference, sharded = engines
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=1, prompt_logprobs=1)
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    want = run(reference, prompts, params)
    got = run(sharded, prompts, params)
    assert all(len(ids) == 24 and len(prompt_lps) == len(p) - 1
               for (ids, _, _, prompt_lps), p in zip(got, PROMPTS, strict=True))
    assert_same(got, want)
    sharded.llm_engine.core.kv_cache_manager.check_integrity()


@pytest.mark.slow
def test_tp2_structured_outputs_match_tp1(engines):
    reference, sharded = engines
    json_spec = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)
    regex_spec = StructuredOutputsParams(regex=REGEX)
    params = [SamplingParams(temperature=0.0, max_tokens=32, logprobs=0, structured_outputs=json_spec),
              SamplingParams(temperature=0.0, max_tokens=16, logprobs=0, structured_outputs=regex_spec),
              SamplingParams(temperature=1.0, seed=5, max_tokens=16, logprobs=0, structured_outputs=regex_spec),
              SamplingParams(temperature=0.0, max_tokens=16, logprobs=0, ignore_eos=True)]
    prompts = ["Tell me something", "A name and a number:", "Pick", "Go on"]
    want = run(reference, prompts, params)
    got = run(sharded, prompts, params)
    assert_same(got, want)
    assert re.fullmatch(REGEX, got[1][2]) and re.fullmatch(REGEX, got[2][2])
    assert got[0][2].startswith('{"name"')


def relative_error(got, want) -> float:
    return float((got.float() - want.float()).abs().max() / want.float().abs().max())


@pytest.fixture(scope="module")
def qwen2_adapters(checkpoint_factory, tmp_path_factory):
    """Qwen2 (q/k/v biases) and three adapters covering every module, row- and column-parallel."""
    base = checkpoint_factory("Qwen2ForCausalLM")
    specs = (AdapterSpec(8, "all-linear", use_rslora=True, seed=2),
             AdapterSpec(16, ("o_proj", "gate_proj", "down_proj"), alpha=8, seed=3),
             AdapterSpec(4, ("q_proj", "v_proj", "up_proj"), seed=1))
    loras = []
    for i, spec in enumerate(specs):
        folder = tmp_path_factory.mktemp(f"tp-lora-{i}")
        make_adapter(base, folder, spec)
        loras.append(LoRARequest(f"adapter-{i}", i + 1, str(folder)))
    return base, loras


def lora_run(llm: LLM, loras: list[LoRARequest]):
    """(logits of two prompts with adapters 0 and 1, the same without adapters, greedy results of
    a batch [adapter 0, adapter 1, base], then adapter 2 alone (it evicts a slot: --max-loras 2),
    then adapters 1 and 0 again)."""
    runner = llm.llm_engine.core.runner
    two = [PROMPTS[0], PROMPTS[1]]
    adapted = runner.forward(two, [[1, 2], [3]], lora_requests=loras[:2])
    plain = runner.forward(two, [[1, 2], [3]], lora_requests=[None, None])
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=1)
    results = []
    for prompts, adapters in (([0, 1, 2], [loras[0], loras[1], None]), ([2], [loras[2]]),
                              ([0, 1], [loras[1], loras[0]])):
        outputs = llm.generate([{"prompt_token_ids": PROMPTS[i]} for i in prompts], params, lora_request=adapters)
        results += [(o.outputs[0].token_ids, [lp.logprob for lp in o.outputs[0].logprobs]) for o in outputs]
    return adapted, plain, results


@pytest.mark.slow
def test_tp2_lora_matches_tp1(qwen2_adapters):
    base, loras = qwen2_adapters
    options = dict(COMMON, enable_lora=True, max_loras=2, max_lora_rank=16)
    want_adapted, want_plain, want = lora_run(LLM(str(base), tensor_parallel_size=1, **options), loras)
    sharded = LLM(str(base), tensor_parallel_size=2, **options)
    try:
        got_adapted, got_plain, got = lora_run(sharded, loras)
    finally:
        sharded.shutdown()
    for got_l, want_l, plain in zip(got_adapted, want_adapted, want_plain, strict=True):
        assert relative_error(plain, want_l) > 1e-2  # the adapter matters
        assert relative_error(got_l, want_l) < 1e-5
    for got_l, want_l in zip(got_plain, want_plain, strict=True):
        assert relative_error(got_l, want_l) < 1e-5
    for (ids, lps), (want_ids, want_lps) in zip(got, want, strict=True):
        assert ids == want_ids and len(ids) == 16
        assert lps == pytest.approx(want_lps, rel=1e-5, abs=1e-5)


@pytest.mark.slow
def test_tp2_server_serves_static_and_runtime_loaded_adapters(qwen2_adapters):
    base, loras = qwen2_adapters
    options = dict(dtype="float32", max_model_len=256, num_gpu_blocks_override=64, seed=0, enable_lora=True,
                   max_loras=2, max_lora_rank=16)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    reference = LLM(str(base), **options)
    want = [reference.generate([{"prompt_token_ids": PROMPTS[0]}], params, lora_request=lora)[0].outputs[0].token_ids
            for lora in loras[:2]]
    assert want[0] != want[1]  # the two adapters are told apart
    live = start_live_server(str(base), api_key="", tensor_parallel_size=2, dist_timeout=60.0,
                             settings={"lora_modules": (LoRAModulePath("static", loras[0].lora_path),),
                                       "allow_runtime_lora_updating": True}, **options)

    def complete(model: str) -> httpx.Response:
        body = {"model": model, "prompt": PROMPTS[0], "max_tokens": 8, "temperature": 0, "ignore_eos": True,
                "logprobs": 0, "return_tokens_as_token_ids": True}
        return httpx.post(live.base_url + "/v1/completions", json=body, timeout=60)

    def token_ids(reply: httpx.Response) -> list[int]:
        assert reply.status_code == 200, reply.text
        return [int(t.removeprefix("token_id:")) for t in reply.json()["choices"][0]["logprobs"]["tokens"]]

    try:
        loaded = httpx.post(live.base_url + "/v1/load_lora_adapter",
                            json={"lora_name": "runtime", "lora_path": loras[1].lora_path}, timeout=60)
        assert loaded.status_code == 200, loaded.text
        assert token_ids(complete("static")) == want[0]
        assert token_ids(complete("runtime")) == want[1]
        assert httpx.post(live.base_url + "/v1/unload_lora_adapter", json={"lora_name": "runtime"},
                          timeout=60).status_code == 200
        assert complete("runtime").status_code == 404
        assert token_ids(complete("static")) == want[0]
    finally:
        live.stop()


@pytest.mark.slow
def test_tp2_draft_model_speculation_equals_tp2_plain(tiny_llama, checkpoint_factory):
    other = checkpoint_factory("LlamaForCausalLM", seed=3, num_hidden_layers=1)  # same vocabulary
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=1)
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    results = {}
    for name, draft in (("plain", None), ("self", tiny_llama), ("other", other)):
        spec = None if draft is None else {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 3,
                                           "min_acceptance_rate": 0}
        llm = LLM(str(tiny_llama), tensor_parallel_size=2, speculative_config=spec, **COMMON)
        try:
            results[name] = run(llm, prompts, params)
            stats = llm.llm_engine.core.make_stats().spec_decoding
        finally:
            llm.shutdown()
        if name == "self":
            assert stats.num_draft_tokens > 0 and stats.num_accepted_tokens == stats.num_draft_tokens
        elif name == "other":
            assert stats.num_draft_tokens > stats.num_accepted_tokens
    assert results["self"] == results["plain"]  # token ids and logprob bits
    assert results["other"] == results["plain"]
