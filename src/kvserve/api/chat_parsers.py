"""Tool calling and reasoning in ``/v1/chat/completions``: what the server's flags provide
(:class:`ChatParsers`, built once) and what one request asks for (:class:`ChatPlan`).

    --enable-auto-tool-choice --tool-call-parser NAME --reasoning-parser NAME
        │  ChatParsers.from_settings: parser classes, checked against the tokenizer at start
        ▼
    request ──► ChatParsers.plan(request) ──► ChatPlan
                  tool_choice resolved with vLLM's defaults and errors
                  tools and template variables for the chat template
                  (reasoning_effort -> enable_thinking, --default-chat-template-kwargs)
    SamplingParams ──► plan.sampling_params(params)
                  required / a named function: StructuredOutputsParams(json=forcing schema,
                  source="tool_choice"); special tokens kept when a parser must see them
    plan.grammar_reasoning(params) ──► InputProcessor.process(reasoning=): a constraint starts after </think>
    plan.choice_output(params) ──► one ChoiceOutput per choice (kvserve.api.chat_output)

``tool_choice`` semantics (vLLM's chat protocol and serving, OpenAI's API reference):

* omitted: ``"auto"`` when ``tools`` are given, else ``"none"``;
* ``"none"``: the tools are shown to the template (unless
  ``--exclude-tools-when-tool-choice-none``) and the reply is plain text;
* ``"auto"``: needs ``--enable-auto-tool-choice`` and ``--tool-call-parser`` (else vLLM's 400);
  the parser reads what the model writes;
* ``"required"`` / ``{"type": "function", "function": {"name": N}}``: constrained decoding to
  a valid call whose arguments validate against the tool's ``parameters`` (no flag needed);
  together with another structured-output constraint: a 400 (vLLM refuses it for a named
  function and silently drops the other constraint for ``required``; kvserve refuses both).
  With ``parallel_tool_calls: false``, ``required`` is constrained to one call.
* ``finish_reason`` is ``"tool_calls"`` when a call was returned and the model stopped, except
  for a named function (``"stop"``, OpenAI's rule as vLLM states it).

Reasoning (vLLM's ``include_reasoning`` and ``reasoning_effort``): ``include_reasoning: false``
drops the reasoning and its logprobs from the reply, and a constraint then applies from the
first token (vLLM's ``resolve_reasoning_ended``), so such a reply is read as all answer.
The output is never judged by the prompt's think tags: a conversation whose earlier assistant
turn closed a think block would otherwise read a new ``<think>`` as content.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from kvserve.api.chat_output import ChoiceOutput
from kvserve.errors import InvalidRequestError
from kvserve.reasoning import ReasoningParser, get_reasoning_parser
from kvserve.sampling_params import SamplingParams
from kvserve.structured_output.params import StructuredOutputsParams
from kvserve.tool_parsers import (ForcedToolCallParser, ToolParser, forced_tool_schema, get_tool_parser,
                                  validate_tool_choice)

if TYPE_CHECKING:
    from kvserve.api.chat_protocol import ChatCompletionRequest
    from kvserve.api.settings import ServerSettings

AUTO_NEEDS_FLAGS = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
BOTH_CONSTRAINTS = "You can only either use constraints for structured outputs or tools, not both."


def _special_token_ids(tokenizer: Any) -> frozenset[int]:
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    ids = {token_id for token_id, token in decoder.items() if getattr(token, "special", False)}
    return frozenset(ids | set(getattr(tokenizer, "all_special_ids", []) or []))


@dataclass(frozen=True)
class ChatParsers:
    """The server's tool-call and reasoning parsers (built once, from flags).

    Attributes:
        tokenizer: the model's tokenizer (parsers are built with it).
        tool_parser: the ``--tool-call-parser`` class, or None.
        enable_auto_tool_choice: ``--enable-auto-tool-choice``.
        exclude_tools_when_tool_choice_none: ``--exclude-tools-when-tool-choice-none``.
        reasoning_parser: the ``--reasoning-parser`` class, or None.
        reasoning_tags_special: the reasoning parser's markers (think tags, harmony's markers)
            are special tokens of this tokenizer, so the text must keep special tokens for the
            parser to see them.
        default_chat_template_kwargs: ``--default-chat-template-kwargs``.
    """

    tokenizer: Any = None
    tool_parser: type[ToolParser] | None = None
    enable_auto_tool_choice: bool = False
    exclude_tools_when_tool_choice_none: bool = False
    reasoning_parser: type[ReasoningParser] | None = None
    reasoning_tags_special: bool = False
    default_chat_template_kwargs: Mapping[str, Any] | None = None

    @classmethod
    def from_settings(cls, settings: ServerSettings, tokenizer: Any) -> ChatParsers:
        """Raises:
            ValueError: an unknown parser name (the message lists the allowed ones),
                ``--enable-auto-tool-choice`` without ``--tool-call-parser``, or a reasoning
                parser whose tags are not tokens of this model's vocabulary.
        """
        tool_parser = get_tool_parser(settings.tool_call_parser) if settings.tool_call_parser else None
        if settings.enable_auto_tool_choice and tool_parser is None:
            raise ValueError("--enable-auto-tool-choice requires --tool-call-parser")
        reasoning_parser = get_reasoning_parser(settings.reasoning_parser) if settings.reasoning_parser else None
        special = False
        if reasoning_parser is not None:
            probe = reasoning_parser(tokenizer)  # raises ValueError without the tags
            special = bool(probe.marker_token_ids() & _special_token_ids(tokenizer))
        return cls(tokenizer, tool_parser, settings.enable_auto_tool_choice,
                   settings.exclude_tools_when_tool_choice_none, reasoning_parser, special,
                   dict(settings.default_chat_template_kwargs or {}) or None)

    def template_kwargs(self, request: Any) -> dict[str, Any]:
        """Template variables: the server's defaults, the request's ``chat_template_kwargs`` over
        them, and vLLM's ``reasoning_effort`` (passed as a variable; it also sets
        ``enable_thinking`` to ``reasoning_effort != "none"`` unless the request sets it)."""
        requested = dict(getattr(request, "chat_template_kwargs", None) or {})
        kwargs = {**(self.default_chat_template_kwargs or {}), **requested}
        effort = getattr(request, "reasoning_effort", None)
        if effort is not None:
            kwargs.setdefault("reasoning_effort", effort)
            if "enable_thinking" not in requested:
                kwargs["enable_thinking"] = effort != "none"
        return kwargs

    def plan(self, request: ChatCompletionRequest) -> ChatPlan:
        """The tool and reasoning handling of ``request``.

        Raises:
            InvalidRequestError: a ``tool_choice``/``tools`` mistake (vLLM's messages), or
                ``"auto"`` without the server flags.
        """
        tools = None if request.tools is None else [tool.model_dump(exclude_none=True) for tool in request.tools]
        tool_choice = request.tool_choice
        if hasattr(tool_choice, "model_dump"):
            tool_choice = tool_choice.model_dump()
        choice = validate_tool_choice(tool_choice, tools)  # [] is refused here
        if choice == "auto" and not (self.enable_auto_tool_choice and self.tool_parser is not None):
            raise InvalidRequestError(
                f"{AUTO_NEEDS_FLAGS} (a request with tools and no tool_choice asks for \"auto\"; "
                "send tool_choice \"none\" for a plain-text reply)", param="tool_choice")
        shown = None if choice == "none" and self.exclude_tools_when_tool_choice_none else tools
        return ChatPlan(self, choice, tools, shown, self.template_kwargs(request),
                        request.include_reasoning, request.parallel_tool_calls)


@dataclass(frozen=True)
class ChatPlan:
    """One request's tool and reasoning handling (see the module docstring).

    Attributes:
        parsers: the server's parsers.
        tool_choice: the effective choice: ``"none"``, ``"auto"``, ``"required"`` or
            ``{"type": "function", "function": {"name": N}}``.
        tools: the request's tools as JSON (None without tools).
        template_tools: the tools the chat template shows (None: none).
        template_kwargs: the template variables.
        include_reasoning: vLLM's ``include_reasoning``.
        parallel_tool_calls: OpenAI's ``parallel_tool_calls``.
    """

    parsers: ChatParsers
    tool_choice: str | dict
    tools: list[dict] | None
    template_tools: list[dict] | None
    template_kwargs: dict[str, Any]
    include_reasoning: bool = True
    parallel_tool_calls: bool | None = True

    @property
    def forced(self) -> bool:
        """``required`` or a named function: the output is constrained to a call."""
        return self.tool_choice == "required" or isinstance(self.tool_choice, dict)

    @property
    def named(self) -> bool:
        return isinstance(self.tool_choice, dict)

    @property
    def reports_reasoning(self) -> bool:
        """Whether messages carry ``reasoning``/``reasoning_content`` (null when none)."""
        return self.parsers.reasoning_parser is not None and self.include_reasoning

    def _tool_parser(self) -> ToolParser | None:
        if self.forced:
            return ForcedToolCallParser(self.tool_choice, self.parsers.tokenizer)
        if self.tool_choice == "auto":
            return self.parsers.tool_parser(self.parsers.tokenizer)
        return None

    def _reasoning_parser(self) -> ReasoningParser | None:
        if self.parsers.reasoning_parser is None:
            return None
        return self.parsers.reasoning_parser(self.parsers.tokenizer, chat_template_kwargs=self.template_kwargs)

    def sampling_params(self, params: SamplingParams) -> SamplingParams:
        """``params`` with the forcing constraint of ``required`` / a named function, and
        ``skip_special_tokens`` off when a parser must see special tokens (vLLM's parsers'
        ``adjust_request``).

        Raises:
            InvalidRequestError: a forced call together with another structured-output
                constraint (``response_format``, ``structured_outputs``, ``guided_*``).
        """
        changes: dict[str, Any] = {}
        if self.forced:
            if params.structured_outputs is not None:
                raise InvalidRequestError(BOTH_CONSTRAINTS, param="tool_choice")
            schema = forced_tool_schema(self.tool_choice, self.tools)
            if self.tool_choice == "required" and self.parallel_tool_calls is False:
                schema["maxItems"] = 1
            changes["structured_outputs"] = StructuredOutputsParams(json=schema, source="tool_choice")
        if self.keeps_special_tokens:
            changes["skip_special_tokens"] = False
        return replace(params, **changes) if changes else params

    @property
    def keeps_special_tokens(self) -> bool:
        """Whether the output must be decoded with its special tokens: a parser reads them (the
        tool parser's markers, or reasoning tags that are special tokens)."""
        tool_parser = self._tool_parser()
        if tool_parser is not None and tool_parser.needs_special_tokens:
            return True
        return self.parsers.reasoning_tags_special and self._reasoning_parser() is not None

    def grammar_reasoning(self, params: SamplingParams) -> ReasoningParser | None:
        """The reasoning parser that holds a structured-output constraint back until the
        reasoning ends (``InputProcessor.process(reasoning=)``); None: the constraint applies from the
        first token (no constraint, no reasoning parser, or ``include_reasoning: false`` as
        vLLM's ``resolve_reasoning_ended``)."""
        if params.structured_outputs is None or not self.include_reasoning:
            return None
        return self._reasoning_parser()

    def choice_output(self, params: SamplingParams) -> ChoiceOutput:
        """A fresh reader of one choice's text (``params``: the request's, as admitted). With
        ``include_reasoning: false`` and a constraint, the constraint ran from the first token,
        so the model wrote no reasoning and the whole text is the answer."""
        return ChoiceOutput(None if self._unreasoned(params) else self._reasoning_parser(), self._tool_parser(),
                            include_reasoning=self.include_reasoning,
                            parallel_tool_calls=self.parallel_tool_calls)

    def reasoning_counter(self, params: SamplingParams) -> Callable[[Sequence[int]], int] | None:
        """Counts an output's reasoning tokens for ``usage`` (None without ``--reasoning-parser``;
        vLLM counts them also when the reasoning is left out of the reply). A reply constrained
        from the first token has none."""
        parser = self._reasoning_parser()
        if parser is None:
            return None
        if self._unreasoned(params):
            return lambda token_ids: 0
        return parser.count_reasoning_tokens

    def _unreasoned(self, params: SamplingParams) -> bool:
        return not self.include_reasoning and params.structured_outputs is not None

    def finish_reason(self, engine_reason: str | None, tools_called: bool) -> str | None:
        """``"tool_calls"`` when calls were returned and the model stopped, except for a named
        function (vLLM's rule); otherwise the engine's reason."""
        if engine_reason == "stop" and tools_called and not self.named:
            return "tool_calls"
        return engine_reason
