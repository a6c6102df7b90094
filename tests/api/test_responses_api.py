"""/v1/responses over loopback with scripted engines (tests/api/scripted_engine.py): the model's
text is given, so every value is known. Streamed events add up to the non-streamed response, and
both to the chat answer the request translates to, for plain text, reasoning (qwen3) and tool
calls (hermes) at every split of the text into token pieces; store, previous_response_id,
background, cancel (the engine request is aborted), replays, and refusals by name, each leaving
the server working. Shapes from OpenAI's API reference, checked with the official client's own
types; semantics from vLLM 0.32's ``entrypoints/openai/responses``."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import openai.types.responses as oai
import pytest
from pydantic import TypeAdapter

from kvserve.api.settings import ServerSettings
from kvserve.engine.detokenizer import IncrementalDetokenizer
from kvserve.errors import RequestFailedError
from kvserve.outputs import CompletionOutput, RequestOutput
from kvserve.testing.tokenizer_kinds import build_tokenizer
from kvserve.testing.tool_checkpoint import build_tool_tokenizer
from kvserve.tokenizer import apply_chat_template
from loopback import LoopbackServer
from scripted_engine import ScriptedEngine
from test_server_errors import assert_error

EVENTS = TypeAdapter(oai.ResponseStreamEvent)
THINK = "\nThe user asks for the time. Café 😀.\n"
CALL = '<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>'
CALL2 = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}\n</tool_call>'
TOOLS = [{"type": "function", "name": "get_time", "parameters": {"type": "object"}},
         {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}} for t in TOOLS]
# (model text, what the items must be: (type, text or (name, arguments as an object)))
CASES = {
    "text": ("Hello there. Café 😀 the end.", [("message", "Hello there. Café 😀 the end.")]),
    "reasoning": (f"<think>{THINK}</think>\n\nIt is **noon**.",
                  [("reasoning", THINK), ("message", "\n\nIt is **noon**.")]),
    "call": (f"Let me check.\n{CALL}",
             [("message", "Let me check.\n"), ("function_call", ("get_time", {"tz": "UTC"}))]),
    "reasoning_calls": (f"<think>{THINK}</think>{CALL}\n{CALL2}", [
        ("reasoning", THINK), ("function_call", ("get_time", {"tz": "UTC"})),
        ("function_call", ("get_weather", {"city": "Rome", "days": 2}))]),
}
SPLITS = [(1,), (2,), (3, 1), (1, 4, 2), (10_000,)]  # tokens per engine step, cycled


class PieceEngine(ScriptedEngine):
    """Writes ``text`` (then stops, as at EOS) in pieces of ``sizes`` tokens, cycled, decoded by
    the engine's own detokenizer; with ``fail_after`` set the request fails after that many
    pieces (as the engine fails one request: its stream gets the error)."""

    def __init__(self, tokenizer, text: str):
        super().__init__(tokenizer, max_model_len=4096)
        self.text = text
        self.sizes: tuple[int, ...] = (1,)
        self.fail_after: int | None = None

    async def _feed(self, request, sink) -> None:
        try:
            await super()._feed(request, sink)
        except RequestFailedError as exc:
            sink(exc)

    async def _steps(self, prompt_ids, params, request_id, prompt):
        ids = self.tokenizer.encode(self.text, add_special_tokens=False)
        pieces, at = [], 0
        while at < len(ids):
            pieces.append(ids[at:at + self.sizes[len(pieces) % len(self.sizes)]])
            at += len(pieces[-1])
        detokenizer = IncrementalDetokenizer(self.tokenizer, list(prompt_ids), params.skip_special_tokens)
        for step, piece in enumerate(pieces):
            await asyncio.sleep(0)
            if step == self.fail_after:
                raise RequestFailedError("the scripted engine failed", request_id)
            last = step + 1 == len(pieces)
            text = detokenizer.add_tokens(piece) + (detokenizer.flush() if last else "")
            output = CompletionOutput(0, text, piece, logprobs=None, finish_reason="stop" if last else None)
            yield RequestOutput(request_id, prompt, list(prompt_ids), None, [output], finished=last,
                                num_cached_tokens=0)


def post(srv, **body) -> httpx.Response:
    return httpx.post(srv.base_url + "/v1/responses", timeout=30, headers=getattr(srv, "headers", None),
                      json={"model": "scripted-model", "input": "What time is it?", **body})


def read_events(response: httpx.Response) -> list[dict]:
    """The SSE events of a Responses stream, each checked: its ``event:`` line names its type,
    it validates as the official client's event type, sequence numbers count from the first."""
    events = []
    for block in response.text.split("\n\n"):
        if not block:
            continue
        name, data = block.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        EVENTS.validate_python(event)
        events.append(event)
    numbers = [e["sequence_number"] for e in events]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))
    return events


