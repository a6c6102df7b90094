"""An Anthropic Messages request as the chat completion kvserve runs (vLLM 0.32's
``AnthropicServingMessages.to_chat_completion_request``), and the refusals of what kvserve does
not implement, each a 400 naming the field.

    system (text or text blocks)            -> one leading system message (blocks joined)
    messages[i] user / assistant / system    -> chat messages, in order:
        text blocks                          -> content (one block: a string; more: text parts)
        thinking blocks                      -> the turn's reasoning (joined); redacted: dropped
        tool_use {id, name, input}           -> assistant tool_calls (arguments: input as JSON)
        tool_result {tool_use_id, content}   -> a tool message before the turn's text (is_error
                                                is not shown to the model, as vLLM)
    a last assistant turn                    -> continued (prefill), not closed
    tools [{name, description, input_schema}]-> function tools (input_schema type "object" by default)
    tool_choice auto | any | tool | none     -> "auto" | "required" | named | "none";
        disable_parallel_tool_use            -> parallel_tool_calls false
    max_tokens, stop_sequences, temperature, top_p, top_k, metadata.user_id, cache_salt
                                             -> max_tokens, stop, ..., user, cache_salt
    thinking disabled / adaptive             -> reasoning_effort (see TemplateFacts) / nothing
    output_config effort / format            -> reasoning_effort / response_format json_schema

Refused (400): image, document and other non-text blocks; server tools (a tool ``type`` other
than ``custom``); ``defer_loading``; ``thinking`` ``enabled`` (no reasoning budget is enforced);
``container``, ``mcp_servers``, ``context_management``, ``diagnostics``, ``inference_geo``,
``speed: "fast"``; the vLLM extensions of ``kvserve.api.protocol.UNSUPPORTED_FIELDS``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from kvserve.api.anthropic_protocol import (AnthropicMessagesRequest, AnthropicPromptRequest, MessageParam,
                                            ThinkingDisabled, ThinkingEnabled, ToolChoiceAny, ToolChoiceNone,
                                            ToolChoiceTool, ToolParam)
from kvserve.api.chat_protocol import ChatCompletionRequest
from kvserve.errors import InvalidRequestError

# Claude Code's per-request attribution header: dropped, as vLLM does, so the prefix cache hits.
BILLING_HEADER = "x-anthropic-billing-header"

# Anthropic request fields kvserve cannot honour: refused unless null.
UNSUPPORTED: dict[str, str] = {
    "container": "containers (code execution) are not supported",
    "mcp_servers": "MCP servers are not supported; give the tools as client tools",
    "context_management": "server-side context management is not supported",
    "diagnostics": "prompt-cache diagnostics are not supported",
    "inference_geo": "the inference region cannot be chosen",
    "kv_transfer_params": "disaggregated prefill/decode (KV transfer) applies to /v1/completions and "
                          "/v1/chat/completions",
}

# OpenAI chat fields a client may send to the Messages API by mistake: refused with the Anthropic
# field to use (Anthropic's API refuses unknown fields; vLLM's ignores them).
CHAT_ONLY_FIELDS: dict[str, str] = {
    "max_completion_tokens": "use max_tokens",
    "stop": "use stop_sequences",
    "n": "a message has one reply",
    "best_of": "a message has one reply",
    "logprobs": "the Messages API has no logprobs; use /v1/chat/completions",
    "top_logprobs": "the Messages API has no logprobs; use /v1/chat/completions",
    "response_format": "use output_config.format",
    "seed": "the Messages API has no seed; use /v1/chat/completions",
    "frequency_penalty": "the Messages API has no penalties; use /v1/chat/completions",
    "presence_penalty": "the Messages API has no penalties; use /v1/chat/completions",
}

_BLOCK_REASONS = {
    "image": "images are not supported (kvserve serves text-only models)",
    "document": "documents are not supported (kvserve serves text-only models); send their text",
    "search_result": "search result blocks are not supported; send their text",
    "tool_reference": "tool search (tool_reference blocks) is not supported",
    "container_upload": "containers are not supported",
}

# Chat field names in errors -> the Anthropic request's names.
_PARAM_NAMES = (("max_completion_tokens", "max_tokens"), ("stop", "stop_sequences"),
                ("response_format", "output_config.format"), ("reasoning_effort", "output_config.effort"),
                ("user", "metadata.user_id"), ("tool_choice.function.name", "tool_choice.name"))


@dataclass(frozen=True)
class TemplateFacts:
    """What the server's chat template asks of the translation (probed once per server, vLLM's
    rules, ``kvserve.api.serving_messages``).

    Attributes:
        merge_inline_system: the template refuses a system message after the first turn, so
            ``system`` turns inside ``messages`` are appended to the leading system prompt.
        disabled_thinking_effort: the ``reasoning_effort`` of ``thinking: {"type": "disabled"}``:
            ``"none"``, or ``"low"`` when the template renders ``"none"`` like a real effort
            (or fails on it).
    """

    merge_inline_system: bool = False
    disabled_thinking_effort: str = "none"


def to_chat_request(request: AnthropicPromptRequest, facts: TemplateFacts = TemplateFacts()) -> ChatCompletionRequest:
    """The chat completion that runs ``request`` (a ``count_tokens`` request: its prompt only).

    Raises:
        InvalidRequestError: an unsupported block, tool or field (named in ``param``), or a
            conversation with nothing to render.
    """
    check_supported(request)
    messages = chat_messages(request, facts.merge_inline_system)
    if not messages:
        raise InvalidRequestError("the conversation has no content to send", param="messages")
    body: dict[str, Any] = {"model": request.model, "messages": messages,
                            "chat_template_kwargs": request.chat_template_kwargs}
    if request.messages[-1].role == "assistant":  # Anthropic's prefill: the reply continues it
        body.update(add_generation_prompt=False, continue_final_message=True)
    tools = chat_tools(request.tools)
    if tools is not None:
        body["tools"] = tools
    body.update(_tool_choice(request))
    body.update(_reasoning_and_format(request, facts))
    if isinstance(request, AnthropicMessagesRequest):
        body.update(_sampling(request))
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:  # the Anthropic model admitted it, so the chat model should too
        raise InvalidRequestError(f"the request cannot be run as a chat completion: {exc.errors()[0]['msg']}",
                                  param="messages") from None


def check_supported(request: AnthropicPromptRequest) -> None:
    """Raises InvalidRequestError naming a field kvserve does not implement (module docstring)."""
    extras = request.model_extra or {}
    for name, reason in UNSUPPORTED.items():
        if extras.get(name) is not None:
            raise InvalidRequestError(f"{name} is not supported by this server: {reason}", param=name)
    for name, hint in CHAT_ONLY_FIELDS.items():
        if name in extras:
            raise InvalidRequestError(f"{name} is an OpenAI chat field, not a Messages API one: {hint}", param=name)
    if extras.get("speed") not in (None, "standard"):
        raise InvalidRequestError(f"speed {extras['speed']!r} is not supported by this server: it has one speed "
                                  "('standard')", param="speed")
    request.check_unsupported_fields()
    if isinstance(request.thinking, ThinkingEnabled):
        raise InvalidRequestError(
            "thinking {\"type\": \"enabled\"} is not supported: this server enforces no budget_tokens of "
            "reasoning; send {\"type\": \"adaptive\"} (the model reasons within max_tokens) or "
            "{\"type\": \"disabled\"}", param="thinking.type")


def chat_messages(request: AnthropicPromptRequest, merge_inline_system: bool) -> list[dict]:
    """``system`` and ``messages`` as chat messages (module docstring)."""
    parts = []
    if isinstance(request.system, str):
        parts.append(request.system)
    elif request.system is not None:
        parts.extend(_system_texts(request.system, "system"))
    if merge_inline_system:
        for i, message in enumerate(request.messages):
            if message.role == "system":
                parts.extend(_system_texts(message.content, f"messages.{i}.content"))
    out: list[dict] = []
    if any(parts):
        out.append({"role": "system", "content": "".join(parts)})
    for i, message in enumerate(request.messages):
        if message.role != "system":
            _add_turn(message, i, out)
        elif not merge_inline_system:
            text = "".join(_system_texts(message.content, f"messages.{i}.content"))
            if text:
                out.append({"role": "system", "content": text})
    return out


def _system_texts(content, param: str) -> list[str]:
    """The texts of system content (a string or text blocks), without Claude Code's billing header.

    Raises:
        InvalidRequestError: a block that is not text.
    """
    if isinstance(content, str):
        return [] if content.startswith(BILLING_HEADER) else [content]
    texts = []
    for j, block in enumerate(content):
        if block.type != "text":
            raise InvalidRequestError(f"a system prompt holds text blocks only, got '{block.type}'",
                                      param=f"{param}.{j}.type")
        if block.text and not block.text.startswith(BILLING_HEADER):
            texts.append(block.text)
    return texts


def _add_turn(message: MessageParam, index: int, out: list[dict]) -> None:
    """Append the chat messages of a user or assistant turn: its tool results (user), then the
    turn itself unless a user turn holds nothing but tool results."""
    if isinstance(message.content, str):
        out.append({"role": message.role, "content": message.content})
        return
    texts: list[str] = []
    calls: list[dict] = []
    reasoning: list[str] = []
    for j, block in enumerate(message.content):
        param = f"messages.{index}.content.{j}"
        if block.type == "text":
            if block.text:
                texts.append(block.text)
        elif block.type == "thinking" and message.role == "assistant":
            reasoning.append(block.thinking)
        elif block.type == "redacted_thinking" and message.role == "assistant":
            pass
        elif block.type == "tool_use" and message.role == "assistant":
            calls.append({"id": block.id, "type": "function",
                          "function": {"name": block.name, "arguments": json.dumps(block.input)}})
        elif block.type == "tool_result" and message.role == "user":
            out.append({"role": "tool", "tool_call_id": block.tool_use_id,
                        "content": _tool_result_text(block.content, param)})
        else:
            raise InvalidRequestError(_refusal(block.type, message.role), param=f"{param}.type")
    turn: dict[str, Any] = {"role": message.role}
    if reasoning:
        turn["reasoning"] = "".join(reasoning)
    if calls:
        turn["tool_calls"] = calls
    if len(texts) == 1:
        turn["content"] = texts[0]
    elif texts:
        turn["content"] = [{"type": "text", "text": text} for text in texts]
    if message.role == "assistant" or "content" in turn:
        out.append(turn)


def _refusal(block_type: str, role: str) -> str:
    if block_type in ("thinking", "redacted_thinking", "tool_use"):
        return f"{block_type} blocks belong to assistant turns, not {role} turns"
    if block_type == "tool_result":
        return f"tool_result blocks belong to user turns, not {role} turns"
    if block_type.startswith(("server_tool_use", "web_", "code_execution", "bash_code", "text_editor_code",
                              "tool_search", "mcp_")):
        return f"'{block_type}' blocks of server tools are not supported"
    reason = _BLOCK_REASONS.get(block_type, "supported blocks are text, thinking, redacted_thinking, "
                                            "tool_use and tool_result")
    return f"'{block_type}' blocks are not supported by this server: {reason}"


def _tool_result_text(content, param: str) -> str:
    """A tool result's content as text (text blocks joined with newlines, as vLLM).

    Raises:
        InvalidRequestError: a block that is not text (an image, a document, ...).
    """
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for k, block in enumerate(content):
        if block.type != "text":
            raise InvalidRequestError(f"a tool result holds text blocks only: {_refusal(block.type, 'user')}",
                                      param=f"{param}.content.{k}.type")
        texts.append(block.text)
    return "\n".join(texts)


def chat_tools(tools: list[ToolParam] | None) -> list[dict] | None:
    """Client tools as chat function tools (``[]``: no tools, as Anthropic accepts it).

    Raises:
        InvalidRequestError: a server tool, a tool without ``input_schema``, ``defer_loading``.
    """
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.type not in (None, "custom"):
            raise InvalidRequestError(f"server tool '{tool.type}' is not supported; only client tools "
                                      "({name, description, input_schema}) are", param=f"tools.{i}.type")
        if tool.input_schema is None:
            raise InvalidRequestError("a client tool needs input_schema", param=f"tools.{i}.input_schema")
        if tool.defer_loading:
            raise InvalidRequestError("defer_loading (tool search) is not supported",
                                      param=f"tools.{i}.defer_loading")
        schema = dict(tool.input_schema)
        schema.setdefault("type", "object")  # vLLM's default
        function: dict[str, Any] = {"name": tool.name, "parameters": schema}
        if tool.description is not None:
            function["description"] = tool.description
        if tool.strict is not None:
            function["strict"] = tool.strict
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(request: AnthropicPromptRequest) -> dict[str, Any]:
    choice = request.tool_choice
    if choice is None:
        return {}
    if isinstance(choice, ToolChoiceNone):
        return {"tool_choice": "none"}
    fields: dict[str, Any] = {"parallel_tool_calls": not choice.disable_parallel_tool_use}
    if isinstance(choice, ToolChoiceTool):
        fields["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    else:
        fields["tool_choice"] = "required" if isinstance(choice, ToolChoiceAny) else "auto"
    return fields


def _reasoning_and_format(request: AnthropicPromptRequest, facts: TemplateFacts) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    config = request.output_config
    if config is not None and config.effort is not None:
        fields["reasoning_effort"] = config.effort
    if config is not None and config.format is not None:
        fields["response_format"] = {"type": "json_schema",
                                     "json_schema": {"name": "json_schema", "schema": config.format.json_schema}}
    if isinstance(request.thinking, ThinkingDisabled):  # over output_config.effort, as vLLM
        fields["reasoning_effort"] = facts.disabled_thinking_effort
    return fields


def _sampling(request: AnthropicMessagesRequest) -> dict[str, Any]:
    fields = {"max_tokens": request.max_tokens, "stop": request.stop_sequences, "temperature": request.temperature,
              "top_p": request.top_p, "top_k": request.top_k, "cache_salt": request.cache_salt,
              "user": request.metadata.user_id if request.metadata is not None else None}
    if request.stream:  # every chunk carries the running usage: message_start reads the prompt's
        fields.update(stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True})
    return fields


def anthropic_param(param: str | None) -> str | None:
    """A chat request's field name (in an error) as the Anthropic request names it; message
    indices do not map one to one, so ``messages.3.content`` becomes ``messages``."""
    if param is None:
        return None
    if param.startswith("messages."):
        return "messages"
    if param.startswith("tools.") and ".function." in param:
        return param.replace(".function.parameters", ".input_schema").replace(".function.", ".")
    for chat, anthropic in _PARAM_NAMES:
        if param == chat or param.startswith(chat + "."):
            return anthropic + param[len(chat):] if chat != "response_format" else anthropic
    return param
