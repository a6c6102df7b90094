"""vLLM's sampling extensions through the whole engine, against transformers' logits (float32):
``allowed_token_ids``, ``bad_words`` and ``truncate_prompt_tokens``."""

from __future__ import annotations

import pytest
import torch

from kvserve import SamplingParams
from kvserve.errors import InvalidRequestError
from kvserve.testing.reference import bad_words_ban, reference_greedy, single_token_word, vllm_bad_word_sequences
from engine_helpers import assert_kv_clean, make_llm, random_prompts

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def llm(model_dir):
    return make_llm(model_dir)


@pytest.fixture(scope="module")
def reference(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def greedy(max_tokens: int, **extra) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, **extra)


def test_allowed_token_ids_greedy_is_the_argmax_over_them(llm, reference):
    prompt = random_prompts(1, seed=31, min_len=12, max_len=12)[0]
    allowed = [7, 123, 256, 400, 512, 801]
    vocab = range(llm.llm_engine.vocab_size)
    ours = llm.generate([prompt], greedy(10, allowed_token_ids=allowed))[0].outputs[0].token_ids
    expected = reference_greedy(reference, prompt, 10, lambda _: set(vocab) - set(allowed))
    assert ours == expected
    free = llm.generate([prompt], greedy(10))[0].outputs[0].token_ids
    assert any(t not in allowed for t in free)  # so the restriction did something
    assert_kv_clean(llm)


def test_allowed_token_ids_random_and_beside_unrestricted(llm):
    prompts = random_prompts(3, seed=32)
    allowed = [11, 12, 13]
    params = [SamplingParams(temperature=1.0, max_tokens=16, seed=s, ignore_eos=True,
                             allowed_token_ids=allowed if s % 2 == 0 else None) for s in range(3)]
    outs = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert set(outs[0]) <= set(allowed) and set(outs[2]) <= set(allowed)
    assert not set(outs[1]) <= set(allowed)
    alone = llm.generate([prompts[1]], params[1])[0].outputs[0].token_ids
    assert outs[1] == alone  # the unrestricted row is unchanged by its neighbours' masks


def two_token_word(tokenizer, token_ids):
    """The first two generated tokens whose text encodes back to exactly them."""
    for position in range(len(token_ids) - 1):
        pair = token_ids[position:position + 2]
        text = tokenizer.decode(pair)
        if "\ufffd" not in text and text == text.lstrip() and tokenizer.encode(text, add_special_tokens=False) == pair:
            return position, text
    raise AssertionError(f"no two-token word in {token_ids}")


@pytest.mark.parametrize("find_word", [single_token_word, two_token_word], ids=["one-token", "two-token"])
def test_bad_words_never_generated_and_the_rest_is_greedy(llm, reference, find_word):
    tokenizer = llm.get_tokenizer()
    prompt = tokenizer.encode(PROMPT)
    free = llm.generate([prompt], greedy(24))[0].outputs[0]
    position, word = find_word(tokenizer, free.token_ids)
    sequences = vllm_bad_word_sequences(tokenizer, word)
    out = llm.generate([prompt], greedy(24, bad_words=[word]))[0].outputs[0]
    for sequence in sequences:
        n = len(sequence)
        assert not any(out.token_ids[i:i + n] == sequence for i in range(len(out.token_ids)))
    assert any(free.token_ids[i:i + len(sequences[0])] == sequences[0] for i in range(24))  # without: there
    assert out.token_ids[:position + len(sequences[0]) - 1] == free.token_ids[:position + len(sequences[0]) - 1]
    assert out.token_ids == reference_greedy(reference, prompt, 24, bad_words_ban(sequences))
    assert_kv_clean(llm)


def test_blank_bad_word_is_refused(llm):
    with pytest.raises(InvalidRequestError) as info:
        llm.generate(["hi"], SamplingParams(bad_words=[" "]))
    assert info.value.param == "bad_words"
    assert_kv_clean(llm)