def stream(srv, **body) -> list[dict]:
    with httpx.stream("POST", srv.base_url + "/v1/responses", timeout=30, headers=getattr(srv, "headers", None),
                      json={"model": "scripted-model", "input": "What time is it?", "stream": True, **body}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        r.read()
        return read_events(r)


def replay(events: list[dict]) -> list[dict]:
    """The output items a client builds from the deltas alone (ids kept), checking that each
    item opens, receives deltas and closes in order."""
    items: dict[int, dict] = {}
    for event in events:
        kind, index = event["type"], event.get("output_index")
        if kind == "response.output_item.added":
            assert index == len(items) and all(i["closed"] for i in items.values())
            item = event["item"]
            items[index] = {"type": item["type"], "id": item["id"], "text": "", "closed": False,
                            "name": item.get("name"), "call_id": item.get("call_id")}
            assert item["status"] == "in_progress"
        elif kind in ("response.output_text.delta", "response.reasoning_text.delta",
                      "response.function_call_arguments.delta"):
            assert not items[index]["closed"] and event["item_id"] == items[index]["id"]
            items[index]["text"] += event["delta"]
        elif kind in ("response.output_text.done", "response.reasoning_text.done"):
            assert event["text"] == items[index]["text"]
        elif kind == "response.function_call_arguments.done":
            assert (event["arguments"], event["name"]) == (items[index]["text"], items[index]["name"])
        elif kind == "response.output_item.done":
            assert event["item"]["id"] == items[index]["id"]
            items[index]["closed"] = True
    return [items[i] for i in sorted(items)]


def item_values(output: list[dict]) -> list[tuple]:
    """(type, text) of messages and reasoning, (type, (name, arguments parsed)) of calls."""
    values = []
    for item in output:
        if item["type"] == "message":
            values.append(("message", "".join(part["text"] for part in item["content"])))
        elif item["type"] == "reasoning":
            values.append(("reasoning", "".join(part["text"] for part in item["content"])))
        else:
            values.append(("function_call", (item["name"], json.loads(item["arguments"]))))
    return values


def replayed_values(items: list[dict]) -> list[tuple]:
    return [(i["type"], (i["name"], json.loads(i["text"])) if i["type"] == "function_call" else i["text"])
            for i in items]


def chat_values(srv, body: dict) -> list[tuple]:
    """The same request through /v1/chat/completions, as (type, value) in vLLM's item order."""
    chat = httpx.post(srv.base_url + "/v1/chat/completions", timeout=30, json=body).json()
    message = chat["choices"][0]["message"]
    values = [("reasoning", message["reasoning"])] if message.get("reasoning") else []
    values += [("message", message["content"])] if message["content"] else []
    return values + [("function_call", (c["function"]["name"], json.loads(c["function"]["arguments"])))
                     for c in message.get("tool_calls", [])]


def parsers_server(text: str) -> LoopbackServer:
    """hermes tool calls; the qwen3 reasoning parser for a text with a think block (it reads a
    text without one as all reasoning)."""
    settings = ServerSettings(reasoning_parser="qwen3" if "<think>" in text else None, tool_call_parser="hermes",
                              enable_auto_tool_choice=True)
    return LoopbackServer(PieceEngine(build_tool_tokenizer(), text), settings)


@pytest.mark.parametrize("case", sorted(CASES))
def test_streamed_events_add_up_to_the_response_and_to_chat_at_every_split(case):
    text, expected = CASES[case]
    chat_body = {"model": "scripted-model", "messages": [{"role": "user", "content": "What time is it?"}],
                 "tools": CHAT_TOOLS}
    with parsers_server(text) as srv:
        for sizes in SPLITS:
            srv.engine.sizes = sizes
            whole = post(srv, tools=TOOLS).json()
            oai.Response.model_validate(whole)
            assert item_values(whole["output"]) == expected, sizes
            assert chat_values(srv, chat_body) == expected
            events = stream(srv, tools=TOOLS)
            assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
            assert events[-1]["type"] == "response.completed" and events[0]["sequence_number"] == 0
            items = replay(events)
            assert replayed_values(items) == expected, sizes
            final = events[-1]["response"]
            assert [i["id"] for i in final["output"]] == [i["id"] for i in items]  # the streamed items themselves
            assert item_values(final["output"]) == expected
            assert [i.get("call_id") for i in final["output"]] == [i["call_id"] for i in items]
            assert {k: v for k, v in final.items() if k not in ("id", "created_at", "output")} == \
                   {k: v for k, v in whole.items() if k not in ("id", "created_at", "output")}


def test_a_response_echoes_the_request_and_counts_like_chat():
    tokenizer = build_tool_tokenizer()
    with parsers_server(f"<think>{THINK}</think>Noon.") as srv:
        body = post(srv, instructions="Be brief.", max_output_tokens=500, temperature=0.25, top_p=0.5,
                    metadata={"run": "7"}, user="u1", tools=TOOLS, tool_choice="auto", parallel_tool_calls=False,
                    reasoning={"effort": "high"}, text={"format": {"type": "text"}}).json()
        oai.Response.model_validate(body)
        assert body["id"].startswith("resp_") and len(body["id"]) == 37 and body["object"] == "response"
        assert {k: body[k] for k in ("status", "instructions", "max_output_tokens", "temperature", "top_p",
                                     "metadata", "user", "tools", "tool_choice", "parallel_tool_calls",
                                     "reasoning", "text", "store", "background", "previous_response_id",
                                     "truncation", "error", "incomplete_details", "model")} == {
            "status": "completed", "instructions": "Be brief.", "max_output_tokens": 500, "temperature": 0.25,
            "top_p": 0.5, "metadata": {"run": "7"}, "user": "u1", "tools": TOOLS, "tool_choice": "auto",
            "parallel_tool_calls": False, "reasoning": {"effort": "high", "summary": None},
            "text": {"format": {"type": "text"}}, "store": True, "background": False, "previous_response_id": None,
            "truncation": "disabled", "error": None, "incomplete_details": None, "model": "scripted-model"}
        chat_tools = [{"type": "function", "function": {"name": t["name"], "parameters": t["parameters"]}}
                      for t in TOOLS]
        prompt = apply_chat_template(tokenizer, [{"role": "system", "content": "Be brief."},
                                                 {"role": "user", "content": "What time is it?"}],
                                     tools=chat_tools, chat_template_kwargs={"reasoning_effort": "high",
                                                                             "enable_thinking": True})
        assert srv.engine.calls[-1][1] == prompt
        output_ids = tokenizer.encode(f"<think>{THINK}</think>Noon.", add_special_tokens=False)
        thought = len(tokenizer.encode(THINK, add_special_tokens=False))
        assert body["usage"] == {"input_tokens": len(prompt), "input_tokens_details": {
            "cached_tokens": 0, "cache_write_tokens": 0}, "output_tokens": len(output_ids),
            "output_tokens_details": {"reasoning_tokens": thought}, "total_tokens": len(prompt) + len(output_ids)}


def test_max_output_tokens_leaves_it_incomplete():
    with LoopbackServer(ScriptedEngine(build_tokenizer("bpe"))) as srv:
        whole = post(srv, max_output_tokens=4, include=["message.output_text.logprobs"], top_logprobs=2).json()
        script = srv.engine.tokenizer.decode(srv.engine.script_ids[:4])
        assert (whole["status"], whole["incomplete_details"]) == ("incomplete", {"reason": "max_output_tokens"})
        assert item_values(whole["output"]) == [("message", script)] and whole["output"][0]["status"] == "incomplete"
        logprobs = whole["output"][0]["content"][0]["logprobs"]
        assert [lp["logprob"] for lp in logprobs] == [-0.1, -0.2, -0.3, -0.4]  # the scripted engine's values
        assert [len(lp["top_logprobs"]) for lp in logprobs] == [2, 2, 2, 2]
        events = stream(srv, max_output_tokens=4, include=["message.output_text.logprobs"], top_logprobs=2)
        assert events[-1]["type"] == "response.incomplete" and events[-1]["response"]["status"] == "incomplete"
        deltas = [lp for e in events if e["type"] == "response.output_text.delta" for lp in e["logprobs"]]
        assert [(lp["token"], lp["logprob"]) for lp in deltas] == [(lp["token"], lp["logprob"]) for lp in logprobs]
        assert events[-1]["response"]["output"][0]["content"][0]["logprobs"] == logprobs


def test_previous_response_id_continues_the_conversation_without_its_instructions():
    tokenizer = build_tool_tokenizer()
    with parsers_server(f"<think>{THINK}</think>Let me check.\n{CALL}") as srv:
        first = post(srv, instructions="Old rules.", tools=TOOLS,
                     input=[{"role": "system", "content": "Stay."}, {"role": "user", "content": "Time?"}]).json()
        call = first["output"][-1]
        assert (call["type"], call["name"]) == ("function_call", "get_time")
        srv.engine.text = "<think>ok</think>It is noon."
        second = post(srv, instructions="New rules.", previous_response_id=first["id"], tools=TOOLS,
                      input=[{"type": "function_call_output", "call_id": call["call_id"], "output": "12:00"}]).json()
        assert item_values(second["output"]) == [("reasoning", "ok"), ("message", "It is noon.")]
        assert second["previous_response_id"] == first["id"] and second["instructions"] == "New rules."
        third = post(srv, previous_response_id=second["id"], input="Thanks").json()
        tool_call = {"id": call["call_id"], "type": "function",
                     "function": {"name": "get_time", "arguments": {"tz": "UTC"}}}
        history = [{"role": "system", "content": "Stay."}, {"role": "user", "content": "Time?"},
                   {"role": "assistant", "content": "Let me check.\n", "tool_calls": [tool_call]},  # no reasoning
                   {"role": "tool", "content": "12:00", "tool_call_id": call["call_id"]}]
        chat_tools = [{"type": "function", "function": {"name": t["name"], "parameters": t["parameters"]}}
                      for t in TOOLS]
        assert srv.engine.calls[-2][1] == apply_chat_template(
            tokenizer, [{"role": "system", "content": "New rules."}, *history], tools=chat_tools)
        assert srv.engine.calls[-1][1] == apply_chat_template(
            tokenizer, [*history, {"role": "assistant", "content": "It is noon."},
                        {"role": "user", "content": "Thanks"}])
        assert third["status"] == "completed"


def test_a_failure_after_the_start_is_reported_and_the_server_goes_on():
    with parsers_server("Hello there, a text the engine fails in.") as srv:
        srv.engine.fail_after = 3
        events = stream(srv)
        assert [e["type"] for e in events][-4:] == ["response.content_part.done", "response.output_item.done",
                                                    "error", "response.failed"]
        assert events[-2]["code"] == "server_error" and "the scripted engine failed" in events[-2]["message"]
        failed = events[-1]["response"]
        assert (failed["status"], failed["error"]["code"]) == ("failed", "server_error")
        assert failed["output"][0]["status"] == "incomplete" and failed["output"][0]["content"][0]["text"]
        assert httpx.get(f"{srv.base_url}/v1/responses/{failed['id']}").json() == failed  # stored as it ended
        error = assert_error(post(srv), 500, type="server_error")
        assert "the scripted engine failed" in error["message"]
        queued = post(srv, background=True).json()
        ended = wait_for(srv, queued["id"], ("failed",))
        assert ended["status"] == "failed" and "the scripted engine failed" in ended["error"]["message"]
        srv.engine.fail_after = None
        assert post(srv).json()["status"] == "completed" and srv.state.in_flight == 0


def test_retrieve_delete_and_store_false():
    with LoopbackServer(ScriptedEngine(build_tokenizer("bpe"))) as srv:
        client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="none", max_retries=0)
        created = client.responses.create(model="scripted-model", input="x", max_output_tokens=3)
        again = client.responses.retrieve(created.id)
        assert again.model_dump() == created.model_dump()
        assert httpx.delete(f"{srv.base_url}/v1/responses/{created.id}").json() == {
            "id": created.id, "object": "response", "deleted": True}
        for method in ("GET", "DELETE"):
            assert_error(httpx.request(method, f"{srv.base_url}/v1/responses/{created.id}"), 404, param="response_id")
        assert_error(httpx.post(f"{srv.base_url}/v1/responses/{created.id}/cancel"), 404, param="response_id")
        unstored = post(srv, store=False, max_output_tokens=2).json()
        assert unstored["store"] is False
        assert_error(httpx.get(f"{srv.base_url}/v1/responses/{unstored['id']}"), 404, param="response_id")
        assert_error(post(srv, previous_response_id=unstored["id"]), 404, param="previous_response_id",
                     code="previous_response_not_found")
        assert post(srv, max_output_tokens=2).status_code == 200


