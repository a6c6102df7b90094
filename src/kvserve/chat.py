"""``kvserve chat``: a small terminal chat, against a running server (``--base-url``, through the
official ``openai`` client, streamed) or an engine in this process.

The conversation always fits the model's context: before each turn the oldest exchanges are
dropped until prompt + ``--max-tokens`` fit (counted with the server's ``/tokenize``, or the local
tokenizer); a server without ``/tokenize`` is handled by dropping on its context-length 400. A
message that cannot fit even alone is refused and removed, so no error repeats on later turns.
Commands (``/help``, ``/reset``, ``/exit``) are handled here, never sent to the model.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

HELP = """commands:
  /help    this list
  /reset   forget the conversation (start afresh)
  /exit    leave (also /quit, Ctrl-D)
The oldest turns are dropped when the conversation outgrows the model's context."""

Replies = Callable[[list[dict], int | None], Iterator[str]]
Counter = Callable[[list[dict]], "tuple[int, int] | None"]


class ContextOverflow(Exception):
    """The prompt and reply do not fit the model's context."""


@dataclass
class Backend:
    """Where replies come from: ``reply(messages, max_tokens)`` streams text; ``count(messages)``
    gives ``(prompt tokens, max_model_len)`` or None when the backend cannot count."""

    model: str
    reply: Replies
    count: Counter


