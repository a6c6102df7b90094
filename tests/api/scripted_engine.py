"""A scripted :class:`EngineClient` for testing the HTTP layer alone.

``ScriptedEngine`` follows the engine contract (delta ``RequestOutput`` objects, errors before
the first yield, ``abort``) but "generates" a fixed script instead of running a model: choice
``i`` emits the token ids of ``SCRIPT`` starting at token ``i`` (so choices differ), one token
per step. Logprobs are a known function of the position, so tests can compute the expected
values independently:

    logprob of generated token k      = -(k + 1) / 10,   rank 1
    top alternatives of token t       = [t, t + 1, t + 2, ...] with logprobs -(k+1)/10 - j
    prompt logprob of prompt token p  = -p / 100 (position 0: None)

``TextEngine`` writes a given text instead, cut into random token pieces and detokenized by the
engine's own detokenizer (with the request's ``skip_special_tokens``), for tests of the parsers
behind the chat endpoint.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

from kvserve.engine.async_llm import EngineClient
from kvserve.engine.detokenizer import IncrementalDetokenizer
from kvserve.engine.engine_request import EngineRequest
from kvserve.engine.input_processor import InputProcessor
from kvserve.engine.request_stream import RequestStream
from kvserve.errors import RequestRejectedError
from kvserve.outputs import CompletionOutput, RequestOutput, TokenLogprobs
from kvserve.sampling_params import SamplingParams

SCRIPT = "Once upon a time there was a little model. Café 你好 🙂 The end."


def generated_logprobs(step: int, token_id: int, k: int, vocab_size: int) -> TokenLogprobs:
    base = -(step + 1) / 10
    top = [(token_id + j) % vocab_size for j in range(k)]
    return TokenLogprobs(token_id, base, 1, top, [base - j for j in range(k)])


def prompt_logprob(position: int, token_id: int, k: int, vocab_size: int) -> TokenLogprobs:
    top = [(token_id + j) % vocab_size for j in range(k)]
    return TokenLogprobs(token_id, -position / 100, 1, top, [-position / 100 - j for j in range(k)])


class ScriptedEngine(EngineClient):
    """Test double of the engine contract, with kvserve's real input processor (so validation is
    the engine's). ``calls`` records ``(request_id, prompt ids, params, kwargs)`` of admitted
    requests; ``aborted`` the aborted ids; ``running`` the ids being generated now."""

    def __init__(self, tokenizer, *, max_model_len: int = 256, step_delay: float = 0.0):
        self.tokenizer = tokenizer
        self.model_name = "scripted-model"
        self.max_model_len = max_model_len
        self.vocab_size = len(tokenizer)
        self.eos_token_ids = {tokenizer.eos_token_id}
        self.input_processor = InputProcessor(tokenizer, self.vocab_size, max_model_len,
                                              frozenset(self.eos_token_ids))
        self.script_ids = tokenizer.encode(SCRIPT, add_special_tokens=False)
        self.step_delay = step_delay
        self.reject_reason: str | None = None
        self.ready = True
        self.calls: list[tuple[str, list[int], SamplingParams, dict]] = []
        self.aborted: list[str] = []
        self.running: set[str] = set()
        self._tasks: dict[str, asyncio.Task] = {}

    @property
    def is_ready(self) -> bool:
        return self.ready

    def _abort_now(self, request_id: str) -> None:
        self.aborted.append(request_id)
        self.running.discard(request_id)
        task = self._tasks.pop(request_id, None)
        if task is not None:
            task.cancel()

    def choice_token_ids(self, index: int, max_tokens: int) -> list[int]:
        """The token ids choice ``index`` generates (the script shifted by ``index``)."""
        ids = self.script_ids[index:]
        return ids[:max_tokens]

    async def add_requests(self, requests: list[EngineRequest]) -> RequestStream:
        if self.reject_reason is not None:
            raise RequestRejectedError(f"rejected: {self.reject_reason}", self.reject_reason)
        stream = RequestStream(requests, asyncio.get_running_loop(), self._abort_now)
        for index, r in enumerate(requests):
            self.calls.append((r.request_id, list(r.prompt_token_ids), r.sampling_params,
                               {"prompt": r.prompt, "priority": r.priority, "cache_salt": r.cache_salt}))
            self.running.add(r.request_id)
            self._tasks[r.request_id] = asyncio.ensure_future(self._feed(r, stream.sink(index)))
        return stream

    async def _feed(self, request: EngineRequest, sink) -> None:
        try:
            async for output in self._steps(request.prompt_token_ids, request.sampling_params, request.request_id,
                                            request.prompt):
                sink(output)
        finally:
            self.running.discard(request.request_id)
            self._tasks.pop(request.request_id, None)

    async def _steps(self, prompt_ids, params, request_id, prompt) -> AsyncIterator[RequestOutput]:
        n, k = params.n, params.logprobs
        choices = [self.choice_token_ids(i, params.max_tokens or self.max_model_len) for i in range(n)]
        prompt_lps = None
        if params.prompt_logprobs is not None:
            prompt_lps = [None] + [prompt_logprob(p, t, params.prompt_logprobs, self.vocab_size)
                                   for p, t in enumerate(prompt_ids) if p > 0]
        texts = ["" for _ in range(n)]
        for step in range(max(len(c) for c in choices)):
            if self.step_delay:
                await asyncio.sleep(self.step_delay)
            else:
                await asyncio.sleep(0)
            outputs = []
            for i, ids in enumerate(choices):
                if step >= len(ids):
                    continue
                full = self.tokenizer.decode(ids[: step + 1])
                last = step + 1 == len(ids)
                if full.endswith("\ufffd") and not last:
                    delta = ""  # hold back a partial UTF-8 character, as the detokenizer does
                else:
                    delta, texts[i] = full[len(texts[i]):], full
                logprobs = [generated_logprobs(step, ids[step], k, self.vocab_size)] if k is not None else None
                outputs.append(CompletionOutput(i, delta, [ids[step]], logprobs=logprobs,
                                                finish_reason="length" if last else None))
            yield RequestOutput(request_id, prompt, list(prompt_ids), prompt_lps if step == 0 else None,
                                outputs, finished=step + 1 == max(len(c) for c in choices),
                                num_cached_tokens=3 if step == 0 else 0)


class TextEngine(ScriptedEngine):
    """Every choice writes ``text`` (then stops, as at EOS), 1-4 tokens per step in a pattern
    seeded by the choice index, so each choice's stream is cut differently."""

    def __init__(self, tokenizer, text: str):
        super().__init__(tokenizer, max_model_len=4096)
        self.text = text

    async def _steps(self, prompt_ids, params, request_id, prompt) -> AsyncIterator[RequestOutput]:
        ids = self.tokenizer.encode(self.text, add_special_tokens=False)
        plans = []
        for index in range(params.n):
            rng, cuts, at = random.Random(index), [], 0
            while at < len(ids):
                cuts.append(ids[at:at + rng.randint(1, 4)])
                at += len(cuts[-1])
            plans.append(cuts)
        detokenizers = [IncrementalDetokenizer(self.tokenizer, list(prompt_ids), params.skip_special_tokens)
                        for _ in range(params.n)]
        for step in range(max(len(p) for p in plans)):
            await asyncio.sleep(0)
            outputs = []
            for index, plan in enumerate(plans):
                if step < len(plan):
                    last = step + 1 == len(plan)
                    text = detokenizers[index].add_tokens(plan[step])
                    text += detokenizers[index].flush() if last else ""
                    outputs.append(CompletionOutput(index, text, plan[step], logprobs=None,
                                                    finish_reason="stop" if last else None))
            yield RequestOutput(request_id, prompt, list(prompt_ids), None, outputs,
                                finished=step + 1 == max(len(p) for p in plans), num_cached_tokens=0)
