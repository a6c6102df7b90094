"""Tool calling: parsers of model outputs into OpenAI ``tool_calls``, and forced tool choice.

* :mod:`.abstract` — the :class:`ToolParser` interface, its registry (``get_tool_parser``)
  and the split-invariant streaming it gives every parser;
* :mod:`.hermes`, :mod:`.llama3_json`, :mod:`.mistral`, :mod:`.pythonic`, :mod:`.gpt_oss`
  (``openai``: GPT-OSS's harmony) — the formats;
* :mod:`.tool_choice` — ``tool_choice`` validation, the JSON schema that forces a call
  (``required`` / a named function), reading that output back, ``parallel_tool_calls``;
* :mod:`.types` — OpenAI's tool-call shapes and vLLM-style ids;
* :mod:`.json_scan` — the incremental JSON scanner underneath.
"""

from kvserve.tool_parsers.abstract import (
    ParseState,
    ToolParser,
    get_tool_parser,
    register_tool_parser,
    tool_parser_names,
)
from kvserve.tool_parsers.tool_choice import (
    ForcedToolCallParser,
    forced_tool_schema,
    limit_tool_call_deltas,
    limit_tool_calls,
    validate_tool_choice,
)
from kvserve.tool_parsers.types import (
    DeltaFunctionCall,
    DeltaToolCall,
    ExtractedToolCalls,
    FunctionCall,
    ToolCall,
    ToolCallDelta,
    make_mistral_tool_call_id,
    make_tool_call_id,
)

__all__ = [
    "DeltaFunctionCall",
    "DeltaToolCall",
    "ExtractedToolCalls",
    "ForcedToolCallParser",
    "FunctionCall",
    "ParseState",
    "ToolCall",
    "ToolCallDelta",
    "ToolParser",
    "forced_tool_schema",
    "get_tool_parser",
    "limit_tool_call_deltas",
    "limit_tool_calls",
    "make_mistral_tool_call_id",
    "make_tool_call_id",
    "register_tool_parser",
    "tool_parser_names",
    "validate_tool_choice",
]
