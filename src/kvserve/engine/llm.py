"""The offline API, compatible with vLLM's: ``LLM(model=...).generate(prompts, SamplingParams(...))``;
a pooling model's ``LLM(model, runner="pooling").embed(prompts)``, a classifier's ``classify`` and
``score`` (``kvserve.engine.llm_pooling``)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvserve.beam_search import BeamSearch, BeamSearchParams, BeamSearchSequence, step_candidates
from kvserve.config import EngineConfig
from kvserve.engine.arg_utils import engine_config_from_kwargs
from kvserve.engine.llm_engine import LLMEngine
from kvserve.engine.llm_pooling import PoolingMixin
from kvserve.engine.progress import Progress, UseTqdm
from kvserve.lora.request import LoRARequest
from kvserve.outputs import CompletionOutput, RequestOutput
from kvserve.sampling_params import SamplingParams
from kvserve.tokenizer import apply_chat_template

PromptType = str | list[int] | dict[str, Any]


@dataclass
class BeamSearchOutput:
    """vLLM's: the ``beam_width`` best sequences of one prompt, best first (each one's ``tokens``
    start with the prompt's and its ``text`` decodes them all)."""

    sequences: list[BeamSearchSequence]


def merge_delta(final: RequestOutput | None, delta: RequestOutput) -> RequestOutput:
    """Fold a delta ``RequestOutput`` into the accumulated one (texts and tokens appended)."""
    if final is None:
        final = RequestOutput(
            delta.request_id, delta.prompt, delta.prompt_token_ids, delta.prompt_logprobs, [], False,
            delta.num_cached_tokens,
        )
    if delta.prompt_logprobs is not None:
        final.prompt_logprobs = delta.prompt_logprobs
    final.num_cached_tokens = max(final.num_cached_tokens, delta.num_cached_tokens)
    by_index = {c.index: c for c in final.outputs}
    for piece in delta.outputs:
        choice = by_index.get(piece.index)
        if choice is None:
            choice = by_index[piece.index] = CompletionOutput(piece.index, "", [], None, None)
            final.outputs.append(choice)
        choice.text += piece.text
        choice.token_ids.extend(piece.token_ids)
        if piece.logprobs is not None:
            choice.logprobs = (choice.logprobs or []) + list(piece.logprobs)
            choice.cumulative_logprob = sum(lp.logprob for lp in choice.logprobs)
        choice.finish_reason, choice.stop_reason = piece.finish_reason, piece.stop_reason
    final.outputs.sort(key=lambda c: c.index)
    final.finished = delta.finished
    if final.error is None:
        final.error, final.client_error = delta.error, delta.client_error
    return final


