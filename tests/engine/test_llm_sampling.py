"""Sampling through the whole engine: seeds, n, stop strings, logprobs against transformers."""

from __future__ import annotations

import math

import pytest
import torch

from kvserve import SamplingParams
from kvserve.errors import InvalidRequestError
from engine_helpers import assert_kv_clean, make_llm, random_prompts


@pytest.fixture(scope="module")
def llm(model_dir):
    return make_llm(model_dir)


def test_seeded_request_same_alone_and_in_busy_batch(llm):
    prompt = random_prompts(1, seed=11)[0]
    seeded = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=20, seed=1234, ignore_eos=True)
    alone = llm.generate([prompt], seeded)[0].outputs[0].token_ids
    busy_prompts = random_prompts(6, seed=12)
    busy_params = [SamplingParams(temperature=0.8, max_tokens=30, ignore_eos=True) for _ in busy_prompts]
    outs = llm.generate(busy_prompts[:3] + [prompt] + busy_prompts[3:], busy_params[:3] + [seeded] + busy_params[3:])
    assert outs[3].outputs[0].token_ids == alone
    other_seed = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=20, seed=4321, ignore_eos=True)
    assert llm.generate([prompt], other_seed)[0].outputs[0].token_ids != alone
    assert_kv_clean(llm)


def test_n_choices_share_prompt_and_differ(llm):
    prompt = random_prompts(1, seed=13, min_len=40, max_len=40)[0]
    out = llm.generate([prompt], SamplingParams(n=3, temperature=1.0, max_tokens=12, seed=5, ignore_eos=True))[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in out.outputs}) == 3
    assert all(len(c.token_ids) == 12 and c.finish_reason == "length" for c in out.outputs)
    again = llm.generate([prompt], SamplingParams(n=3, temperature=1.0, max_tokens=12, seed=5, ignore_eos=True))[0]
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in out.outputs]
    assert_kv_clean(llm)


def test_stop_string_cuts_text_and_frees_blocks(llm):
    prompt = "The quick brown fox"
    baseline = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))[0].outputs[0]
    text = baseline.text
    assert len(text) >= 8
    stop = text[4:7]
    cut = text[: text.index(stop)]
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop=[stop]))[0].outputs[0]
    assert out.text == cut and out.finish_reason == "stop" and out.stop_reason == stop
    kept = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop=[stop],
                                               include_stop_str_in_output=True))[0].outputs[0]
    assert kept.text == cut + stop
    assert_kv_clean(llm)


def test_stop_token_ids_and_max_tokens(llm):
    prompt = random_prompts(1, seed=14)[0]
    baseline = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))[0].outputs[0]
    stop_id = baseline.token_ids[5]
    first = baseline.token_ids.index(stop_id)
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True,
                                                stop_token_ids=[stop_id]))[0].outputs[0]
    assert out.token_ids == baseline.token_ids[: first + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop_id
    assert baseline.finish_reason == "length"


def test_logprobs_equal_transformers_log_softmax(llm, model_dir):
    from transformers import AutoModelForCausalLM

    prompt = random_prompts(1, seed=15, min_len=20, max_len=20)[0]
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=6, logprobs=3, prompt_logprobs=2,
                                                ignore_eos=True))[0]
    choice = out.outputs[0]
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    full = torch.tensor([prompt + choice.token_ids[:-1]])
    with torch.no_grad():
        ref = torch.log_softmax(reference(full).logits[0].float(), dim=-1)
    for i, lp in enumerate(choice.logprobs):
        row = ref[len(prompt) - 1 + i]
        assert lp.token_id == choice.token_ids[i] == int(row.argmax())
        assert math.isclose(lp.logprob, float(row[lp.token_id]), abs_tol=1e-4)
        assert lp.rank == 1
        assert lp.top_token_ids == row.topk(3).indices.tolist()
    assert math.isclose(choice.cumulative_logprob, sum(lp.logprob for lp in choice.logprobs), abs_tol=1e-6)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
    for pos in range(1, len(prompt)):
        entry, row = out.prompt_logprobs[pos], ref[pos - 1]
        assert entry.token_id == prompt[pos]
        assert math.isclose(entry.logprob, float(row[prompt[pos]]), abs_tol=1e-4)
        assert entry.rank == int((row > row[prompt[pos]]).sum()) + 1
    assert_kv_clean(llm)