def test_the_store_keeps_the_most_recently_used_and_is_per_key():
    settings = ServerSettings(responses_store_max=2, api_keys=("k1", "k2"))
    with LoopbackServer(ScriptedEngine(build_tokenizer("bpe")), settings) as srv:
        srv.headers = {"Authorization": "Bearer k1"}
        a, b = (post(srv, max_output_tokens=2).json()["id"] for _ in range(2))
        assert httpx.get(f"{srv.base_url}/v1/responses/{a}", headers=srv.headers).status_code == 200  # a is recent
        c = post(srv, max_output_tokens=2).json()["id"]
        found = {rid: httpx.get(f"{srv.base_url}/v1/responses/{rid}", headers=srv.headers).status_code
                 for rid in (a, b, c)}
        assert found == {a: 200, b: 404, c: 200}
        assert_error(post(srv, previous_response_id=b), 404, param="previous_response_id",
                     code="previous_response_not_found")
        other = {"Authorization": "Bearer k2"}
        assert_error(httpx.get(f"{srv.base_url}/v1/responses/{a}", headers=other), 404, param="response_id")
        assert_error(httpx.delete(f"{srv.base_url}/v1/responses/{a}", headers=other), 404, param="response_id")
        assert srv.state.in_flight == 0


def test_no_store_answers_store_false_and_refuses_background():
    with LoopbackServer(ScriptedEngine(build_tokenizer("bpe")), ServerSettings(responses_store_max=0)) as srv:
        body = post(srv, max_output_tokens=2).json()
        assert body["store"] is False and body["status"] == "incomplete"
        assert_error(httpx.get(f"{srv.base_url}/v1/responses/{body['id']}"), 404, param="response_id")
        assert_error(post(srv, background=True), 400, param="background")
        assert srv.engine.calls and len(srv.engine.calls) == 1


