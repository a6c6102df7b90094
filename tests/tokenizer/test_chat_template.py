"""Chat templates: exact rendering, ids against mistral_common, typed errors."""

from __future__ import annotations

import shutil

import pytest

from kvserve.errors import InvalidRequestError
from kvserve.tokenizer import apply_chat_template, load_tokenizer, render_chat_template

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi 你好 😀"},
]


def test_chatml_renders_exact_string_and_ids(tiny_qwen2, loaded_tokenizer):
    tokenizer = loaded_tokenizer(tiny_qwen2)
    text = render_chat_template(tokenizer, CONVERSATION)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi 你好 😀<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids = apply_chat_template(tokenizer, CONVERSATION)
    assert tokenizer.decode(ids) == text
    # Special tokens are single ids: <|im_start|> = 2 opens each of the three turns, <|im_end|> = 3.
    assert ids[0] == 2 and ids.count(2) == 3 and ids.count(3) == 2
    suffix = [2] + tokenizer.encode("assistant\n", add_special_tokens=False)
    assert ids[-len(suffix):] == suffix


def test_chatml_without_generation_prompt_and_with_continuation(tiny_llama, loaded_tokenizer):
    tokenizer = loaded_tokenizer(tiny_llama)
    no_prompt = render_chat_template(tokenizer, CONVERSATION, add_generation_prompt=False)
    assert no_prompt.endswith("Hi 你好 😀<|im_end|>\n")
    partial = CONVERSATION + [{"role": "assistant", "content": "Hel"}]
    continued = render_chat_template(
        tokenizer, partial, add_generation_prompt=False, continue_final_message=True
    )
    assert continued == no_prompt + "<|im_start|>assistant\nHel"


def test_tools_are_passed_to_the_template(tiny_llama, loaded_tokenizer):
    tokenizer = loaded_tokenizer(tiny_llama)
    tools = [{"type": "function", "function": {"name": "now", "parameters": {}}}]
    text = render_chat_template(tokenizer, CONVERSATION[1:], tools=tools)
    assert text.startswith(
        '<|im_start|>system\nTools: [{"type": "function", "function": {"name": "now", '
        '"parameters": {}}}]<|im_end|>\n<|im_start|>user\n'
    )


def test_chat_template_argument_and_kwargs_override_the_tokenizers(tiny_llama, loaded_tokenizer):
    tokenizer = loaded_tokenizer(tiny_llama)
    template = "{% for m in messages %}{{ m['role'] }}={{ m['content'] }};{% endfor %}{{ extra }}"
    text = render_chat_template(
        tokenizer, CONVERSATION, chat_template=template, chat_template_kwargs={"extra": "!"}
    )
    assert text == "system=Be brief.;user=Hi 你好 😀;!"


@pytest.mark.parametrize(
    ("fixture", "kind"),
    [("tiny_llama_sentencepiece", "sentencepiece"), ("tiny_mistral_tekken", "tekken")],
)
def test_mistral_template_ids_equal_mistral_common(
    request, loaded_tokenizer, mistral_common_tokenizer, fixture, kind
):
    from mistral_common.protocol.instruct.messages import AssistantMessage, UserMessage
    from mistral_common.protocol.instruct.request import ChatCompletionRequest

    turns = ["Hi 你好 😀", "Héllo there", "Again  now"]
    messages = [
        {"role": role, "content": content}
        for role, content in zip(["user", "assistant", "user"], turns)
    ]
    reference = mistral_common_tokenizer(kind).encode_chat_completion(
        ChatCompletionRequest(
            messages=[UserMessage(content=turns[0]), AssistantMessage(content=turns[1]), UserMessage(content=turns[2])]
        )
    )
    tokenizer = loaded_tokenizer(request.getfixturevalue(fixture))
    text = render_chat_template(tokenizer, messages)
    assert text == "<s>[INST]Hi 你好 😀[/INST]Héllo there</s>[INST]Again  now[/INST]"
    assert apply_chat_template(tokenizer, messages) == reference.tokens  # one BOS, not two


def test_template_error_is_invalid_request_quoting_the_template(tiny_llama, loaded_tokenizer):
    tokenizer = loaded_tokenizer(tiny_llama)
    with pytest.raises(InvalidRequestError) as info:
        apply_chat_template(tokenizer, [{"role": "robot", "content": "beep"}])
    assert info.value.message == (
        "chat template error: Unknown role robot; roles must be system, user, assistant or tool"
    )
    assert info.value.param == "messages"


def test_template_that_does_not_parse_names_chat_template(tiny_llama, loaded_tokenizer):
    tokenizer = loaded_tokenizer(tiny_llama)
    with pytest.raises(InvalidRequestError) as info:
        render_chat_template(tokenizer, CONVERSATION, chat_template="{% if %}")
    assert info.value.param == "chat_template"
    assert info.value.message.startswith("chat template does not parse: ")


def test_template_type_error_is_invalid_request(tiny_llama, loaded_tokenizer):
    tokenizer = loaded_tokenizer(tiny_llama)
    with pytest.raises(InvalidRequestError, match="^chat template error: "):
        render_chat_template(tokenizer, [{"role": "user", "content": None}])


def test_missing_template_and_conflicting_flags(tiny_llama, tmp_path, loaded_tokenizer):
    shutil.copytree(tiny_llama, tmp_path / "m")
    (tmp_path / "m" / "chat_template.jinja").unlink()
    bare = load_tokenizer(tmp_path / "m")
    with pytest.raises(InvalidRequestError, match="has no chat template") as info:
        render_chat_template(bare, CONVERSATION)
    assert info.value.param == "messages"
    assert render_chat_template(bare, CONVERSATION, chat_template="{{ messages[0]['content'] }}") == "Be brief."
    tokenizer = loaded_tokenizer(tiny_llama)
    with pytest.raises(InvalidRequestError, match="cannot be combined") as info:
        render_chat_template(tokenizer, CONVERSATION, continue_final_message=True)
    assert info.value.param == "continue_final_message"


def test_sandbox_blocks_attribute_access(tiny_llama, loaded_tokenizer):
    tokenizer = loaded_tokenizer(tiny_llama)
    template = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(InvalidRequestError, match="^chat template error: "):
        render_chat_template(tokenizer, CONVERSATION, chat_template=template)