def test_max_tokens_must_fit_with_the_prompt(llm):
    """vLLM 0.32's rule: a prompt of 250 tokens in a 256-token context with max_tokens=16 is
    refused in its words; without a cap (``max_tokens=None``) it generates the 6 tokens left and
    finishes with ``length``."""
    near_full = list(range(5, 5 + 250))
    with pytest.raises(InvalidRequestError, match="However, you requested 16 output tokens and your prompt contains "
                                                  "250 input tokens, for a total of 266 tokens"):
        llm.generate([near_full], SamplingParams(max_tokens=16, ignore_eos=True))
    out = llm.generate([near_full], SamplingParams(max_tokens=None, ignore_eos=True))[0].outputs[0]
    assert (len(out.token_ids), out.finish_reason) == (6, "length")
    assert_kv_clean(llm)


def test_invalid_requests_change_nothing(llm):
    full = list(range(5, 5 + 256))
    with pytest.raises(InvalidRequestError, match="maximum context length is 256 tokens. However, your prompt "
                                                  "has 256 tokens, which leaves no room"):
        llm.generate([full], SamplingParams(max_tokens=None))
    with pytest.raises(InvalidRequestError, match="logit_bias"):
        llm.generate(["hi"], SamplingParams(logit_bias={10**6: 1.0}))
    with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
        llm.generate([[10**6]], SamplingParams())
    assert_kv_clean(llm)
    assert llm.generate(["hi"], SamplingParams(max_tokens=3, ignore_eos=True))[0].outputs[0].token_ids


def test_chat_uses_template(llm):
    messages = [{"role": "user", "content": "Hello there"}]
    out = llm.chat(messages, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))[0]
    from kvserve.tokenizer import apply_chat_template

    assert out.prompt_token_ids == apply_chat_template(llm.get_tokenizer(), messages, add_generation_prompt=True)
    assert len(out.outputs[0].token_ids) == 5


def test_n_choices_compute_the_prompt_once(model_dir):
    """The choices of an n > 1 request share their prompt blocks: the first computes them, the
    others wait one step and hit the prefix cache (2 full blocks each of a 40-token prompt)."""
    llm = make_llm(model_dir)
    prompt = random_prompts(1, seed=21, min_len=40, max_len=40)[0]
    before = llm.llm_engine.core.make_stats()
    out = llm.generate([prompt], SamplingParams(n=3, temperature=1.0, max_tokens=4, seed=1, ignore_eos=True))[0]
    after = llm.llm_engine.core.make_stats()
    assert len(out.outputs) == 3
    assert after.prefix_cache_hits - before.prefix_cache_hits == 2 * 32
    assert after.num_scheduled_tokens - before.num_scheduled_tokens == 40 + 2 * 8 + 3 * 3
    assert_kv_clean(llm)


@pytest.mark.parametrize("engine_kwargs", [{"max_num_batched_tokens": 8}, {"max_num_batched_tokens": 8, "block_size": 4}])
def test_prompt_logprobs_of_a_chunked_prompt_equal_one_pass(model_dir, engine_kwargs):
    """Every prompt position is scored exactly once whatever the chunking (a chunk of c..c+n
    scores tokens c+1..c+n)."""
    prompt = random_prompts(1, seed=22, min_len=30, max_len=30)[0]
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=1, ignore_eos=True)
    whole = make_llm(model_dir).generate([prompt], params)[0].prompt_logprobs
    chunked_llm = make_llm(model_dir, **engine_kwargs)
    chunked = chunked_llm.generate([prompt], params)[0].prompt_logprobs
    assert len(whole) == len(chunked) == len(prompt) and whole[0] is None and chunked[0] is None
    for pos in range(1, len(prompt)):
        assert chunked[pos].token_id == whole[pos].token_id == prompt[pos]
        assert chunked[pos].rank == whole[pos].rank
        assert math.isclose(chunked[pos].logprob, whole[pos].logprob, abs_tol=1e-5)
    assert_kv_clean(chunked_llm)


def test_temperature_and_repetition_penalty_beyond_float32_are_refused(llm):
    """The runner holds both in float32, where a larger value is inf: a temperature of 1e39 turned
    the -inf logits of a truncated row into NaN and the request took the argmax every step instead
    of sampling. Refused by name; the largest float32 still samples."""
    prompt = random_prompts(1, seed=16)[0]
    for name in ("temperature", "repetition_penalty"):
        with pytest.raises(InvalidRequestError, match=f"{name} must be at most 3.402823e\\+38") as refused:
            llm.generate([prompt], SamplingParams(**{"max_tokens": 2, "temperature": 1.0, name: 1e39}))
        assert refused.value.param == name
    huge = SamplingParams(temperature=3.4e38, allowed_token_ids=[5, 6], max_tokens=24, seed=3, ignore_eos=True)
    assert set(llm.generate([prompt], huge)[0].outputs[0].token_ids) == {5, 6}
    assert_kv_clean(llm)
