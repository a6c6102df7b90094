"""Beam search behind the HTTP API: :class:`BeamSearchStream` has ``RequestStream``'s interface
(``requests``, ``outputs()``, ``close()``), so the completion and chat handlers answer a beam
search as any other call::

    prompt i ─► BeamSearch ─► each step: one engine call (a 1-token request per live beam,
                              AsyncLLM.add_requests) ─► advance ─► ... ─► (i, RequestOutput)

A prompt's one delta is its final ``RequestOutput``: the ``beam_width`` best sequences as choices
(index = rank), each with its text (a final EOS not shown), token ids, cumulative logprob, and
``finish_reason`` (``stop`` at EOS, else ``length``). Prompts are searched concurrently.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from kvserve.beam_search import BeamSearch, BeamSearchParams, step_candidates
from kvserve.engine.engine_request import EngineRequest
from kvserve.engine.llm import merge_delta
from kvserve.outputs import CompletionOutput, RequestOutput

if TYPE_CHECKING:
    from kvserve.engine.async_llm import EngineClient
    from kvserve.engine.request_stream import RequestStream


class BeamSearchStream:
    """The beam searches of one call.

    Args:
        engine: runs the steps.
        requests: the call's prompts, validated with ``BeamSearchParams.whole_params``.
        params: the search.
        logprobs: top logprobs per generated token in the output, or None for none.
    """

    def __init__(self, engine: EngineClient, requests: list[EngineRequest], params: BeamSearchParams,
                 logprobs: int | None = None):
        self.requests = requests
        self.engine = engine
        self.params = params
        self.logprobs = logprobs
        self._steps: set[RequestStream] = set()
        self._tasks: list[asyncio.Task] = []

    async def outputs(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """``(prompt index, final output)`` as each prompt's search ends.

        Raises:
            RequestFailedError, RequestRejectedError: a step failed or was refused (the call's
                other searches are stopped).
        """
        self._tasks = [asyncio.ensure_future(self._search(i, r)) for i, r in enumerate(self.requests)]
        try:
            for done in asyncio.as_completed(self._tasks):
                yield await done
        finally:
            self.close()

    def close(self) -> None:
        """Stop every search (abort its step in flight). Idempotent."""
        for task in self._tasks:
            task.cancel()
        for stream in list(self._steps):
            stream.close()

    async def _search(self, index: int, request: EngineRequest) -> tuple[int, RequestOutput]:
        search = BeamSearch(list(request.prompt_token_ids), self.params, self.engine.tokenizer.eos_token_id,
                            request.sampling_params.max_tokens)
        process = self.engine.input_processor.process
        step_params = self.params.step_params(self.logprobs)
        while not search.done:
            def prepare(step: int = search.steps, beams=search.beams) -> list[EngineRequest]:
                return [process(f"{request.request_id}-step{step}-beam{j}", {"prompt_token_ids": beam.tokens},
                                step_params, priority=request.priority, cache_salt=request.cache_salt,
                                lora_request=request.lora_request) for j, beam in enumerate(beams)]

            stream = await self.engine.add_requests(await asyncio.to_thread(prepare))
            self._steps.add(stream)
            finals: dict[int, RequestOutput] = {}
            try:
                async for j, delta in stream.outputs():
                    finals[j] = merge_delta(finals.get(j), delta)
            finally:
                stream.close()
                self._steps.discard(stream)
            search.advance([step_candidates(finals[j]) for j in range(len(finals))])
        return index, self._output(request, search)

    def _output(self, request: EngineRequest, search: BeamSearch) -> RequestOutput:
        def decode(ids: list[int]) -> str:
            return self.engine.tokenizer.decode(ids, skip_special_tokens=self.params.skip_special_tokens)

        choices = [
            CompletionOutput(index=i, text=decode(search.text_ids(beam)),
                             token_ids=search.generated(beam), cumulative_logprob=beam.cum_logprob,
                             logprobs=None if self.logprobs is None else search.token_logprobs(beam, self.logprobs),
                             finish_reason=beam.finish_reason, stop_reason=beam.stop_reason)
            for i, beam in enumerate(search.best())
        ]
        return RequestOutput(request.request_id, request.prompt, list(request.prompt_token_ids), None, choices,
                             finished=True)
