"""``kvserve chat``: a small terminal chat, against a running server (``--base-url``, through the
official ``openai`` client, streamed) or an engine in this process."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator


def _remote_replies(args: argparse.Namespace) -> tuple[str, callable]:
    from openai import OpenAI

    base_url = args.base_url.rstrip("/")
    if not base_url.endswith("/v1"):
        base_url += "/v1"
    api_key = args.api_key or os.environ.get("KVSERVE_API_KEY") or os.environ.get("OPENAI_API_KEY") or "EMPTY"
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    model = client.models.list().data[0].id

    def reply(messages: list[dict]) -> Iterator[str]:
        stream = client.chat.completions.create(
            model=model, messages=messages, max_tokens=args.max_tokens, temperature=args.temperature, stream=True
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                yield chunk.choices[0].delta.content

    return model, reply


def _local_replies(args: argparse.Namespace) -> tuple[str, callable]:
    from kvserve.builtin import resolve_model
    from kvserve.engine.arg_utils import engine_config_from_args
    from kvserve.engine.llm import LLM
    from kvserve.sampling_params import SamplingParams

    from kvserve.engine.arg_utils import model_from_args

    model, name = resolve_model(model_from_args(args))
    llm = LLM.from_config(engine_config_from_args(model, args))
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature)

    def reply(messages: list[dict]) -> Iterator[str]:
        yield llm.chat(messages, params)[0].outputs[0].text

    return name, reply


def run_chat(args: argparse.Namespace) -> int:
    """Read a line, print the streamed reply, repeat; ``/reset`` clears the history, ``/quit``,
    an empty line at EOF or Ctrl-D ends."""
    from openai import OpenAIError

    try:
        model, reply = _remote_replies(args) if args.base_url else _local_replies(args)
    except OpenAIError as exc:
        print(f"kvserve chat: cannot reach {args.base_url}: {exc}", file=sys.stderr)
        return 2
    print(f"Chatting with {model}. /reset clears the conversation, /quit or Ctrl-D exits.")
    messages: list[dict] = []
    while True:
        try:
            line = input("you> ").strip()
        except (EOFError, KeyboardInterrupt):
            print()
            return 0
        if line in ("/quit", "/exit"):
            return 0
        if line == "/reset":
            messages.clear()
            print("(conversation cleared)")
            continue
        if not line:
            continue
        messages.append({"role": "user", "content": line})
        print("assistant> ", end="", flush=True)
        parts = []
        try:
            for piece in reply(messages):
                parts.append(piece)
                print(piece, end="", flush=True)
        except OpenAIError as exc:
            print(f"\n[error: {exc}]")
            messages.pop()
            continue
        print()
        messages.append({"role": "assistant", "content": "".join(parts)})
    return 0


