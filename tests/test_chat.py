"""``kvserve chat``: the conversation is trimmed to the model's context (counted by the server's
/tokenize or the local tokenizer, or on the server's context-length 400), a message too long on its
own is refused once without losing the conversation, and /help, /reset, /exit never reach the model."""

from __future__ import annotations

import argparse
import builtins

import httpx
import pytest

from kvserve import chat
from kvserve.chat import Backend, ChatSession, ContextOverflow, run_chat
from kvserve.testing.live_server import start_live_server

WORDS = " ".join(f"word{i}" for i in range(40))


@pytest.fixture(scope="module")
def server(tiny_llama):
    live = start_live_server(str(tiny_llama), served_model_name="tiny-chat", api_key="chat-key",
                             max_model_len=256, num_gpu_blocks_override=128)
    yield live
    live.stop()


def args_for(server, max_tokens: int) -> argparse.Namespace:
    return argparse.Namespace(base_url=server.base_url, api_key="chat-key", max_tokens=max_tokens, temperature=0.0)


def prompt_tokens(server, messages) -> int:
    answer = httpx.post(server.base_url + "/tokenize", headers={"Authorization": "Bearer chat-key"},
                        json={"model": "tiny-chat", "messages": messages, "add_generation_prompt": True})
    return answer.json()["count"]


def test_remote_conversation_is_trimmed_to_the_context(server):
    notes: list[str] = []
    session = ChatSession(chat._remote(args_for(server, 64)), 64, notes.append)
    sent: list[int] = []
    for turn in range(8):
        assert session.turn(f"turn {turn}: {WORDS}") is not None
        sent.append(prompt_tokens(server, session.messages[:-1]))  # what the last turn sent
        assert sent[-1] + 64 <= 256
    assert any("oldest exchange" in note and "/reset" in note for note in notes)
    assert session.messages[0]["content"] != "turn 0: " + WORDS  # the first turns were dropped
    assert session.messages[-2]["content"] == "turn 7: " + WORDS


def test_a_message_too_long_alone_is_refused_once(server):
    notes: list[str] = []
    session = ChatSession(chat._remote(args_for(server, 32)), 32, notes.append)
    assert session.turn("hello") is not None
    history = list(session.messages)
    assert session.turn(" ".join(f"long{i}" for i in range(400))) is None
    assert session.messages == history
    assert any("message not sent" in note and "the model's context holds 256; shorten it" in note for note in notes)
    assert session.turn("and now a short one") is not None  # no repeated 400


def test_without_tokenize_the_oldest_turns_go_on_a_context_400():
    calls: list[int] = []

    def reply(messages, max_tokens):
        calls.append(len(messages))
        if len(messages) > 3:
            raise ContextOverflow("This model's maximum context length is 256 tokens.")
        yield "ok"

    session = ChatSession(Backend("m", reply, lambda messages: None), 16, lambda text: None)
    assert [session.turn(f"q{i}") for i in range(3)] == ["ok", "ok", "ok"]
    assert calls == [1, 3, 5, 3] and [m["content"] for m in session.messages] == ["q1", "ok", "q2", "ok"]


def test_local_engine_conversation_never_overflows(tiny_llama):
    args = build_local_args(tiny_llama)
    notes: list[str] = []
    session = ChatSession(chat._local(args), 48, notes.append)
    for turn in range(6):
        assert session.turn(f"turn {turn}: {WORDS[:60]}") is not None
    assert any("oldest exchange" in note for note in notes)
    assert session.messages[-2]["content"] == f"turn 5: {WORDS[:60]}"


def build_local_args(tiny_llama) -> argparse.Namespace:
    from kvserve.cli import build_parser

    return build_parser().parse_args(["chat", str(tiny_llama), "--max-model-len", "200", "--max-tokens", "48",
                                      "--temperature", "0", "--num-gpu-blocks-override", "64"])


def test_commands_are_handled_by_the_chat(monkeypatch, capsys):
    seen: list[list[dict]] = []

    def reply(messages, max_tokens):
        seen.append([dict(m) for m in messages])
        yield "fine"

    monkeypatch.setattr(chat, "_remote", lambda args: Backend("fake", reply, lambda messages: (1, 100)))
    lines = iter(["/help", "hi", "/reset", "/frobnicate", "again", "/exit", "never read"])
    monkeypatch.setattr(builtins, "input", lambda prompt="": next(lines))
    assert run_chat(argparse.Namespace(base_url="http://x", max_tokens=8, temperature=0.0, api_key=None)) == 0
    out = capsys.readouterr().out
    assert "/reset   forget the conversation" in out and "/exit    leave" in out
    assert "(conversation cleared)" in out and "(unknown command /frobnicate; /help lists the commands)" in out
    assert seen == [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "again"}]]