def wait_for(srv, response_id: str, statuses: tuple[str, ...]) -> dict:
    deadline = time.monotonic() + 20
    while True:
        body = httpx.get(f"{srv.base_url}/v1/responses/{response_id}").json()
        if body["status"] in statuses or time.monotonic() > deadline:
            return body
        time.sleep(0.02)


def test_background_runs_to_the_end_and_equals_a_foreground_response():
    with LoopbackServer(ScriptedEngine(build_tokenizer("bpe"), step_delay=0.01)) as srv:
        queued = post(srv, background=True, max_output_tokens=6).json()
        oai.Response.model_validate(queued)
        assert (queued["status"], queued["background"], queued["output"], queued["usage"]) == \
               ("queued", True, [], None)
        done = wait_for(srv, queued["id"], ("incomplete", "completed"))
        foreground = post(srv, max_output_tokens=6).json()
        assert item_values(done["output"]) == item_values(foreground["output"])
        assert done["usage"] == foreground["usage"] and done["status"] == "incomplete"
        assert_error(httpx.post(f"{srv.base_url}/v1/responses/{done['id']}/cancel"), 400, param="response_id")
        assert_error(httpx.post(f"{srv.base_url}/v1/responses/{foreground['id']}/cancel"), 400, param="response_id")
        assert srv.state.in_flight == 0


