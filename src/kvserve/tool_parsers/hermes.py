"""``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Hermes 2 Pro,
Qwen2.5, Qwen3).

The format of the Qwen2.5/Qwen3 chat templates ("For each function call, return a json object
with function name and arguments within <tool_call></tool_call> XML tags") and of vLLM's
``Hermes2ProToolParser``: any number of tagged calls; the text before the first tag is the
content; text between or after calls is dropped (as vLLM). A last call whose JSON is complete
but whose closing tag never came (EOS right after ``}``) counts, as in vLLM; one cut inside its
closing tag (``}</tool_`` at ``max_tokens``) makes the whole output content, as vLLM's
``json.loads`` of ``{...}</tool_`` fails there.
"""

from __future__ import annotations

from kvserve.tool_parsers.abstract import (
    ParseContext,
    ParsedCall,
    ParseState,
    ToolParser,
    register_tool_parser,
)
from kvserve.tool_parsers.json_calls import call_from_object, partial_suffix, skip_whitespace
from kvserve.tool_parsers.json_scan import JsonObjectScanner

START = "<tool_call>"
END = "</tool_call>"


class _Region:
    def __init__(self, start: int):
        self.scanner = JsonObjectScanner(start)
        self.call = ParsedCall()
        self.closed_at: int | None = None


class HermesContext(ParseContext):
    def __init__(self):
        self.text = ""
        self.content_end: int | None = None
        self.search_from = 0
        self.regions: list[_Region] = []
        self.failed = False

    def feed(self, text: str) -> None:
        self.text = text
        while not self.failed:
            if not self.regions or self.regions[-1].closed_at is not None:
                if not self._open_next_region():
                    return
            region = self.regions[-1]
            region.scanner.feed(text)
            region.call, failed = call_from_object(region.scanner, text)
            if failed:
                self.failed = True
                return
            if not region.scanner.done or not self._close(region):
                return

    def _open_next_region(self) -> bool:
        found = self.text.find(START, self.search_from)
        if found < 0:
            self.search_from = max(self.search_from, len(self.text) - len(START) + 1)
            return False
        if self.content_end is None:
            self.content_end = found
        self.regions.append(_Region(found + len(START)))
        return True

    def _close(self, region: _Region) -> bool:
        """Whether the closing tag follows the object (marks failure on anything else)."""
        at = skip_whitespace(self.text, region.scanner.end)
        seen = self.text[at:at + len(END)]
        if seen == END:
            region.closed_at = self.search_from = at + len(END)
            return True
        if not END.startswith(seen):
            self.failed = True
        return False

    def state(self, final: bool) -> ParseState:
        failed = self.failed or (final and self._cut_in_closing_tag())
        if self.content_end is not None:
            content = self.text[: self.content_end]
        elif final:
            content = self.text
        else:
            content = self.text[: len(self.text) - partial_suffix(self.text, START)]
        return ParseState(content=content, calls=[r.call for r in self.regions], failed=failed)

    def _cut_in_closing_tag(self) -> bool:
        """The output ends after a complete last call, inside the tag that would close it."""
        region = self.regions[-1] if self.regions else None
        if region is None or region.closed_at is not None or not region.scanner.done:
            return False
        return bool(self.text[skip_whitespace(self.text, region.scanner.end):])


@register_tool_parser("hermes")
class HermesToolParser(ToolParser):
    """Qwen2.5 / Qwen3 / Hermes ``<tool_call>`` JSON calls (see the module docstring)."""

    def new_context(self) -> HermesContext:
        return HermesContext()
