"""``openai``: GPT-OSS's tool calls, harmony messages addressed ``to=functions.NAME``.

vLLM's ``OpenAIToolParser`` and its harmony streaming (``vllm/tool_parsers/openai_tool_parser.py``,
``stream_harmony.py``): a message to ``functions.NAME``, on the ``commentary`` channel (or
``analysis``), is a call to NAME whose arguments are the message body::

    <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>
    <|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{}<|call|>

The content is what :mod:`kvserve.reasoning.gpt_oss` calls content (the ``final`` messages and
the preambles, joined with ``\\n``); the ``analysis`` messages are never content, so this parser
reads the model's whole text (``reads_whole_output``) and not a reasoning parser's answer.

Differences from vLLM, both for split-invariance (the stream adds up to the whole-text reply):
the arguments are the body as the model wrote it (vLLM's non-streamed reply re-serializes valid
JSON with ``json.dumps``; its stream sends the body), and several content messages are joined
with ``\\n`` in streams too. A call needs no ``<|call|>``: the engine leaves that EOS out of the
text, so a call cut by ``max_tokens`` reads as a call with the arguments written so far (the
``finish_reason`` is then ``length``). The name is sent once the header is complete
(``<|message|>``), with the arguments written so far, possibly ``""``.
"""

from __future__ import annotations

from kvserve import harmony
from kvserve.tool_parsers.abstract import (ParseContext, ParsedCall, ParseState, ToolParser,
                                           register_tool_parser)


class HarmonyContext(ParseContext):
    def __init__(self):
        self.reader = harmony.HarmonyReader()

    def feed(self, text: str) -> None:
        self.reader.feed(text)

    def state(self, final: bool) -> ParseState:
        messages = self.reader.state(final)
        calls = [ParsedCall(name=harmony.function_name(m.header), arguments=m.body, complete=m.complete)
                 for m in messages if harmony.message_kind(m.header) == "call"]
        return ParseState(content=harmony.joined(messages, "content"), calls=calls)


@register_tool_parser("openai")
class OpenAIToolParser(ToolParser):
    """GPT-OSS harmony calls (see the module docstring)."""

    reads_whole_output = True

    def new_context(self) -> HarmonyContext:
        return HarmonyContext()

    def content_without_calls(self, state: ParseState, text: str) -> str:
        return state.content
