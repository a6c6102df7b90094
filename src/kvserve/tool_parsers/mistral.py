"""``mistral``: calls after the ``[TOOL_CALLS]`` token, in either of Mistral's two forms.

As mistral_common encodes an assistant's tool calls (``InstructTokenizerV2``..``V7`` and
``V11``..``V13`` in ``mistral_common/tokens/tokenizers/instruct.py``) and vLLM's
``MistralToolParser`` reads them back:

* tokenizer < v11: ``[TOOL_CALLS] [{"name": "f", "arguments": {...}, "id": "..."}, ...]``,
  one JSON array;
* tokenizer >= v11: ``[TOOL_CALLS]f[ARGS]{...}[TOOL_CALLS]g[ARGS]{...}``, with
  ``[CALL_ID]id`` before ``[ARGS]`` in v11, and ``f{...}`` when the special tokens were dropped.

The form is told from the text (``[`` after the token starts the array form). Content is the
text before the first ``[TOOL_CALLS]``. Ids are Mistral's 9-character alphanumeric ones.
"""

from __future__ import annotations

import re

from kvserve.tool_parsers.abstract import (
    ParseContext,
    ParsedCall,
    ParseState,
    ToolParser,
    register_tool_parser,
)
from kvserve.tool_parsers.json_calls import CallArrayReader, partial_suffix, skip_whitespace
from kvserve.tool_parsers.json_scan import JsonObjectScanner
from kvserve.tool_parsers.types import make_mistral_tool_call_id

BOT = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"
_NAME_CHARS = re.compile(r"[A-Za-z0-9_.\-]*")


class MistralContext(ParseContext):
    def __init__(self):
        self.text = ""
        self.content_end: int | None = None
        self.phase = "content"  # content, after_bot, name, args, after_call, array, done
        self.cursor = 0
        self.name = ""
        self.scanner: JsonObjectScanner | None = None
        self.args_start = 0
        self.array: CallArrayReader | None = None
        self.calls: list[ParsedCall] = []
        self.failed = False

    def feed(self, text: str) -> None:
        self.text = text
        while not self.failed and self._advance():
            pass

    def _advance(self) -> bool:
        """One phase step; False when more text is needed (or parsing is over)."""
        step = getattr(self, f"_phase_{self.phase}", None)
        return step() if step is not None else False

    def _phase_content(self) -> bool:
        found = self.text.find(BOT, self.cursor)
        if found < 0:
            self.cursor = max(self.cursor, len(self.text) - len(BOT) + 1)
            return False
        self.content_end = found
        self.cursor, self.phase = found + len(BOT), "after_bot"
        return True

    def _phase_after_bot(self) -> bool:
        at = skip_whitespace(self.text, self.cursor)
        if at >= len(self.text):
            return False
        if self.text[at] == "[" and not self.text.startswith(ARGS, at) and not self.text.startswith(
                CALL_ID, at):
            if ARGS.startswith(self.text[at:]) or CALL_ID.startswith(self.text[at:]):
                return False
            self.array, self.phase = CallArrayReader(at), "array"
            return True
        self.cursor, self.phase = at, "name"
        return True

    def _phase_name(self) -> bool:
        rest = self.text[self.cursor:]
        ends = [i for i in (rest.find(ARGS), rest.find(CALL_ID), rest.find("{")) if i >= 0]
        if not ends:
            held = partial_suffix(rest, ARGS) or partial_suffix(rest, CALL_ID)
            self.failed = _NAME_CHARS.fullmatch(rest[: len(rest) - held]) is None
            return False
        end = min(ends)
        self.name = rest[:end]
        if not self.name or _NAME_CHARS.fullmatch(self.name) is None:
            self.failed = True
            return False
        marker = rest[end:]
        if marker.startswith(CALL_ID):
            args_at = rest.find(ARGS, end)
            if args_at < 0:
                return False
            start = self.cursor + args_at + len(ARGS)
        else:
            start = self.cursor + end + (len(ARGS) if marker.startswith(ARGS) else 0)
        self.scanner, self.args_start = JsonObjectScanner(start), start
        self.calls.append(ParsedCall())
        self.phase = "args"
        return True

    def _phase_args(self) -> bool:
        scanner = self.scanner
        scanner.feed(self.text)
        if scanner.error:
            self.failed = True
            return False
        brace = skip_whitespace(self.text, self.args_start)
        started = brace < scanner.pos
        end = scanner.end if scanner.done else scanner.pos
        self.calls[-1] = ParsedCall(name=self.name if started else None,
                                    arguments=self.text[brace:end] if started else "",
                                    complete=scanner.done)
        if not scanner.done:
            return False
        self.cursor, self.phase = scanner.end, "after_call"
        return True

    def _phase_after_call(self) -> bool:
        at = skip_whitespace(self.text, self.cursor)
        rest = self.text[at:]
        if rest.startswith(BOT):
            self.cursor, self.phase = at + len(BOT), "after_bot"
            return True
        if not BOT.startswith(rest):
            self.phase = "done"  # text after the calls is dropped
        return False

    def _phase_array(self) -> bool:
        self.array.feed(self.text)
        self.calls = list(self.array.calls)
        self.failed = self.array.failed
        if self.array.done:
            self.phase = "done"  # text after the array is dropped
        return False

    def state(self, final: bool) -> ParseState:
        if self.content_end is not None:
            content = self.text[: self.content_end]
        elif final:
            content = self.text
        else:
            content = self.text[: len(self.text) - partial_suffix(self.text, BOT)]
        unclosed = final and self.array is not None and not self.array.done
        return ParseState(content=content, calls=list(self.calls), failed=self.failed or unclosed)


@register_tool_parser("mistral")
class MistralToolParser(ToolParser):
    """Mistral ``[TOOL_CALLS]`` calls, array or ``name[ARGS]{...}`` form (module docstring)."""

    @staticmethod
    def default_id() -> str:
        return make_mistral_tool_call_id()

    def new_context(self) -> MistralContext:
        return MistralContext()
