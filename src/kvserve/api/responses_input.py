"""A Responses request as the chat completion it stands for (vLLM 0.32's
``construct_input_messages`` and ``construct_chat_messages_with_tool_call``).

    instructions                    -> {"role": "system"} first (never carried to a follow-up)
    previous response (stored)      -> its conversation, then its output items as below
    input "text"                    -> {"role": "user", "content": "text"}
    {"role", "content"} / message   -> that message; text parts (input_text, output_text,
                                       refusal) joined with newlines, as chat joins its parts
    function_call                   -> an assistant turn's tool_calls ({"id": call_id, ...})
    function_call_output            -> {"role": "tool", "tool_call_id": call_id}
    reasoning                       -> the assistant turn's ``reasoning`` (a previous response's
                                       reasoning is dropped, as vLLM)

An assistant-side item (reasoning, an assistant message, a function call) joins the assistant
turn before it when that turn has no such part yet (vLLM's merge), so reasoning, text and calls
of one reply render as one turn. A last assistant message with status ``in_progress`` or
``incomplete`` is continued (``continue_final_message``), as vLLM's
``should_continue_final_message``.

tools (``{"type": "function", "name", "description", "parameters", "strict"}``) become chat's
``{"type": "function", "function": {...}}``; ``tool_choice`` ``{"type": "function", "name"}``
becomes chat's named choice; ``text.format`` becomes ``response_format``; ``reasoning.effort``
``reasoning_effort``; ``max_output_tokens`` ``max_completion_tokens``.

Raises InvalidRequestError (400, ``param`` the item's path such as ``input.2.content.0.type``)
for every item, part or tool kvserve does not implement.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from kvserve.api.chat_protocol import ChatCompletionRequest
from kvserve.api.responses_protocol import ResponsesRequest
from kvserve.errors import InvalidRequestError

MESSAGE_ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = {"user": ("input_text",), "system": ("input_text",), "developer": ("input_text",),
              "assistant": ("output_text", "refusal", "input_text")}
# Request fields that mean the same in chat (vLLM's extensions included).
SHARED_FIELDS = ("model", "temperature", "top_p", "parallel_tool_calls", "user", "include_reasoning", "top_k",
                 "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "seed", "stop",
                 "stop_token_ids", "ignore_eos", "include_stop_str_in_output", "skip_special_tokens", "logit_bias",
                 "priority", "cache_salt", "chat_template_kwargs", "structured_outputs")
# Chat's names of fields in errors -> the Responses request's.
RESPONSES_PARAMS = {"max_completion_tokens": "max_output_tokens", "max_tokens": "max_output_tokens",
                    "messages": "input", "response_format": "text.format", "reasoning_effort": "reasoning.effort"}


def input_messages(items: str | list[dict[str, Any]], param: str = "input") -> list[dict]:
    """Chat messages of ``input`` (a string, or Responses input items).

    Raises:
        InvalidRequestError: an item type, role or content part kvserve does not implement, or
            an item missing its fields.
    """
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict] = []
    for index, item in enumerate(items):
        _add_item(messages, item, f"{param}.{index}")
    return messages


def output_messages(items: list[dict[str, Any]]) -> list[dict]:
    """Chat messages of a stored response's output items (message and function_call items;
    reasoning is dropped, as vLLM). A function call cut short (``incomplete``: a stream ended by
    ``max_output_tokens`` inside it) whose arguments are not JSON is the assistant's text, as
    the non-streamed response of the same text stores it (a chat turn's calls must be JSON)."""
    messages: list[dict] = []
    for index, item in enumerate(items):
        if item.get("type") == "reasoning":
            continue
        if item.get("type") == "function_call" and item.get("status") == "incomplete" \
                and not _is_json(item.get("arguments")):
            item = {"type": "message", "role": "assistant", "content": item.get("arguments") or ""}
        _add_item(messages, item, f"previous_response_id.output.{index}")
    return messages


def _is_json(text: Any) -> bool:
    try:
        json.loads(text)
    except (TypeError, ValueError):
        return False
    return True


def continues_final_message(items: str | list[dict[str, Any]]) -> bool:
    """Whether the last input item is an assistant message or reasoning item with status
    ``in_progress`` or ``incomplete``: the reply continues it (vLLM's
    ``should_continue_final_message``)."""
    if isinstance(items, str) or not items or not isinstance(items[-1], dict):
        return False
    last = items[-1]
    kind = last.get("type", "message")
    if kind == "message" and last.get("role") != "assistant" or kind not in ("message", "reasoning"):
        return False
    return last.get("status") in ("in_progress", "incomplete")


def _add_item(messages: list[dict], item: Any, param: str) -> None:
    if not isinstance(item, dict):
        raise InvalidRequestError("an input item must be an object", param=param)
    kind = item.get("type", "message")
    if kind == "message":
        _add_message(messages, item, param)
    elif kind == "function_call":
        arguments = _text(item, "arguments", param)
        if not _is_json(arguments):
            raise InvalidRequestError(f"arguments is not valid JSON: {arguments[:80]!r}", param=f"{param}.arguments")
        call = {"id": _text(item, "call_id", param), "type": "function",
                "function": {"name": _text(item, "name", param), "arguments": arguments}}
        turn = _assistant_turn(messages, "tool_calls")
        turn["tool_calls"] = [*(turn.get("tool_calls") or []), call]
    elif kind == "function_call_output":
        output = item.get("output")
        content = output if isinstance(output, str) else _joined_parts(output, ("input_text",), f"{param}.output")
        messages.append({"role": "tool", "content": content, "tool_call_id": _text(item, "call_id", param)})
    elif kind == "reasoning":
        _assistant_turn(messages, "reasoning")["reasoning"] = _reasoning_text(item, param)
    else:
        raise InvalidRequestError(f"input item type '{kind}' is not supported; supported are message, "
                                  "function_call, function_call_output and reasoning", param=f"{param}.type")


def _add_message(messages: list[dict], item: dict, param: str) -> None:
    role = item.get("role")
    if role not in MESSAGE_ROLES:
        raise InvalidRequestError(f"message role {role!r} is not supported; use one of {', '.join(MESSAGE_ROLES)}",
                                  param=f"{param}.role")
    content = item.get("content")
    text = content if isinstance(content, str) else _joined_parts(content, TEXT_PARTS[role], f"{param}.content")
    if role == "assistant":
        _assistant_turn(messages, "content")["content"] = text
    else:
        messages.append({"role": role, "content": text})


def _assistant_turn(messages: list[dict], part: str) -> dict:
    """The assistant turn a ``part`` joins: the last message when it is an assistant turn that
    has no ``part`` yet (tool calls always join), else a new one."""
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant" and (part == "tool_calls" or last.get(part) is None):
        return last
    messages.append({"role": "assistant", "content": None})
    return messages[-1]


def _joined_parts(parts: Any, kinds: tuple[str, ...], param: str) -> str:
    if not isinstance(parts, list):
        raise InvalidRequestError("content must be a string or a list of content parts", param=param)
    texts = []
    for index, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in kinds:
            raise InvalidRequestError(f"content part type {kind!r} is not supported here; only "
                                      f"{', '.join(kinds)} parts are (no images, files or audio)",
                                      param=f"{param}.{index}.type")
        texts.append(_text(part, "refusal" if kind == "refusal" else "text", f"{param}.{index}"))
    return "\n".join(texts)


def _reasoning_text(item: dict, param: str) -> str:
    """A reasoning item's text: its first ``content`` part, else its first summary (vLLM)."""
    if item.get("encrypted_content"):
        raise InvalidRequestError("Encrypted content is not supported.", param=f"{param}.encrypted_content")
    for key in ("content", "summary"):
        parts = item.get(key) or []
        if not isinstance(parts, list):
            raise InvalidRequestError(f"a reasoning item's {key} must be a list of parts ({{\"type\", \"text\"}})",
                                      param=f"{param}.{key}")
        if parts:
            return _text(parts[0], "text", f"{param}.{key}.0")
    return ""


def _text(item: Any, key: str, param: str) -> str:
    value = item.get(key) if isinstance(item, dict) else None
    if not isinstance(value, str):
        raise InvalidRequestError(f"'{key}' must be a string", param=f"{param}.{key}")
    return value


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict] | None:
    """Chat tools of Responses' flat function tools (None for none: ``[]`` means none here).

    Raises:
        InvalidRequestError: a tool that is not a function (web search, file search, computer
            use, code interpreter, MCP, image generation, custom, ...) or has no name.
    """
    converted = []
    for index, tool in enumerate(tools or []):
        kind = tool.get("type")
        if kind != "function":
            raise InvalidRequestError(f"tool type {kind!r} is not supported; only 'function' tools are "
                                      "(no built-in tools)", param=f"tools.{index}.type")
        function = {"name": _text(tool, "name", f"tools.{index}")}
        for key in ("description", "parameters", "strict"):
            if tool.get(key) is not None:
                function[key] = tool[key]
        converted.append({"type": "function", "function": function})
    return converted or None


