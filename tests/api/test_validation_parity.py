"""Validation happens in one place: random combinations of request fields sent through the HTTP
API and through the offline ``LLM`` get the same decision (accepted or refused) and, when refused,
the same message and field."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvserve import LLM, SamplingParams
from kvserve.errors import InvalidRequestError
from kvserve.testing.live_server import start_live_server

MAX_MODEL_LEN = 64
ENGINE = dict(max_model_len=MAX_MODEL_LEN, num_gpu_blocks_override=64, dtype="float32")

# Each field: valid values and values just outside the allowed range, well typed (a wrongly typed
# value is the JSON parser's to refuse, with its own message).
FIELDS = {
    "n": st.integers(-1, 3),
    "temperature": st.sampled_from([-0.5, 0.0, 0.7, 1.0]),
    "top_p": st.sampled_from([0.0, 0.5, 1.0, 1.5]),
    "top_k": st.integers(-3, 50),
    "min_p": st.sampled_from([-0.1, 0.0, 0.2, 1.2]),
    "presence_penalty": st.sampled_from([-3.0, 0.0, 1.5, 2.5]),
    "frequency_penalty": st.sampled_from([-2.5, -1.0, 0.0, 2.0]),
    "repetition_penalty": st.sampled_from([-1.0, 0.0, 1.0, 1.3]),
    "seed": st.sampled_from([-(2**63) - 1, -5, 0, 7, 2**63 - 1, 2**63, 2**64 - 1]),
    "max_tokens": st.sampled_from([-1, 1, 3, 5, 100]),
    "min_tokens": st.integers(-1, 6),
    "logprobs": st.integers(-1, 21),
    "prompt_logprobs": st.integers(-1, 21),
    "stop": st.lists(st.sampled_from(["", "the", "\n"]), max_size=2),
    "stop_token_ids": st.lists(st.sampled_from([0, 5, 959, 960, 5000]), max_size=2),
    "logit_bias": st.dictionaries(st.sampled_from([0, 3, 960]), st.sampled_from([-101.0, -5.0, 0.0, 100.0]),
                                  max_size=2),
    "allowed_token_ids": st.lists(st.sampled_from([-1, 3, 7, 960]), max_size=3),
    "bad_words": st.lists(st.sampled_from(["", "  ", "the", "hello world"]), max_size=2),
    "truncate_prompt_tokens": st.sampled_from([-2, -1, 0, 3, 64, 65]),
    "ignore_eos": st.booleans(),
}
PROMPTS = st.one_of(
    st.lists(st.integers(0, 959), min_size=1, max_size=8),
    st.lists(st.integers(0, 959), min_size=MAX_MODEL_LEN, max_size=MAX_MODEL_LEN + 3),  # fills the context
    st.just([]), st.just([3, 960]), st.just([-1]),
    st.sampled_from(["Hello there", "", "caf\u00e9 \U0001f600"]),
)


@pytest.fixture(scope="module")
def server(tiny_llama):
    srv = start_live_server(str(tiny_llama), served_model_name="tiny", api_key="k", **ENGINE)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(str(tiny_llama), **ENGINE)


def over_http(server, prompt, fields: dict) -> tuple[str, str | None, str | None]:
    body = {"model": "tiny", "prompt": prompt, **fields}
    if "logit_bias" in fields:
        body["logit_bias"] = {str(k): v for k, v in fields["logit_bias"].items()}
    response = httpx.post(server.base_url + "/v1/completions", json=body, timeout=60,
                          headers={"Authorization": "Bearer k"})
    if response.status_code == 200:
        return "accepted", None, None
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    return "refused", error["message"], error["param"]


def offline(llm, prompt, fields: dict) -> tuple[str, str | None, str | None]:
    fields = dict(fields)
    priority = fields.pop("priority", 0)
    try:
        llm.generate([prompt], SamplingParams(**fields), priority=[priority])
    except InvalidRequestError as exc:
        return "refused", exc.message, exc.param
    return "accepted", None, None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=PROMPTS, fields=st.fixed_dictionaries({}, optional={**FIELDS, "priority": st.integers(-1, 1)}))
def test_http_and_offline_decide_alike(server, llm, prompt, fields):
    if isinstance(prompt, list) and "allowed_token_ids" in fields and not fields["allowed_token_ids"]:
        fields["allowed_token_ids"] = None if len(prompt) % 2 else []  # also the empty list
    assert over_http(server, prompt, fields) == offline(llm, prompt, fields)


# One request per check the input processor makes (engine/param_validation.py and
# engine/input_processor.py; docs/architecture.md lists where each lives): (prompt, fields, param).
LONG = list(range(1, MAX_MODEL_LEN + 1))
CHECKS = {
    "n >= 1": ([1, 2], {"n": 0}, "n"),
    "n <= 128": ([1, 2], {"n": 129, "temperature": 1.0}, "n"),
    "n == 1 when greedy": ([1, 2], {"n": 2, "temperature": 0.0}, "n"),
    "top_k": ([1, 2], {"top_k": -2}, "top_k"),
    "max_tokens >= 0": ([1, 2], {"max_tokens": -1}, "max_tokens"),
    "min_tokens >= 0": ([1, 2], {"min_tokens": -1}, "min_tokens"),
    "min_tokens <= max_tokens": ([1, 2], {"min_tokens": 5, "max_tokens": 3}, "min_tokens"),
    "max_tokens <= context": ([1, 2], {"max_tokens": MAX_MODEL_LEN + 1}, "max_tokens"),
    "prompt + max_tokens fit the context": (list(range(1, 61)), {"max_tokens": 20}, "prompt"),
    "truncate_prompt_tokens >= 1 or -1": ([1, 2], {"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
    "truncate_prompt_tokens <= context": ([1, 2], {"truncate_prompt_tokens": MAX_MODEL_LEN + 1},
                                          "truncate_prompt_tokens"),
    "temperature >= 0": ([1, 2], {"temperature": -0.5}, "temperature"),
    "temperature fits float32": ([1, 2], {"temperature": 1e39}, "temperature"),
    "top_p in (0, 1]": ([1, 2], {"top_p": 0.0}, "top_p"),
    "min_p in [0, 1]": ([1, 2], {"min_p": 1.5}, "min_p"),
    "presence_penalty in [-2, 2]": ([1, 2], {"presence_penalty": 2.5}, "presence_penalty"),
    "frequency_penalty in [-2, 2]": ([1, 2], {"frequency_penalty": -2.5}, "frequency_penalty"),
    "repetition_penalty > 0": ([1, 2], {"repetition_penalty": 0.0}, "repetition_penalty"),
    "logprobs in [0, 20]": ([1, 2], {"logprobs": 21}, "logprobs"),
    "prompt_logprobs in [0, 20]": ([1, 2], {"prompt_logprobs": -1}, "prompt_logprobs"),
    "stop strings non-empty": ([1, 2], {"stop": [""]}, "stop"),
    "bad_words non-blank": ([1, 2], {"bad_words": ["  "]}, "bad_words"),
    "logit_bias keys in the vocabulary": ([1, 2], {"logit_bias": {960: 1.0}}, "logit_bias"),
    "stop_token_ids in the vocabulary": ([1, 2], {"stop_token_ids": [960]}, "stop_token_ids"),
    "allowed_token_ids non-empty": ([1, 2], {"allowed_token_ids": []}, "allowed_token_ids"),
    "allowed_token_ids in the vocabulary": ([1, 2], {"allowed_token_ids": [960]}, "allowed_token_ids"),
    "allowed_token_ids not all banned": ([1, 2], {"allowed_token_ids": [3], "bad_words": ["x"],
                                                  "min_tokens": 1, "stop_token_ids": [3]}, "allowed_token_ids"),
    "seed in the int64 range": ([1, 2], {"seed": 2**63}, "seed"),
    "priority needs priority scheduling": ([1, 2], {"priority": 1}, "priority"),
    "prompt token ids in the vocabulary": ([3, 960], {}, "prompt"),
    "prompt not empty": ("", {}, "prompt"),
    "prompt leaves room to generate": (LONG, {}, "prompt"),
}


@pytest.mark.parametrize("name", list(CHECKS))
def test_each_check_refuses_alike_over_http_and_offline(server, llm, name):
    prompt, fields, param = CHECKS[name]
    http = over_http(server, prompt, fields)
    assert http[0] == "refused" and http[2] == param, (name, http)
    assert http == offline(llm, prompt, fields), name
