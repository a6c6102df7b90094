"""vLLM v1's output semantics, row by row (the table in docs/api.md), through the offline engine.

Every row forces its tokens so the expected values are exact: ``allowed_token_ids`` leaves two
tokens, ``logit_bias`` makes one of them the argmax, and ``min_tokens`` holds it back for the
first tokens (it bans EOS and stop token ids), so ``[W, W, X]`` is generated for a chosen ``X``.
The expected values are vLLM v1's, read from its source:

- ``vllm/v1/core/sched/utils.py`` ``check_stop``: nothing stops before ``min_tokens``; then EOS
  (``stop_reason`` None), ``stop_token_ids`` (``stop_reason`` = the id), then the length caps.
- ``vllm/v1/engine/detokenizer.py``: a request the core finished with ``stop`` does not
  detokenize its last token unless ``include_stop_str_in_output``; stop strings are tried in list
  order on the new text (``check_stop_strings``), only once ``min_tokens`` tokens exist, and the
  text is cut while every token id stays.
- ``vllm/sampling_params.py`` ``update_from_generation_config``: the tokenizer's EOS is the EOS;
  generation_config's other EOS ids join ``stop_token_ids`` unless ``ignore_eos``;
  ``all_stop_token_ids`` (banned before ``min_tokens``) holds every EOS id whatever ignore_eos.
- ``vllm/v1/engine/parallel_sampling.py``: choice ``i`` of a seeded ``n > 1`` request samples
  with ``seed + i``.
"""

from __future__ import annotations

import pytest

from kvserve import SamplingParams
from kvserve.errors import InvalidRequestError
from engine_helpers import assert_kv_clean, make_llm

# Token ids of the test BPE tokenizer (kvserve.testing.tokenizer_kinds): checked by ``test_ids``.
HELLO, WORLD, EOS, IM_END = 813, 902, 1, 3
PROMPT = "The fox"


@pytest.fixture(scope="module")
def llm(model_dir):
    return make_llm(model_dir)


def forced(llm, last: int, **params):
    """Greedy ``[WORLD] * min_tokens + [last, ...]``: only WORLD and ``last`` are allowed and
    ``last`` wins once ``min_tokens`` stops banning it."""
    params = {"min_tokens": 2, "max_tokens": 8, **params}
    out = llm.generate(PROMPT, SamplingParams(temperature=0, allowed_token_ids=[WORLD, last],
                                              logit_bias={last: 100.0}, **params))[0]
    return out.outputs[0]


def summary(choice):
    return choice.text, choice.token_ids, choice.finish_reason, choice.stop_reason


def test_ids(llm):
    tokenizer = llm.get_tokenizer()
    assert tokenizer.convert_ids_to_tokens([HELLO, WORLD, EOS, IM_END]) == [
        "Hello", "Ġworld", "<|endoftext|>", "<|im_end|>"]
    assert tokenizer.eos_token_id == EOS


def test_eos_keeps_its_id_and_logprob_not_its_text(llm):
    """EOS: ``token_ids`` and ``logprobs`` end with it, the text never shows it (even with
    ``skip_special_tokens=False``), ``finish_reason`` stop, ``stop_reason`` None."""
    choice = forced(llm, EOS, logprobs=1)
    assert summary(choice) == (" world world", [WORLD, WORLD, EOS], "stop", None)
    assert [lp.token_id for lp in choice.logprobs] == [WORLD, WORLD, EOS]
    assert summary(forced(llm, EOS, skip_special_tokens=False)) == (
        " world world", [WORLD, WORLD, EOS], "stop", None)


def test_eos_text_with_include_stop_str_in_output(llm):
    """``include_stop_str_in_output`` detokenizes the EOS too; ``skip_special_tokens`` then
    decides whether its text shows."""
    assert forced(llm, EOS, include_stop_str_in_output=True, skip_special_tokens=False).text == (
        " world world<|endoftext|>")
    assert forced(llm, EOS, include_stop_str_in_output=True).text == " world world"


def test_generation_config_eos_is_a_stop_token_id(llm):
    """generation_config.json lists ``<|im_end|>`` beside the tokenizer's EOS: it stops with
    ``stop_reason`` = its id; ``ignore_eos`` turns it off too."""
    assert summary(forced(llm, IM_END)) == (" world world", [WORLD, WORLD, IM_END], "stop", IM_END)
    choice = forced(llm, IM_END, ignore_eos=True, max_tokens=4)
    assert summary(choice) == (" world world", [WORLD, WORLD, IM_END, IM_END], "length", None)


def test_stop_token_id(llm):
    """A ``stop_token_ids`` id: kept in ``token_ids``, its text left out unless
    ``include_stop_str_in_output``, ``stop_reason`` = the id. The EOS listed in
    ``stop_token_ids`` still reports ``stop_reason`` None (vLLM checks EOS first)."""
    assert summary(forced(llm, HELLO, stop_token_ids=[HELLO])) == (
        " world world", [WORLD, WORLD, HELLO], "stop", HELLO)
    assert forced(llm, HELLO, stop_token_ids=[HELLO], include_stop_str_in_output=True).text == " world worldHello"
    assert summary(forced(llm, EOS, stop_token_ids=[EOS]))[2:] == ("stop", None)


