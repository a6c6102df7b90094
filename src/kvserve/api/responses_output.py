"""A chat completion's answer as a Response (vLLM 0.32's ``ResponsesResponse.from_request`` and
``build_response_output_items``).

    chat message.reasoning   -> {"type": "reasoning", "content": [{"type": "reasoning_text"}]}
    chat message.content     -> {"type": "message", "content": [{"type": "output_text",
                                                                  "logprobs": [...]}]}
    chat message.tool_calls  -> {"type": "function_call", "call_id": <the call's id>, ...}
    finish_reason "length"   -> status "incomplete", incomplete_details.reason
                                "max_output_tokens", the last item "incomplete"
    usage                    -> input_tokens (cached_tokens), output_tokens (reasoning_tokens)

The echoed settings (``response_skeleton``) are the request's, with vLLM's effective sampling
values: ``temperature``, ``top_p`` and ``max_output_tokens`` as the engine runs them (the
model's defaults and the context's room filled in).
"""

from __future__ import annotations

from kvserve.api.responses import ChatLogprobToken, ChatResponseMessage, UsageInfo
from kvserve.api.responses_objects import (DeltaLogprob, DeltaTopLogprob, FunctionCallItem, IncompleteDetails,
                                           InputTokensDetails, OutputItem, OutputLogprob, OutputMessage, OutputText,
                                           OutputTokensDetails, ReasoningItem, ReasoningText, ResponsesResponse,
                                           ResponseUsage, TopLogprob, new_item_id)
from kvserve.api.responses_protocol import ResponsesRequest
from kvserve.sampling_params import SamplingParams


def response_skeleton(request: ResponsesRequest, response_id: str, model: str, params: SamplingParams,
                      store: bool) -> ResponsesResponse:
    """The response ``request`` starts as (``in_progress``, no output, no usage)."""
    tools = request.tools or []
    text = request.text.model_dump(by_alias=True, exclude_none=True) if request.text is not None else {}
    text.setdefault("format", {"type": "text"})
    choice = request.tool_choice
    if choice is None or (not tools and choice == "auto"):
        choice = "auto" if tools else "none"  # vLLM: no tools, no choice
    return ResponsesResponse(
        id=response_id, status="in_progress", background=bool(request.background), instructions=request.instructions,
        max_output_tokens=params.max_tokens, max_tool_calls=request.max_tool_calls, metadata=request.metadata or {},
        model=model, parallel_tool_calls=request.parallel_tool_calls is not False,
        previous_response_id=request.previous_response_id, prompt_cache_key=request.prompt_cache_key,
        reasoning=_reasoning(request), safety_identifier=request.safety_identifier,
        service_tier=request.service_tier or "auto", store=store, temperature=params.temperature, top_p=params.top_p,
        text=text, tool_choice=choice, tools=tools, top_logprobs=request.top_logprobs or 0, user=request.user)


def _reasoning(request: ResponsesRequest) -> dict:
    if request.reasoning is None:
        return {"effort": None, "summary": None}
    return request.reasoning.model_dump(exclude_none=True) | {"effort": request.reasoning.effort,
                                                              "summary": request.reasoning.summary}


def finished_response(skeleton: ResponsesResponse, output: list[OutputItem], finish_reason: str | None,
                      usage: UsageInfo | None) -> ResponsesResponse:
    """``skeleton`` completed (or ``incomplete`` when ``max_output_tokens`` cut it, vLLM's rule)."""
    incomplete = finish_reason == "length"
    return skeleton.model_copy(update={
        "status": "incomplete" if incomplete else "completed", "output": output,
        "incomplete_details": IncompleteDetails(reason="max_output_tokens") if incomplete else None,
        "usage": response_usage(usage) if usage is not None else None})


def output_items(message: ChatResponseMessage, finish_reason: str | None,
                 logprobs: list[ChatLogprobToken] | None) -> list[OutputItem]:
    """The output items of a whole chat message, in vLLM's order: reasoning, text, calls. With
    ``finish_reason`` ``length`` the last item is ``incomplete``."""
    items: list[OutputItem] = []
    if message.reasoning:
        items.append(ReasoningItem(id=new_item_id("rs"), content=[ReasoningText(text=message.reasoning)]))
    if message.content:
        text = OutputText(text=message.content, logprobs=output_logprobs(logprobs or []))
        items.append(OutputMessage(id=new_item_id("msg"), content=[text]))
    for call in message.tool_calls:
        items.append(FunctionCallItem(id=new_item_id("fc"), call_id=call["id"], name=call["function"]["name"],
                                      arguments=call["function"]["arguments"]))
    if items and finish_reason == "length":
        items[-1].status = "incomplete"
    return items


def response_usage(usage: UsageInfo) -> ResponseUsage:
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
    reasoning = usage.completion_tokens_details.reasoning_tokens if usage.completion_tokens_details else 0
    return ResponseUsage(input_tokens=usage.prompt_tokens,
                         input_tokens_details=InputTokensDetails(cached_tokens=cached),
                         output_tokens=usage.completion_tokens,
                         output_tokens_details=OutputTokensDetails(reasoning_tokens=reasoning),
                         total_tokens=usage.total_tokens)


def output_logprobs(entries: list[ChatLogprobToken]) -> list[OutputLogprob]:
    """Chat's logprob entries as ``output_text.logprobs`` (the same values)."""
    return [OutputLogprob(token=e.token, logprob=e.logprob, bytes=_bytes(e),
                          top_logprobs=[TopLogprob(token=t.token, logprob=t.logprob, bytes=_bytes(t))
                                        for t in e.top_logprobs]) for e in entries]


def delta_logprobs(entries: list[OutputLogprob]) -> list[DeltaLogprob]:
    """The ``output_text.delta`` form of logprobs (no ``bytes``)."""
    return [DeltaLogprob(token=e.token, logprob=e.logprob,
                         top_logprobs=[DeltaTopLogprob(token=t.token, logprob=t.logprob) for t in e.top_logprobs])
            for e in entries]


def _bytes(entry) -> list[int]:
    return entry.bytes if entry.bytes is not None else list(entry.token.encode("utf-8"))