def test_truncate_prompt_tokens_equals_the_truncated_prompt(llm):
    prompt = random_prompts(1, seed=33, min_len=40, max_len=40)[0]
    cut = llm.generate([prompt], greedy(8, truncate_prompt_tokens=17, prompt_logprobs=0))[0]
    direct = llm.generate([prompt[-17:]], greedy(8, prompt_logprobs=0))[0]
    assert cut.prompt_token_ids == prompt[-17:] == direct.prompt_token_ids
    assert cut.outputs[0].token_ids == direct.outputs[0].token_ids
    assert [lp and lp.logprob for lp in cut.prompt_logprobs] == [lp and lp.logprob for lp in direct.prompt_logprobs]
    whole = llm.generate([prompt], greedy(8, truncate_prompt_tokens=40))[0]
    assert whole.prompt_token_ids == prompt  # a limit >= the prompt keeps it all
    assert whole.outputs[0].token_ids != cut.outputs[0].token_ids
    with pytest.raises(InvalidRequestError) as info:
        llm.generate([prompt], greedy(8, truncate_prompt_tokens=0))
    assert info.value.param == "truncate_prompt_tokens"
    minus_one = llm.generate([prompt], greedy(8, truncate_prompt_tokens=-1))[0]  # -1: the context length
    assert minus_one.prompt_token_ids == prompt
    context = llm.llm_engine.core.max_model_len
    with pytest.raises(InvalidRequestError) as info:  # as vLLM: more than the context can hold
        llm.generate([prompt], greedy(8, truncate_prompt_tokens=context + 1))
    assert info.value.param == "truncate_prompt_tokens" and str(context) in str(info.value)
    assert_kv_clean(llm)


def test_priority_needs_priority_scheduling(llm):
    """Under the default fcfs policy a non-zero priority would be ignored: refused instead (as
    vLLM); 0 is the default and fine."""
    prompt = random_prompts(1, seed=35, min_len=8, max_len=8)[0]
    assert llm.generate([prompt], greedy(2), priority=[0])[0].outputs[0].token_ids
    with pytest.raises(InvalidRequestError) as info:
        llm.generate([prompt], greedy(2), priority=[3])
    assert info.value.param == "priority" and "--scheduling-policy priority" in str(info.value)
    assert_kv_clean(llm)


def test_allowed_token_ids_that_the_requests_own_bans_empty_are_refused(llm):
    """``allowed_token_ids=[eos]`` with ``min_tokens`` (EOS banned until then), or only ids that
    one-token bad words ban, leave no first token: a 400 naming allowed_token_ids, before any step
    (the sampler used to fall back to token 0, outside the allowed ids)."""
    eos = min(llm.llm_engine.eos_token_ids)
    with pytest.raises(InvalidRequestError) as info:
        llm.generate([[5, 6, 7]], SamplingParams(allowed_token_ids=[eos], min_tokens=2, max_tokens=3))
    assert info.value.param == "allowed_token_ids" and "min_tokens=2" in info.value.message
    tokenizer = llm.get_tokenizer()
    _, word = single_token_word(tokenizer, tokenizer.encode(PROMPT, add_special_tokens=False))
    (word_id,) = tokenizer.encode(word, add_special_tokens=False)
    with pytest.raises(InvalidRequestError) as info:
        llm.generate([[5, 6, 7]], greedy(3, allowed_token_ids=[word_id], bad_words=[word]))
    assert info.value.param == "allowed_token_ids" and "bad_words" in info.value.message
    # Without min_tokens EOS is a token it may generate; scoring (max_tokens=0) samples nothing.
    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, allowed_token_ids=[eos], max_tokens=3))
    assert out[0].outputs[0].token_ids == [eos]
    llm.generate([[5, 6, 7]], SamplingParams(allowed_token_ids=[word_id], bad_words=[word], max_tokens=0))
    assert_kv_clean(llm)
