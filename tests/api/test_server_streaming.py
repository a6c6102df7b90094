"""The real app on loopback (uvicorn, official ``openai`` client, raw httpx for SSE) in front of
the scripted engine: streaming format, aggregation, logprobs in both formats."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from kvserve.testing.tokenizer_kinds import build_tokenizer
from loopback import LoopbackServer
from scripted_engine import ScriptedEngine, generated_logprobs


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer("bpe")


@pytest.fixture
def server(tokenizer):
    with LoopbackServer(ScriptedEngine(tokenizer)) as srv:
        yield srv


def client(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url + "/v1", api_key="none", max_retries=0)


def sse_events(response: httpx.Response) -> list[str]:
    """Raw events of an SSE body; asserts the exact ``data: ...\\n\\n`` framing."""
    body = response.text
    assert body.endswith("data: [DONE]\n\n")
    events = body.split("\n\n")[:-1]
    assert all(event.startswith("data: ") and "\n" not in event for event in events)
    return [event[len("data: "):] for event in events]


def test_streamed_completion_matches_non_streamed_and_script(server, tokenizer):
    engine = server.engine
    expected = tokenizer.decode(engine.choice_token_ids(0, 12))
    full = client(server).completions.create(model="scripted-model", prompt="Hi", max_tokens=12)
    assert full.choices[0].text == expected and full.choices[0].finish_reason == "length"
    assert full.usage.prompt_tokens == len(tokenizer.encode("Hi"))
    assert full.usage.completion_tokens == 12
    assert full.usage.prompt_tokens_details.cached_tokens == 3
    with httpx.Client(base_url=server.base_url) as http:
        response = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 12, "stream": True})
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all("usage" not in chunk for chunk in chunks)  # not asked: no usage field at all
    assert "".join(c["choices"][0]["text"] for c in chunks) == expected
    reasons = [c["choices"][0]["finish_reason"] for c in chunks]
    assert reasons[-1] == "length" and reasons.count("length") == 1 and set(reasons[:-1]) <= {None}


def test_chat_stream_n3_roles_finish_reasons_and_usage(server, tokenizer):
    engine = server.engine
    with httpx.Client(base_url=server.base_url) as http:
        response = http.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "n": 3,
            "stream": True, "stream_options": {"include_usage": True}})
    chunks = [json.loads(e) for e in sse_events(response)[:-1]]
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 18
    assert all(c["usage"] is None for c in chunks[:-1])  # asked: null on every other chunk
    for index in range(3):
        mine = [c["choices"][0] for c in chunks[:-1] if c["choices"][0]["index"] == index]
        assert mine[0]["delta"] == {"role": "assistant", "content": ""}
        assert all(set(choice["delta"]) == {"content"} for choice in mine[1:])
        reasons = [choice["finish_reason"] for choice in mine]
        assert reasons[-1] == "length" and reasons.count("length") == 1
        text = "".join(choice["delta"]["content"] or "" for choice in mine)
        assert text == tokenizer.decode(engine.choice_token_ids(index, 6))
    prompt_ids = engine.calls[0][1]
    assert prompt_ids == tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}],
                                                       add_generation_prompt=True, return_dict=False)


def test_openai_client_stream_and_multi_prompt_indices(server, tokenizer):
    engine = server.engine
    stream = client(server).completions.create(model="scripted-model", prompt=["a", "b"], n=2,
                                               max_tokens=5, stream=True)
    texts: dict[int, str] = {}
    finishes: dict[int, int] = {}
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
            finishes[choice.index] = finishes.get(choice.index, 0) + (choice.finish_reason is not None)
    assert finishes == {0: 1, 1: 1, 2: 1, 3: 1}
    for index in range(4):  # choice index = prompt index * n + sample index
        assert texts[index] == tokenizer.decode(engine.choice_token_ids(index % 2, 5))
    assert sorted(call[0][-2:] for call in engine.calls) == ["-0", "-1"]


def test_completion_echo_logprobs(server, tokenizer):
    prompt = "Hello world"
    prompt_ids = tokenizer.encode(prompt)
    result = client(server).completions.create(model="scripted-model", prompt=prompt, max_tokens=3,
                                               logprobs=2, echo=True)
    choice = result.choices[0]
    gen_ids = server.engine.choice_token_ids(0, 3)
    assert choice.text == prompt + tokenizer.decode(gen_ids)
    lp = choice.logprobs
    assert len(lp.tokens) == len(prompt_ids) + 3
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    expected_prompt = [-p / 100 for p in range(1, len(prompt_ids))]
    assert lp.token_logprobs[1:len(prompt_ids)] == pytest.approx(expected_prompt)
    assert lp.token_logprobs[len(prompt_ids):] == pytest.approx([-0.1, -0.2, -0.3])
    assert "".join(lp.tokens) == choice.text
    offsets = [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert lp.text_offset == offsets
    step0 = generated_logprobs(0, gen_ids[0], 2, server.engine.vocab_size)
    expected_top = {tokenizer.decode([t]): v for t, v in zip(step0.top_token_ids, step0.top_logprobs)}
    assert lp.top_logprobs[len(prompt_ids)] == pytest.approx(expected_top)
    assert server.engine.calls[0][2].prompt_logprobs == 2


def test_chat_logprobs_format(server, tokenizer):
    result = client(server).chat.completions.create(
        model="scripted-model", messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
        logprobs=True, top_logprobs=3)
    content = result.choices[0].logprobs.content
    gen_ids = server.engine.choice_token_ids(0, 4)
    assert [entry.logprob for entry in content] == pytest.approx([-0.1, -0.2, -0.3, -0.4])
    for step, (entry, token_id) in enumerate(zip(content, gen_ids)):
        assert entry.token == tokenizer.decode([token_id])
        assert bytes(entry.bytes) == entry.token.encode("utf-8")
        expected = generated_logprobs(step, token_id, 3, server.engine.vocab_size)
        assert [top.logprob for top in entry.top_logprobs] == pytest.approx(expected.top_logprobs)
        assert len(entry.top_logprobs) == 3
    assert result.choices[0].message.content == tokenizer.decode(gen_ids)


def test_cjk_emoji_stream_is_byte_identical(server):
    engine = server.engine
    n_tokens = len(engine.script_ids)
    full = client(server).completions.create(model="scripted-model", prompt="你好 🙂",
                                             max_tokens=n_tokens)
    stream = client(server).completions.create(model="scripted-model", prompt="你好 🙂",
                                               max_tokens=n_tokens, stream=True)
    joined = "".join(chunk.choices[0].text for chunk in stream)
    assert joined.encode() == full.choices[0].text.encode()
    assert "\ufffd" not in joined and "你好" in joined and "🙂" in joined


def test_tokenize_detokenize(server, tokenizer):
    with httpx.Client(base_url=server.base_url) as http:
        tokens = http.post("/tokenize", json={"prompt": "Café 你好", "return_token_strs": True}).json()
        assert tokens["tokens"] == tokenizer.encode("Café 你好")
        assert tokens["count"] == len(tokens["tokens"]) and tokens["max_model_len"] == 256
        text = http.post("/detokenize", json={"tokens": tokens["tokens"]}).json()
        assert text == {"prompt": "Café 你好"}
        chat = http.post("/tokenize", json={"messages": [{"role": "user", "content": "x"}]}).json()
        assert chat["tokens"] == tokenizer.apply_chat_template(
            [{"role": "user", "content": "x"}], add_generation_prompt=True, return_dict=False)
        bad = http.post("/detokenize", json={"tokens": [10**6]})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


def test_response_role_names_the_reply(tokenizer):
    """vLLM's --response-role: the reply's role after a generation prompt; the continued
    message's role without one."""
    from kvserve.api.settings import ServerSettings

    with LoopbackServer(ScriptedEngine(tokenizer), ServerSettings(response_role="bot")) as srv:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        reply = httpx.post(srv.base_url + "/v1/chat/completions", json=body).json()
        assert reply["choices"][0]["message"]["role"] == "bot"
        stream = httpx.post(srv.base_url + "/v1/chat/completions", json={**body, "stream": True})
        assert json.loads(sse_events(stream)[0])["choices"][0]["delta"]["role"] == "bot"
        continued = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}],
                     "max_tokens": 2, "add_generation_prompt": False, "continue_final_message": True}
        reply = httpx.post(srv.base_url + "/v1/chat/completions", json=continued).json()
        assert reply["choices"][0]["message"]["role"] == "assistant"
