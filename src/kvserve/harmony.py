"""OpenAI's harmony format (gpt-oss): its markers and an incremental reader of an assistant's output.

Source: OpenAI's harmony guide (cookbook.openai.com/articles/openai-harmony) and how vLLM reads
gpt-oss chat output (``vllm/entrypoints/harmony_utils.py``, ``parse_chat_output``). After a
prompt that ends in ``<|start|>assistant``, the model writes a run of messages::

    <|channel|>analysis<|message|>Let me think...<|end|>
    <|start|>assistant<|channel|>commentary to=functions.weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>

    message := header <|message|> body (<|end|> | <|call|> | <|return|>)
    header  := [role] [to=RECIPIENT] <|channel|>CHANNEL [to=RECIPIENT] [[<|constrain|>]CONTENT_TYPE]

Each marker is one special token of the o200k_harmony vocabulary, so the reader needs the text
detokenized with special tokens kept. ``<|return|>`` and ``<|call|>`` end generation (EOS ids),
and the engine leaves a finishing EOS out of the text: the end of the text ends the last message.

What a message is for the chat API (:func:`message_kind`, vLLM's rules):

=====================================  ==========================================
``to=functions.NAME`` (any channel)    a tool call to NAME; the body is its arguments
``analysis``                           reasoning (also when addressed to a built-in tool)
``final``, ``commentary`` (no ``to=``) content (commentary without recipient: a preamble)
``commentary to=`` another recipient   dropped (a built-in tool's call)
=====================================  ==========================================

Reading never raises; on text that breaks the format it does its best:

* a body also ends at ``<|start|>`` or ``<|channel|>`` (a new message whose ``<|end|>`` the model
  skipped); ``<|message|>`` and ``<|constrain|>`` inside a body are dropped;
* text between a message's end and the next ``<|start|>`` is dropped, as is a header that the
  text's end cut off; a ``<|message|>`` there opens a message without a header (content);
* an output with no marker at all (a model not speaking harmony) is one message without a
  header: content.

The reader is monotone, as the parsers' streaming needs (see :mod:`kvserve.tool_parsers.abstract`):
messages are only appended, the last one's body only grows at its end, and a possible marker at
the end of the text (``<|ch``) is held back until it resolves.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

START = "<|start|>"
END = "<|end|>"
MESSAGE = "<|message|>"
CHANNEL = "<|channel|>"
CONSTRAIN = "<|constrain|>"
RETURN = "<|return|>"
CALL = "<|call|>"
MARKERS = (START, END, MESSAGE, CHANNEL, CONSTRAIN, RETURN, CALL)
ENDS = (END, CALL, RETURN)
FUNCTIONS = "functions."

_LONGEST = max(len(m) for m in MARKERS)
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([^\s<]*)")


@dataclass(frozen=True)
class Header:
    """A message's header: ``channel`` (None when absent), ``recipient`` (``to=``), ``content_type``."""

    channel: str | None = None
    recipient: str | None = None
    content_type: str | None = None


def parse_header(text: str) -> Header:
    """The header of ``text`` (what comes before ``<|message|>``, role included or not)."""
    recipient = _RECIPIENT.search(text)
    channel = _CHANNEL.search(text)
    rest = text[channel.end():] if channel else text
    words = _RECIPIENT.sub(" ", rest.replace(CONSTRAIN, " ")).split()
    return Header(channel=(channel.group(1) or None) if channel else None,
                  recipient=recipient.group(1) if recipient else None,
                  content_type=words[0] if words and channel else None)


def message_kind(header: Header) -> str | None:
    """``"call"``, ``"reasoning"``, ``"content"``, or None (dropped): the table of the module
    docstring. A channel harmony does not define reads as content."""
    if header.recipient is not None:
        if header.recipient.startswith(FUNCTIONS) and len(header.recipient) > len(FUNCTIONS):
            return "call"
        return "reasoning" if header.channel == "analysis" else None
    return "reasoning" if header.channel == "analysis" else "content"


def function_name(header: Header) -> str:
    """The function a ``"call"`` message calls (``to=functions.NAME``)."""
    return header.recipient[len(FUNCTIONS):]


@dataclass
class HarmonyMessage:
    """One message as far as the text shows it; ``complete``: its end marker was read."""

    header: Header
    body: str = ""
    complete: bool = False


@dataclass
class HarmonyReader:
    """Reads a growing output text into messages (module docstring); feed it the whole text each
    time, the text only ever extended. Each :meth:`feed` scans only the new text."""

    text: str = ""
    messages: list[HarmonyMessage] = field(default_factory=list)
    _pos: int = 0  # text[:_pos] is read; the rest is a possible marker held back
    _header: str | None = ""  # the header being read; None inside a body or between messages
    _in_body: bool = False
    _seen_marker: bool = False

    def feed(self, text: str) -> None:
        self.text = text
        while self._pos < len(text):
            at = text.find("<|", self._pos)
            if at < 0:
                end = len(text) - (text[-1] == "<")  # a lone "<" may start a marker
                self._plain(text[self._pos:end])
                self._pos = end
                return
            self._plain(text[self._pos:at])
            self._pos = at
            marker = next((m for m in MARKERS if text.startswith(m, at)), None)
            if marker is None:
                rest = text[at:]
                if len(rest) < _LONGEST and any(m.startswith(rest) for m in MARKERS):
                    return  # may still become a marker
                self._plain("<|")
                self._pos = at + 2
                continue
            self._seen_marker = True
            self._marker(marker)
            self._pos = at + len(marker)

    def _plain(self, text: str) -> None:
        if not text:
            return
        if self._in_body:
            self.messages[-1].body += text
        elif self._header is not None:
            self._header += text

    def _marker(self, marker: str) -> None:
        if self._in_body:
            if marker in (MESSAGE, CONSTRAIN):
                return  # stray markers inside a body are dropped
            self.messages[-1].complete = True
            self._in_body = False
            self._header = {START: "", CHANNEL: CHANNEL}.get(marker)
        elif self._header is None:  # between messages
            self._header = {START: "", CHANNEL: CHANNEL, MESSAGE: ""}.get(marker)
            if marker == MESSAGE:
                self._open()
        elif marker == MESSAGE:
            self._open()
        elif marker == START:
            self._header = ""
        elif marker in ENDS:
            self._header = None  # a message without a body
        else:
            self._header += marker

    def _open(self) -> None:
        self.messages.append(HarmonyMessage(parse_header(self._header)))
        self._header, self._in_body = None, True

    def state(self, final: bool) -> list[HarmonyMessage]:
        """The messages so far; ``final`` (the text is all there is) releases a held possible
        marker as text, completes the last message, and reads a text without any marker as
        one content message. The reader itself is left as it was."""
        if not final:
            return self.messages
        tail = self.text[self._pos:]
        if not self._seen_marker and not self.messages:
            return [HarmonyMessage(Header(), self.text, complete=True)] if self.text else []
        messages = list(self.messages)
        if self._in_body:
            messages[-1] = replace(messages[-1], body=messages[-1].body + tail, complete=True)
        return messages


def joined(messages: list[HarmonyMessage], kind: str) -> str:
    """The bodies of the messages of ``kind``, one per line (vLLM joins several with ``\\n``)."""
    return "\n".join(m.body for m in messages if message_kind(m.header) == kind)