def test_stop_token_on_the_last_allowed_position_is_stop(llm):
    assert summary(forced(llm, EOS, max_tokens=3)) == (" world world", [WORLD, WORLD, EOS], "stop", None)
    assert summary(forced(llm, EOS, max_tokens=2)) == (" world world", [WORLD, WORLD], "length", None)


def test_stop_string_spanning_tokens_cuts_text_keeps_ids(llm):
    """``"world world"`` ends in the second token: the text stops before it (the held-back
    ``"world"`` of the first token is never shown), both token ids and logprobs stay."""
    choice = forced(llm, WORLD, min_tokens=0, stop=["world world"], logprobs=0)
    assert summary(choice) == (" ", [WORLD, WORLD], "stop", "world world")
    assert [lp.token_id for lp in choice.logprobs] == [WORLD, WORLD]
    included = forced(llm, WORLD, min_tokens=0, stop=["world world"], include_stop_str_in_output=True)
    assert summary(included) == (" world world", [WORLD, WORLD], "stop", "world world")


def test_stop_string_on_the_last_allowed_token_is_stop(llm):
    """The core finishes with ``length`` at the token that completes the stop string; the stop
    string wins (vLLM's output processor overrides the finish reason)."""
    choice = forced(llm, WORLD, min_tokens=0, max_tokens=2, stop=["world world"])
    assert summary(choice) == (" ", [WORLD, WORLD], "stop", "world world")


def test_stop_string_inside_a_token(llm):
    """``"orl"`` ends inside ``" world"``: the text is cut mid-token, the token id stays."""
    assert summary(forced(llm, WORLD, min_tokens=0, stop=["orl"])) == (" w", [WORLD], "stop", "orl")
    assert forced(llm, WORLD, min_tokens=0, stop=["orl"], include_stop_str_in_output=True).text == " worl"


def test_stop_strings_in_one_token_list_order_wins(llm):
    """``" world"`` holds both ``" wor"`` and ``"ld"``: the first in the list wins."""
    assert summary(forced(llm, WORLD, min_tokens=0, stop=["ld", " wor"])) == (" wor", [WORLD], "stop", "ld")
    assert summary(forced(llm, WORLD, min_tokens=0, stop=[" wor", "ld"])) == ("", [WORLD], "stop", " wor")


def test_stop_strings_wait_for_min_tokens(llm):
    """Stop strings are not checked in the text of the first ``min_tokens`` tokens. With
    ``min_tokens=3`` the text is ``" world" * 4`` when the 4th token is checked; the first
    ``"world world"`` ending in its text starts at 13."""
    choice = forced(llm, WORLD, min_tokens=3, stop=["world world"])
    assert summary(choice) == (" world world ", [WORLD] * 4, "stop", "world world")
    choice = forced(llm, WORLD, min_tokens=2, stop=[" world"])
    assert summary(choice) == (" world world", [WORLD] * 3, "stop", " world")


def test_min_tokens_bans_eos_under_ignore_eos_too(llm):
    """``ignore_eos`` with ``max_tokens``: EOS does not stop (and counts as a token), the request
    ends with ``length``; ``min_tokens`` still bans EOS first (vLLM's ``all_stop_token_ids``)."""
    tokenizer = llm.get_tokenizer()
    choice = forced(llm, EOS, ignore_eos=True, max_tokens=5)
    assert summary(choice) == (" world world", [WORLD, WORLD, EOS, EOS, EOS], "length", None)
    shown = forced(llm, EOS, ignore_eos=True, max_tokens=5, skip_special_tokens=False).text
    assert shown == tokenizer.decode([WORLD, WORLD, EOS, EOS, EOS], skip_special_tokens=False)
    assert shown == " world world" + "<|endoftext|>" * 3


def test_min_tokens_must_fit_in_what_the_context_leaves(llm):
    """Without a cap vLLM builds ``SamplingParams`` with ``max_tokens`` = what the context leaves,
    so ``min_tokens`` above that is refused (a 250-token prompt in 256 leaves 6)."""
    prompt = list(range(5, 255))
    with pytest.raises(InvalidRequestError) as info:
        llm.generate([prompt], SamplingParams(min_tokens=7, max_tokens=None))
    assert info.value.param == "min_tokens" and "cuts to 6" in info.value.message
    out = llm.generate([prompt], SamplingParams(min_tokens=6, ignore_eos=True, max_tokens=None))[0].outputs[0]
    assert (len(out.token_ids), out.finish_reason) == (6, "length")
    assert_kv_clean(llm)


def test_n_with_seed_samples_choice_i_with_seed_plus_i(llm):
    """Choice ``i`` of ``n=3, seed=s`` equals a lone request with ``seed=s+i`` (ids and logprob
    bits); the same call twice gives the same choices."""
    params = dict(temperature=1.0, max_tokens=10, ignore_eos=True, logprobs=0)
    fanned = llm.generate(PROMPT, SamplingParams(n=3, seed=40, **params))[0].outputs
    again = llm.generate(PROMPT, SamplingParams(n=3, seed=40, **params))[0].outputs
    for i, choice in enumerate(fanned):
        alone = llm.generate(PROMPT, SamplingParams(seed=40 + i, **params))[0].outputs[0]
        assert choice.index == i
        assert choice.token_ids == alone.token_ids == again[i].token_ids
        assert [lp.logprob for lp in choice.logprobs] == [lp.logprob for lp in alone.logprobs]
    assert len({tuple(c.token_ids) for c in fanned}) == 3
    assert_kv_clean(llm)
