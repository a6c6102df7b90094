"""Engine ``TokenLogprobs`` in the two OpenAI formats.

Completions (legacy, parallel lists; with ``echo`` the prompt tokens come first and the first
prompt token has no logprob)::

    {"tokens": ["Hello", " world"], "token_logprobs": [null, -2.3],
     "top_logprobs": [null, {" world": -2.3, " there": -2.9}], "text_offset": [0, 5]}

Chat (one object per generated token)::

    {"content": [{"token": " world", "logprob": -2.3, "bytes": [32, 119, ...],
                  "top_logprobs": [{"token": " world", "logprob": -2.3, "bytes": [...]}, ...]}]}
"""

from __future__ import annotations

import math
from kvserve.api.responses import (ChatLogprobToken, ChatTopLogprob, CompletionLogProbs,
                                   PromptLogprob)
from kvserve.api.tokenization import TokenText
from kvserve.outputs import TokenLogprobs

# JSON has no -inf; vLLM reports impossible tokens with this value too.
MIN_LOGPROB = -9999.0


def _finite(logprob: float) -> float:
    return MIN_LOGPROB if math.isinf(logprob) or math.isnan(logprob) else max(logprob, MIN_LOGPROB)


class CompletionLogprobsBuilder:
    """Builds completions logprobs for one choice, chunk by chunk (``text_offset`` continues).

    Args:
        token_text: ``token_id -> (text, bytes)`` (see ``make_token_text``).
        num_top: entries wanted in each ``top_logprobs`` dict (the chosen token is added too,
            as vLLM does, so a dict may hold ``num_top + 1``).
    """

    def __init__(self, token_text: TokenText, num_top: int):
        self.token_text = token_text
        self.num_top = num_top
        self.offset = 0  # characters, relative to the choice's returned text

    def _append(self, out: CompletionLogProbs, token_id: int, entry: TokenLogprobs | None) -> None:
        text, _ = self.token_text(token_id)
        out.tokens.append(text)
        out.text_offset.append(self.offset)
        self.offset += len(text)
        if entry is None:
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
            return
        out.token_logprobs.append(_finite(entry.logprob))
        top: dict[str, float] = {}
        for top_id, logprob in zip(entry.top_token_ids[: self.num_top], entry.top_logprobs):
            top.setdefault(self.token_text(top_id)[0], _finite(logprob))
        top.setdefault(text, _finite(entry.logprob))
        out.top_logprobs.append(top)

    def prompt(self, prompt_token_ids: list[int],
               prompt_logprobs: list[TokenLogprobs | None] | None) -> CompletionLogProbs:
        """Entries for the echoed prompt; ``prompt_logprobs[i]`` scores prompt token i."""
        out = CompletionLogProbs()
        entries = list(prompt_logprobs or [])
        entries += [None] * (len(prompt_token_ids) - len(entries))
        for token_id, entry in zip(prompt_token_ids, entries):
            self._append(out, token_id, entry)
        return out

    def generated(self, logprobs: list[TokenLogprobs]) -> CompletionLogProbs:
        """Entries for newly generated tokens."""
        out = CompletionLogProbs()
        for entry in logprobs:
            self._append(out, entry.token_id, entry)
        return out


def merge_completion_logprobs(parts: list[CompletionLogProbs]) -> CompletionLogProbs:
    """Concatenate chunk logprobs into the non-streamed form."""
    merged = CompletionLogProbs()
    for part in parts:
        merged.tokens += part.tokens
        merged.token_logprobs += part.token_logprobs
        merged.top_logprobs += part.top_logprobs
        merged.text_offset += part.text_offset
    return merged


def _chat_top(token_text: TokenText, token_id: int, logprob: float) -> ChatTopLogprob:
    text, raw = token_text(token_id)
    return ChatTopLogprob(token=text, logprob=_finite(logprob), bytes=list(raw))


def chat_logprobs(token_text: TokenText, logprobs: list[TokenLogprobs], num_top: int) -> list[ChatLogprobToken]:
    """Chat ``logprobs.content`` entries, one per generated token, ``num_top`` alternatives each."""
    content = []
    for entry in logprobs:
        chosen = _chat_top(token_text, entry.token_id, entry.logprob)
        top = [_chat_top(token_text, token_id, logprob)
               for token_id, logprob in zip(entry.top_token_ids[:num_top], entry.top_logprobs)]
        content.append(ChatLogprobToken(**chosen.model_dump(), top_logprobs=top))
    return content


def prompt_logprobs_json(token_text: TokenText, prompt_token_ids: list[int],
                         prompt_logprobs: list[TokenLogprobs | None] | None) -> list[dict[int, PromptLogprob] | None] | None:
    """vLLM's ``prompt_logprobs`` field: per prompt position, token id -> logprob/rank/text."""
    if prompt_logprobs is None:
        return None
    result: list[dict[int, PromptLogprob] | None] = []
    for entry in prompt_logprobs:
        if entry is None:
            result.append(None)
            continue
        scored = {entry.token_id: PromptLogprob(logprob=_finite(entry.logprob), rank=entry.rank,
                                                decoded_token=token_text(entry.token_id)[0])}
        for rank, (token_id, logprob) in enumerate(zip(entry.top_token_ids, entry.top_logprobs), 1):
            scored.setdefault(token_id, PromptLogprob(logprob=_finite(logprob), rank=rank,
                                                      decoded_token=token_text(token_id)[0]))
        result.append(scored)
    return result