class LLM(PoolingMixin):
    """An engine in this process, run to completion on each call: ``generate``, ``chat``,
    ``beam_search``; a pooling model's ``embed``, ``encode``, ``classify`` and ``score``
    (``PoolingMixin``).

    Args:
        model: a Hugging Face model folder; ``None`` = the built-in model.
        chat_template: overrides the checkpoint's chat template (text or file path).
        **engine_kwargs: engine settings with vLLM's names (``dtype``, ``max_model_len``,
            ``block_size``, ``enable_prefix_caching``, ``max_num_seqs``,
            ``max_num_batched_tokens``, ``kv_cache_memory_bytes``, ``num_gpu_blocks_override``,
            ``scheduling_policy``, ``seed``, ``runner`` / ``convert`` / ``task`` for pooling, ...).

    Raises:
        TypeError: an unknown engine setting. CheckpointError: the model cannot be loaded.
    """

    def __init__(self, model: str | None = None, *, chat_template: str | None = None, **engine_kwargs: Any):
        if model is None:
            from kvserve.builtin import builtin_model_path

            model = str(builtin_model_path())
        self._init_engine(LLMEngine(engine_config_from_kwargs(model, **engine_kwargs), chat_template))

    def _init_engine(self, engine: LLMEngine) -> None:
        self.llm_engine = engine
        self._ids = itertools.count()

    @classmethod
    def from_config(cls, config: EngineConfig, chat_template: str | None = None) -> LLM:
        """An ``LLM`` from a ready ``EngineConfig`` (the command line's path)."""
        llm = cls.__new__(cls)
        llm._init_engine(LLMEngine(config, chat_template))
        return llm

    def shutdown(self) -> None:
        """Stop the engine's tensor-parallel worker ranks (with ``tensor_parallel_size > 1``);
        idempotent. They also stop when this process exits."""
        self.llm_engine.shutdown()

    def get_tokenizer(self) -> Any:
        return self.llm_engine.tokenizer

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: UseTqdm = True,
        priority: int | Sequence[int] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Generate for each prompt (a string, a list of token ids, or ``{"prompt_token_ids":
        [...]}`` / ``{"prompt": "..."}``), all batched together; outputs in prompt order.
        ``lora_request``: one adapter for every prompt or one per prompt (None: the base model),
        as vLLM's; needs ``enable_lora=True``. ``priority``: one for every prompt or one per
        prompt. ``use_tqdm``: a progress bar (``kvserve.engine.progress``), vLLM's default.

        Raises:
            InvalidRequestError: an invalid prompt or parameter (nothing is run then).
            LoRAAdapterError: an adapter folder that cannot be served (named field).
            RequestRejectedError: more prompts x n than the waiting queue takes (nothing is run).
        """
        prompt_list = self._as_list(prompts)
        params_list = self._params_list(sampling_params, len(prompt_list))
        loras = self._lora_list(lora_request, len(prompt_list))
        priorities = self._per_prompt(priority or 0, len(prompt_list), "priorities")
        engine = self.llm_engine
        requests = [
            engine.process_inputs(str(next(self._ids)), prompt, params, priority=priorities[i], lora_request=loras[i])
            for i, (prompt, params) in enumerate(zip(prompt_list, params_list))
        ]
        engine.add_requests(requests)
        return self._run([r.request_id for r in requests], use_tqdm)

    def chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: UseTqdm = True,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
        priority: int | Sequence[int] | None = None,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Generate replies to one conversation or a list of them, rendered with the chat
        template (vLLM's ``LLM.chat``): ``tools`` (OpenAI function tools) and
        ``chat_template_kwargs`` (e.g. ``{"enable_thinking": False}``) go to the template; the
        reply is the model's text (tool calls are not parsed offline, as in vLLM).

        Raises:
            InvalidRequestError: the template failed on a conversation (nothing is run then).
        """
        conversations = messages if messages and isinstance(messages[0], list) else [messages]
        prompts = [
            {"prompt_token_ids": apply_chat_template(
                self.get_tokenizer(), conv, add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message, chat_template=chat_template,
                tools=tools, chat_template_kwargs=chat_template_kwargs,
            )}
            for conv in conversations
        ]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm, priority=priority,
                             lora_request=lora_request)

    def beam_search(
        self,
        prompts: PromptType | Sequence[PromptType],
        params: BeamSearchParams,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[BeamSearchOutput]:
        """Beam search for each prompt (``kvserve.beam_search``), all prompts' beams batched in
        each step; vLLM's ``LLM.beam_search``.

        Raises:
            InvalidRequestError: an invalid prompt, a search that does not fit the context
                (prompt + ``max_tokens``), or ``beam_width`` above 10 (nothing is run then).
        """
        params.check()
        prompt_list = self._as_list(prompts)
        loras = self._lora_list(lora_request, len(prompt_list))
        engine = self.llm_engine
        checked = [engine.process_inputs(str(next(self._ids)), prompt, params.whole_params(), lora_request=lora)
                   for prompt, lora in zip(prompt_list, loras)]
        tokenizer = self.get_tokenizer()
        searches = [BeamSearch(list(r.prompt_token_ids), params, tokenizer.eos_token_id, r.sampling_params.max_tokens) for r in checked]
        while not all(search.done for search in searches):
            live = [(search, lora) for search, lora in zip(searches, loras) if not search.done]
            requests = [[engine.process_inputs(str(next(self._ids)), {"prompt_token_ids": beam.tokens},
                                               params.step_params(), lora_request=lora) for beam in search.beams]
                        for search, lora in live]
            engine.add_requests([r for group in requests for r in group])
            outputs = iter(self._run([r.request_id for group in requests for r in group]))
            for (search, _), group in zip(live, requests):
                search.advance([step_candidates(next(outputs)) for _ in group])
        results = []
        for search in searches:
            best = search.best()
            for beam in best:
                beam.text = tokenizer.decode(beam.tokens, skip_special_tokens=params.skip_special_tokens)
            results.append(BeamSearchOutput(best))
        return results

    def _run(self, ids: list[str], use_tqdm: UseTqdm = False) -> list[RequestOutput]:
        engine = self.llm_engine
        finals: dict[str, RequestOutput] = {}
        pending = set(ids)
        progress = Progress(use_tqdm, len(ids))
        try:
            while pending:
                for delta in engine.step().outputs:
                    finals[delta.request_id] = merge_delta(finals.get(delta.request_id), delta)
                    if delta.finished:
                        pending.discard(delta.request_id)
                        progress.finished(finals[delta.request_id])
        finally:
            progress.close()
        return [finals[i] for i in ids]

    @staticmethod
    def _per_prompt(value, count: int, what: str) -> list:
        """One value for every prompt, or one per prompt (a list of ``count``)."""
        values = list(value) if isinstance(value, (list, tuple)) else [value] * count
        if len(values) != count:
            raise ValueError(f"got {len(values)} {what} for {count} prompts")
        return values

    @staticmethod
    def _as_list(prompts: PromptType | Sequence[PromptType]) -> list[PromptType]:
        """One prompt (a string, token ids, a dict prompt) or a sequence of them, as a list.

        Raises:
            TypeError: anything else (a number, None, a set, ...).
        """
        if isinstance(prompts, (str, dict)):
            return [prompts]
        if not isinstance(prompts, Sequence) or isinstance(prompts, (bytes, bytearray)):
            raise TypeError(f"prompts must be a string, a list of token ids, a prompt dict "
                            f"({{\"prompt\": ...}} or {{\"prompt_token_ids\": [...]}}) or a list of these; got "
                            f"{type(prompts).__name__}")
        if prompts and isinstance(prompts[0], int):
            return [list(prompts)]
        return list(prompts)

    def _lora_list(self, lora_request, count: int) -> list[LoRARequest | None]:
        """One adapter (or None) per prompt, each folder checked once against the model."""
        loras = self._per_prompt(lora_request, count, "LoRA requests")
        registry = self.llm_engine.lora_registry
        for lora in loras:
            if lora is not None and not isinstance(lora, LoRARequest):
                raise TypeError(f"lora_request must be a LoRARequest, got {type(lora).__name__}")
            if lora is not None and registry is not None:
                registry.check(lora)
        return loras

    def get_default_sampling_params(self) -> SamplingParams:
        """``SamplingParams`` with the model's defaults (``generation_config.json``, as vLLM's)."""
        defaults = self.llm_engine.config.model.sampling_defaults
        values = {k: v for k, v in defaults.as_dict().items() if k != "max_tokens"}
        return SamplingParams(**values, max_tokens=defaults.cap_max_tokens(SamplingParams().max_tokens))

    def _params_list(self, params, count: int) -> list[SamplingParams]:
        if params is None:
            return [self.get_default_sampling_params() for _ in range(count)]
        if isinstance(params, SamplingParams):
            return [params] * count
        if len(params) != count:
            raise ValueError(f"got {len(params)} SamplingParams for {count} prompts")
        return list(params)