def _remote(args: argparse.Namespace) -> Backend:
    import httpx
    from openai import BadRequestError, OpenAI

    base_url = args.base_url.rstrip("/")
    if not base_url.endswith("/v1"):
        base_url += "/v1"
    api_key = (args.api_key or os.environ.get("KVSERVE_API_KEY") or os.environ.get("VLLM_API_KEY")
               or os.environ.get("OPENAI_API_KEY") or "EMPTY")
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    model = client.models.list().data[0].id

    def reply(messages: list[dict], max_tokens: int | None) -> Iterator[str]:
        try:
            stream = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens,
                                                    temperature=args.temperature, stream=True)
        except BadRequestError as exc:
            if "maximum context length" in str(exc):
                raise ContextOverflow(str(exc)) from exc
            raise
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                yield chunk.choices[0].delta.content

    def count(messages: list[dict]) -> tuple[int, int] | None:
        try:
            answer = httpx.post(base_url.removesuffix("/v1") + "/tokenize", timeout=30,
                                headers={"Authorization": f"Bearer {api_key}"},
                                json={"model": model, "messages": messages, "add_generation_prompt": True})
            body = answer.json()
            return int(body["count"]), int(body["max_model_len"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None  # not a kvserve/vLLM server: rely on its context-length 400

    return Backend(model, reply, count)


def _local(args: argparse.Namespace) -> Backend:
    from kvserve.builtin import resolve_model
    from kvserve.engine.arg_utils import engine_config_from_args, model_from_args
    from kvserve.engine.llm import LLM
    from kvserve.sampling_params import SamplingParams
    from kvserve.tokenizer import apply_chat_template

    model, name = resolve_model(model_from_args(args))
    llm = LLM.from_config(engine_config_from_args(model, args))

    def reply(messages: list[dict], max_tokens: int | None) -> Iterator[str]:
        params = SamplingParams(max_tokens=max_tokens, temperature=args.temperature)
        yield llm.chat(messages, params)[0].outputs[0].text

    def count(messages: list[dict]) -> tuple[int, int]:
        ids = apply_chat_template(llm.get_tokenizer(), messages, add_generation_prompt=True)
        return len(ids), llm.llm_engine.max_model_len

    return Backend(name, reply, count)


class ChatSession:
    """The conversation and how a turn is fitted into the context (see the module docstring)."""

    def __init__(self, backend: Backend, max_tokens: int, write: Callable[[str], None]):
        self.backend, self.max_tokens, self.write = backend, max_tokens, write
        self.messages: list[dict] = []

    def reset(self) -> None:
        self.messages.clear()

    def turn(self, text: str) -> str | None:
        """Answer ``text``; returns the reply (None when the message had to be refused)."""
        self.messages.append({"role": "user", "content": text})
        max_tokens = self._fit()
        while max_tokens is not None:
            try:
                reply = self._stream(max_tokens)
            except ContextOverflow as exc:
                if not self._drop_oldest():
                    return self._refuse(f"the server refused it: {exc}")
                max_tokens = self.max_tokens
                continue
            self.messages.append({"role": "assistant", "content": reply})
            return reply
        return None

    def _fit(self) -> int | None:
        """Drop old exchanges until the prompt + reply fit; the reply's token cap, or None
        (message refused, history kept) when the new message does not fit on its own."""
        alone = self.backend.count(self.messages[-1:])
        if alone is not None and alone[0] >= alone[1]:
            return self._refuse(f"it is {alone[0]} tokens and the model's context holds {alone[1]}; shorten it")
        cap, dropped = self.max_tokens, 0
        while (counted := self.backend.count(self.messages)) is not None:
            prompt, context = counted
            if prompt + self.max_tokens <= context:
                break
            if not self._drop_oldest():  # alone it fits, with a shorter reply
                cap = context - prompt
                self._note(f"(this reply is limited to {cap} tokens by the {context}-token context)")
                break
            dropped += 1
        if dropped:
            self._note(f"(dropped the {dropped} oldest exchange{'s' if dropped > 1 else ''} to fit the "
                       "model's context; /reset starts afresh)")
        return cap

    def _drop_oldest(self) -> bool:
        """Remove the oldest user message and the replies after it; False if only the newest is left."""
        users = [i for i, m in enumerate(self.messages) if m["role"] == "user"]
        if len(users) < 2:
            return False
        del self.messages[users[0]:users[1]]
        return True

    def _stream(self, max_tokens: int) -> str:
        parts: list[str] = []
        self.write("assistant> ")
        try:
            for piece in self.backend.reply(self.messages, max_tokens):
                parts.append(piece)
                self.write(piece)
        except KeyboardInterrupt:
            self.write(" (interrupted)")
        self.write("\n")
        return "".join(parts)

    def _refuse(self, why: str) -> None:
        self.messages.pop()
        self._note(f"(message not sent: {why})")
        return None

    def _note(self, text: str) -> None:
        self.write(text + "\n")


def run_chat(args: argparse.Namespace) -> int:
    """Read a line, print the streamed reply, repeat; ``/help`` lists the commands."""
    from openai import OpenAIError

    from kvserve.errors import KVServeError

    try:
        backend = _remote(args) if args.base_url else _local(args)
    except OpenAIError as exc:
        print(f"kvserve chat: cannot reach {args.base_url}: {exc}", file=sys.stderr)
        return 2
    session = ChatSession(backend, args.max_tokens, lambda text: print(text, end="", flush=True))
    print(f"Chatting with {backend.model}. /help lists the commands, /exit or Ctrl-D leaves.")
    while True:
        try:
            line = input("you> ").strip()
        except (EOFError, KeyboardInterrupt):
            print()
            return 0
        if not line:
            continue
        if line.startswith("/"):
            if _command(line, session):
                return 0
            continue
        try:
            session.turn(line)
        except (OpenAIError, KVServeError, ValueError) as exc:
            session.messages.pop()  # the failed message goes; the conversation stays
            print(f"\n[error: {exc}]")


def _command(line: str, session: ChatSession) -> bool:
    """Handle a ``/command``; True means leave."""
    command = line.split()[0].lower()
    if command in ("/exit", "/quit"):
        return True
    if command == "/reset":
        session.reset()
        print("(conversation cleared)")
    elif command in ("/help", "/?"):
        print(HELP)
    else:
        print(f"(unknown command {command}; /help lists the commands)")
    return False