def chat_tool_choice(tool_choice: str | dict | None, has_tools: bool) -> str | dict | None:
    """Chat's ``tool_choice``: without tools ``auto`` and ``none`` mean none (vLLM).

    Raises:
        InvalidRequestError: a choice other than none/auto/required/a named function.
    """
    if tool_choice is None or (not has_tools and tool_choice in ("auto", "none")):
        return None
    if tool_choice in ("none", "auto", "required"):
        return tool_choice
    if not isinstance(tool_choice, dict) or tool_choice.get("type") != "function" \
            or not isinstance(tool_choice.get("name"), str):
        raise InvalidRequestError(f"tool_choice {tool_choice!r} is not supported; use \"none\", \"auto\", "
                                  "\"required\" or {\"type\": \"function\", \"name\": ...}", param="tool_choice")
    return {"type": "function", "function": {"name": tool_choice["name"]}}


def response_format(request: ResponsesRequest) -> dict | None:
    """Chat's ``response_format`` of ``text.format`` (None: plain text)."""
    fmt = request.text.format if request.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    schema = {"name": fmt.name, "schema": fmt.schema_, "strict": fmt.strict, "description": fmt.description}
    return {"type": "json_schema", "json_schema": {k: v for k, v in schema.items() if v is not None}}


def chat_request(request: ResponsesRequest, conversation: list[dict]) -> ChatCompletionRequest:
    """The chat completion ``request`` stands for, ``conversation`` being its messages without
    the instructions (see the module docstring).

    Raises:
        InvalidRequestError: a tool or tool_choice kvserve does not implement, or a value chat's
            request model refuses (its field named as the Responses request names it).
    """
    tools = chat_tools(request.tools)
    messages = [{"role": "system", "content": request.instructions}] if request.instructions else []
    messages += conversation
    partial = continues_final_message(request.input)
    body = {name: getattr(request, name) for name in SHARED_FIELDS if getattr(request, name) is not None}
    body.update(messages=messages, tools=tools, tool_choice=chat_tool_choice(request.tool_choice, bool(tools)),
                max_completion_tokens=request.max_output_tokens, response_format=response_format(request),
                reasoning_effort=request.reasoning.effort if request.reasoning is not None else None,
                add_generation_prompt=not partial, continue_final_message=partial)
    if request.wants_logprobs:
        body.update(logprobs=True, top_logprobs=request.top_logprobs or 0)
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = responses_param(".".join(str(p) for p in first.get("loc", ())))
        raise InvalidRequestError(f"Invalid value for '{param}': {first.get('msg')}", param=param) from None


def responses_param(param: str | None) -> str | None:
    """A chat field's name as the Responses request names it (``messages.3.content`` -> ``input``)."""
    if param is None:
        return None
    if param.startswith("response_format.json_schema"):
        param = "response_format" + param[len("response_format.json_schema"):]
    head, _, rest = param.partition(".")
    if head in RESPONSES_PARAMS:
        return RESPONSES_PARAMS[head] if head == "messages" or not rest else f"{RESPONSES_PARAMS[head]}.{rest}"
    if head == "tools" and ".function." in param:
        return param.replace(".function.", ".", 1)
    return param


def renamed(exc: InvalidRequestError) -> InvalidRequestError:
    """``exc`` with its field renamed (and named so in the message: ``max_completion_tokens must
    be >= 1`` -> ``max_output_tokens must be >= 1``)."""
    new = responses_param(exc.param)
    if new == exc.param:
        return exc
    head = exc.param.partition(".")[0]
    message = exc.message.replace("response_format.json_schema", "response_format", 1)
    if head in RESPONSES_PARAMS and head != "messages":
        message = message.replace(head, RESPONSES_PARAMS[head], 1)
    return InvalidRequestError(message, param=new)