def test_cancel_aborts_the_engine_request_of_a_background_response():
    with LoopbackServer(ScriptedEngine(build_tokenizer("bpe"), step_delay=0.2)) as srv:
        client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="none", max_retries=0)
        queued = client.responses.create(model="scripted-model", input="x", background=True)
        assert queued.status == "queued"
        wait_for(srv, queued.id, ("in_progress",))
        cancelled = client.responses.cancel(queued.id)
        assert cancelled.status == "cancelled" and cancelled.id == queued.id
        assert srv.engine.aborted == [queued.id] and srv.engine.running == set() and srv.state.in_flight == 0
        assert client.responses.retrieve(queued.id).status == "cancelled"
        assert client.responses.cancel(queued.id).status == "cancelled"  # again: the same answer
        deleting = client.responses.create(model="scripted-model", input="x", background=True)
        client.responses.delete(deleting.id)
        assert srv.engine.aborted == [queued.id, deleting.id] and srv.engine.running == set()
        assert post(srv, max_output_tokens=2).status_code == 200 and srv.state.in_flight == 0


def test_a_streamed_background_response_is_replayed_from_any_sequence_number():
    with LoopbackServer(ScriptedEngine(build_tokenizer("bpe"), step_delay=0.01)) as srv:
        events = stream(srv, background=True, max_output_tokens=5)
        assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
        assert events[0]["response"]["status"] == "queued" and events[-1]["type"] == "response.incomplete"
        response_id = events[0]["response"]["id"]
        replayed = httpx.get(f"{srv.base_url}/v1/responses/{response_id}", params={
            "stream": "true", "starting_after": 3}, timeout=30)
        assert read_events(replayed) == events[4:]
        assert httpx.get(f"{srv.base_url}/v1/responses/{response_id}").json() == events[-1]["response"]
        foreground = post(srv, max_output_tokens=2).json()
        assert_error(httpx.get(f"{srv.base_url}/v1/responses/{foreground['id']}", params={"stream": "true"}),
                     400, param="stream")


