"""Request models -> SamplingParams, and the checks only the HTTP layer makes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kvserve.api.chat_protocol import ChatCompletionRequest
from kvserve.api.protocol import ChatMessage, CompletionRequest, parse_logit_bias
from kvserve.engine.param_validation import validate_sampling_params
from kvserve.errors import InvalidRequestError
from kvserve.generation_config import SamplingDefaults
from kvserve.sampling_params import SamplingParams

VOCAB = 1000


def test_completion_defaults_follow_openai():
    request = CompletionRequest(prompt="hi")
    # OpenAI's default of 16; the input processor cuts it to what the context leaves.
    assert request.max_tokens == 16 and request.n == 1 and request.echo is False
    params = request.to_sampling_params(max_tokens=16, logprobs=None)
    assert params == SamplingParams(max_tokens=16)


def test_model_defaults_fill_only_omitted_fields():
    """generation_config.json values apply where the request says nothing (vLLM)."""
    defaults = SamplingDefaults(temperature=0.6, top_p=0.9, top_k=20, repetition_penalty=1.05, max_tokens=3)
    params = CompletionRequest(prompt="x", top_p=0.5).to_sampling_params(max_tokens=4, logprobs=None,
                                                                         defaults=defaults)
    assert (params.temperature, params.top_p, params.top_k, params.repetition_penalty) == (0.6, 0.5, 20, 1.05)
    assert params.max_tokens == 3  # max_new_tokens caps max_tokens
    assert CompletionRequest(prompt="x", temperature=0).to_sampling_params(
        max_tokens=4, logprobs=None, defaults=defaults).temperature == 0


def test_every_sampling_field_is_carried_over():
    body = {
        "prompt": "x", "n": 2, "temperature": 0.7, "top_p": 0.9, "stop": "END", "seed": 11,
        "logit_bias": {"5": 10, "7": -100}, "presence_penalty": 0.5, "frequency_penalty": -0.25,
        "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1, "min_tokens": 2, "ignore_eos": True,
        "stop_token_ids": [3, 4], "include_stop_str_in_output": True, "skip_special_tokens": False,
        "prompt_logprobs": 2, "priority": -1, "cache_salt": "tenant-a", "user": "u1",
        "allowed_token_ids": [3, 9, 27], "bad_words": ["foo", "bar baz"], "truncate_prompt_tokens": 50,
    }
    request = CompletionRequest.model_validate(body)
    params = request.to_sampling_params(max_tokens=30, logprobs=3)
    assert params == SamplingParams(
        n=2, temperature=0.7, top_p=0.9, top_k=40, min_p=0.05, presence_penalty=0.5,
        frequency_penalty=-0.25, repetition_penalty=1.1, logit_bias={5: 10.0, 7: -100.0}, seed=11,
        max_tokens=30, min_tokens=2, stop=["END"], stop_token_ids=[3, 4], ignore_eos=True,
        include_stop_str_in_output=True, logprobs=3, prompt_logprobs=2, skip_special_tokens=False,
        allowed_token_ids=[3, 9, 27], bad_words=["foo", "bar baz"], truncate_prompt_tokens=50)


def test_temperature_zero_and_top_k_minus_one():
    request = CompletionRequest(prompt="x", temperature=0, top_k=-1, stop=["a", "b"])
    params = request.to_sampling_params(max_tokens=4, logprobs=None)
    assert params.temperature == 0 and params.is_greedy and params.top_k == 0
    assert params.stop == ["a", "b"]


def test_unknown_fields_are_ignored_and_unsupported_vllm_fields_refused_by_name():
    request = CompletionRequest.model_validate({"prompt": "x", "something_new": {"a": 1},
                                                "use_beam_search": False, "length_penalty": 1.0})
    request.check_http_fields()  # neither OpenAI's nor vLLM's: ignored; vLLM's defaults: fine
    for field, value in (("watermarking", True), ("logprob_token_ids", [3]), ("spaces_between_special_tokens", False),
                         ("truncation_side", "right"), ("vllm_xargs", {"a": 1})):
        with pytest.raises(InvalidRequestError) as info:
            CompletionRequest.model_validate({"prompt": "x", field: value}).check_http_fields()
        assert info.value.param == field and info.value.message.startswith(f"{field} is not supported")


@pytest.mark.parametrize("prompt", ["text", ["a", "b"], [1, 2, 3], [[1, 2], [3]]])
def test_prompt_shapes_are_accepted(prompt):
    assert CompletionRequest(prompt=prompt).prompt == prompt


def test_logit_bias_keys_are_parsed_and_checked():
    assert parse_logit_bias({"0": 1, " 12 ": -2.5}) == {0: 1.0, 12: -2.5}
    assert parse_logit_bias({}) is None
    for bad in ("abc", "-1", "1.5", ""):
        with pytest.raises(InvalidRequestError) as info:
            parse_logit_bias({bad: 1})
        assert info.value.param == "logit_bias" and repr(bad) in info.value.message


def test_logit_bias_out_of_vocab_is_refused_and_any_value_accepted():
    """As vLLM: ids outside the vocabulary are a 400; a value beyond +-100 is clamped (by the
    input processor, tests/api/test_validation_parity.py), not refused; NaN is refused."""
    request = CompletionRequest(prompt="x", logit_bias={str(VOCAB): 1})
    with pytest.raises(InvalidRequestError) as info:
        validate_sampling_params(request.to_sampling_params(max_tokens=4, logprobs=None), VOCAB)
    assert info.value.param == "logit_bias" and "0..999" in info.value.message
    for value in (101, -1e9):
        request = CompletionRequest(prompt="x", logit_bias={"3": value})
        validate_sampling_params(request.to_sampling_params(max_tokens=4, logprobs=None), VOCAB)
    request = CompletionRequest(prompt="x", logit_bias={"3": float("nan")})
    with pytest.raises(InvalidRequestError) as info:
        validate_sampling_params(request.to_sampling_params(max_tokens=4, logprobs=None), VOCAB)
    assert info.value.param == "logit_bias"


@pytest.mark.parametrize("field,value", [("temperature", -1), ("top_p", 0), ("n", 0),
                                         ("presence_penalty", 3), ("min_p", 2), ("top_k", -2)])
def test_out_of_range_values_name_the_param(field, value):
    request = CompletionRequest.model_validate({"prompt": "x", field: value})
    with pytest.raises(InvalidRequestError) as info:
        validate_sampling_params(request.to_sampling_params(max_tokens=4, logprobs=None), VOCAB)
    assert info.value.param == field


def test_response_format_and_vllm_fields_become_structured_outputs():
    assert CompletionRequest(prompt="x", response_format={"type": "text"}).structured_outputs_params() is None
    messages = [{"role": "user", "content": "x"}]
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    json_schema = {"type": "json_schema", "json_schema": {"name": "thing", "schema": schema, "strict": True}}
    params = ChatCompletionRequest(messages=messages, response_format=json_schema).structured_outputs_params()
    assert params.json_schema() == schema and params.source == "response_format"
    assert ChatCompletionRequest(messages=messages, response_format={"type": "json_object"}
                                 ).structured_outputs_params().json_object is True
    assert CompletionRequest(prompt="x", guided_regex="a+").structured_outputs_params().regex == "a+"
    assert CompletionRequest(prompt="x", structured_outputs={"choice": ["a", "b"]}
                             ).structured_outputs_params().choice == ("a", "b")
    with pytest.raises(InvalidRequestError) as info:  # two constraints
        CompletionRequest(prompt="x", guided_regex="a+", response_format={"type": "json_object"}
                          ).structured_outputs_params()
    assert "at most one" in info.value.message


def test_stream_options_need_stream():
    with pytest.raises(InvalidRequestError) as info:
        CompletionRequest(prompt="x", stream_options={"include_usage": True}).check_http_fields()
    assert info.value.param == "stream_options"
    request = CompletionRequest(prompt="x", stream=True, stream_options={"include_usage": True})
    request.check_http_fields()
    assert request.include_usage
    assert not CompletionRequest(prompt="x", stream=True).include_usage


def test_chat_max_completion_tokens_wins_and_logprobs():
    messages = [{"role": "user", "content": "x"}]
    request = ChatCompletionRequest(messages=messages, max_tokens=5, max_completion_tokens=9)
    assert request.requested_max_tokens == 9
    assert ChatCompletionRequest(messages=messages, max_tokens=5).requested_max_tokens == 5
    assert ChatCompletionRequest(messages=messages).requested_max_tokens is None
    assert ChatCompletionRequest(messages=messages).num_logprobs is None
    assert ChatCompletionRequest(messages=messages, logprobs=True).num_logprobs == 0
    assert ChatCompletionRequest(messages=messages, logprobs=True, top_logprobs=4).num_logprobs == 4
    with pytest.raises(InvalidRequestError) as info:
        ChatCompletionRequest(messages=messages, top_logprobs=2).check_http_fields()
    assert info.value.param == "top_logprobs"
    with pytest.raises(InvalidRequestError):
        ChatCompletionRequest(messages=messages, continue_final_message=True).check_http_fields()


def test_chat_content_parts_are_joined_and_non_text_rejected():
    message = ChatMessage(role="user", content=[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])
    assert message.to_template_dict(0) == {"role": "user", "content": "a\nb"}
    named = ChatMessage(role="user", content="hi", name="bob")
    assert named.to_template_dict(0) == {"role": "user", "content": "hi", "name": "bob"}
    image = ChatMessage(role="user", content=[{"type": "image_url", "image_url": {"url": "x"}}])
    with pytest.raises(InvalidRequestError) as info:
        image.to_template_dict(2)
    assert info.value.param == "messages.2.content.0.type"
    textless = ChatMessage(role="user", content=[{"type": "text"}])
    with pytest.raises(InvalidRequestError, match="a 'text' content part needs its 'text'") as info:
        textless.to_template_dict(1)
    assert info.value.param == "messages.1.content.0.text"


def test_chat_tool_history_reaches_the_template():
    """Earlier calls' arguments reach the template as objects (vLLM's _postprocess_messages)."""
    call = {"id": "call_1", "type": "function", "function": {"name": "now", "arguments": '{"tz": "UTC"}'}}
    message = ChatMessage(role="assistant", content=None, tool_calls=[call])
    assert message.to_template_dict(0) == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "now", "arguments": {"tz": "UTC"}}}]}
    assert call["function"]["arguments"] == '{"tz": "UTC"}'  # the request is not modified
    for empty in ("", None, "  "):
        bare = ChatMessage(role="assistant", tool_calls=[{"function": {"name": "now", "arguments": empty}}])
        assert bare.to_template_dict(0)["tool_calls"][0]["function"]["arguments"] == {}
    reply = ChatMessage(role="tool", content="12:00", tool_call_id="call_1")
    assert reply.to_template_dict(1) == {"role": "tool", "content": "12:00", "tool_call_id": "call_1"}
    thought = ChatMessage(role="assistant", content="4", reasoning_content="2+2")
    assert thought.to_template_dict(2) == {"role": "assistant", "content": "4", "reasoning_content": "2+2",
                                           "reasoning": "2+2"}


@pytest.mark.parametrize("call, param", [
    ({"function": {"name": "f", "arguments": "{'a': 1}"}}, "messages.3.tool_calls.1.function.arguments"),
    ({"function": {"name": "f", "arguments": 5}}, "messages.3.tool_calls.1.function.arguments"),
    ({"function": {"arguments": "{}"}}, "messages.3.tool_calls.1.function"),
    ({"name": "f"}, "messages.3.tool_calls.1.function"),
])
def test_malformed_earlier_tool_calls_name_the_field(call, param):
    good = {"id": "a", "type": "function", "function": {"name": "g", "arguments": "{}"}}
    message = ChatMessage(role="assistant", tool_calls=[good, call])
    with pytest.raises(InvalidRequestError) as info:
        message.to_template_dict(3)
    assert info.value.param == param


def test_chat_needs_messages_and_known_roles():
    with pytest.raises(ValidationError):
        ChatCompletionRequest(messages=[])
    with pytest.raises(ValidationError):
        ChatCompletionRequest(messages=[{"role": "robot", "content": "x"}])