@pytest.mark.parametrize("body, status, param, code", [
    ({"previous_response_id": "resp_0123"}, 404, "previous_response_id", "previous_response_not_found"),
    ({"tools": [{"type": "web_search_preview"}]}, 400, "tools.0.type", None),
    ({"tools": [{"type": "code_interpreter", "container": {"type": "auto"}}]}, 400, "tools.0.type", None),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]},
     400, "input.0.content.0.type", None),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]}]},
     400, "input.0.content.0.type", None),
    ({"conversation": {"id": "conv_1"}}, 400, "conversation", None),
    ({"prompt": {"id": "pmpt_1"}}, 400, "prompt", None),
    ({"include": ["web_search_call.action.sources"]}, 400, "include", None),
    ({"truncation": "auto"}, 400, "truncation", None),
    ({"max_output_tokens": 0}, 400, "max_output_tokens", None),
    ({"max_output_tokens": 100_000}, 400, "max_output_tokens", None),
    ({"input": "word " * 400}, 400, "input", None),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, 400, "text.format.schema", None),
    ({"reasoning": {"effort": "extreme"}}, 400, "reasoning.effort", None),
    ({"include": ["message.output_text.logprobs"], "top_logprobs": 21}, 400, "top_logprobs", None),
    ({"temperature": -1}, 400, "temperature", None),
    ({"model": "other"}, 404, "model", "model_not_found"),
    ({"input": 5}, 400, "input", None),
    ({"tools": [{"type": "function", "name": "f"}]}, 400, "tool_choice", None),  # "auto" needs the flags
    # chat fields a client moving from chat may still send: refused with the Responses field to use
    ({"max_tokens": 5}, 400, "max_tokens", None),
    ({"messages": [{"role": "user", "content": "x"}]}, 400, "messages", None),
    ({"response_format": {"type": "json_object"}}, 400, "response_format", None),
    ({"logprobs": True}, 400, "logprobs", None),
])
def test_bad_requests_are_refused_by_name_and_the_server_goes_on(body, status, param, code):
    with LoopbackServer(ScriptedEngine(build_tokenizer("bpe"))) as srv:
        error = assert_error(post(srv, **body), status, param=param, code=code)
        if param.startswith("max_output_tokens"):
            assert "max_output_tokens" in error["message"] and "max_completion_tokens" not in error["message"]
        assert srv.engine.calls == [] and srv.state.in_flight == 0
        assert post(srv, max_output_tokens=2).status_code == 200


def test_the_routes_are_in_the_openapi_schema():
    with LoopbackServer(ScriptedEngine(build_tokenizer("bpe"))) as srv:
        paths = httpx.get(srv.base_url + "/openapi.json").json()["paths"]
        assert set(paths["/v1/responses"]) == {"post"}
        assert set(paths["/v1/responses/{response_id}"]) == {"get", "delete"}
        assert set(paths["/v1/responses/{response_id}/cancel"]) == {"post"}
        schema = paths["/v1/responses"]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert schema["$ref"].endswith("/ResponsesRequest")
