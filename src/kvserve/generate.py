"""A minimal offline driver: greedy generation for a handful of prompts through the model runner
alone (no scheduler, no tokenizer needed for token-id prompts), used by tests to check the paged
runtime against ``transformers.generate``.

Step 0 prefills every prompt in one flat batch; each later step decodes one token for every
unfinished request. KV blocks are handed out once, up front, in order (request 0 gets blocks
1..k, request 1 the next ones, ...; block 0 is the null block); the real scheduler and KV-cache
manager live in ``kvserve.scheduler`` / ``kvserve.kv_cache``.
"""

from __future__ import annotations

from pathlib import Path

from kvserve.errors import InvalidRequestError
from kvserve.model.loader import LoadedModel, load_model
from kvserve.model.runner import ModelRunner
from kvserve.sampling_params import SamplingParams
from kvserve.request import Request
from kvserve.scheduler.output import CachedRequestData, NewRequestData, SchedulerOutput


def _tokenize(model_dir: str | Path, prompts: list[str]) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    return [tokenizer(p)["input_ids"] for p in prompts]


def _eos_ids(loaded: LoadedModel) -> frozenset[int]:
    eos = loaded.generation_config.get("eos_token_id", list(loaded.arch.eos_token_ids))
    return frozenset(eos if isinstance(eos, list) else ([] if eos is None else [eos]))


def generate(
    model_dir: str | Path,
    prompts: list[str] | list[list[int]],
    max_tokens: int,
    dtype: str = "auto",
    block_size: int = 16,
    ignore_eos: bool = False,
    device: str = "cpu",
) -> list[list[int]]:
    """Greedy (argmax) continuations of ``prompts``.

    Args:
        model_dir: Hugging Face model folder (tokenizer files needed only for string prompts).
        prompts: strings (tokenized with ``AutoTokenizer``) or lists of token ids.
        max_tokens: tokens to generate per prompt (fewer when EOS comes first).
        dtype: ``auto``, ``float32``, ``bfloat16`` or ``float16``.
        block_size: tokens per KV block.
        ignore_eos: keep going past EOS (config/generation_config ``eos_token_id``).

    Returns:
        The generated token ids per prompt (an EOS that ended a request is included).

    Raises:
        InvalidRequestError: empty prompt list or prompt, ``max_tokens < 1``, or a prompt plus
            ``max_tokens`` beyond ``max_position_embeddings``.
        CheckpointError: from ``load_model``.
    """
    if not prompts:
        raise InvalidRequestError("prompts must hold at least one prompt", param="prompts")
    if max_tokens < 1:
        raise InvalidRequestError(f"max_tokens must be >= 1, got {max_tokens}", param="max_tokens")
    loaded = load_model(model_dir, dtype=dtype, device=device)
    token_prompts = _tokenize(model_dir, prompts) if isinstance(prompts[0], str) else [list(p) for p in prompts]
    max_len = loaded.arch.max_position_embeddings
    tables = _allocate_blocks(token_prompts, max_tokens, block_size, max_len)
    runner = ModelRunner(loaded, 1 + sum(len(t) for t in tables), block_size, device,
                         max_num_reqs=len(token_prompts), max_model_len=max_len)
    eos = frozenset() if ignore_eos else _eos_ids(loaded)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    news = [NewRequestData.from_request(Request.of(str(i), ids, params, eos_token_ids=eos, max_tokens=max_tokens), table)
            for i, (ids, table) in enumerate(zip(token_prompts, tables))]
    return _run(runner, news, max_tokens, eos)


def _allocate_blocks(prompts: list[list[int]], max_tokens: int, block_size: int, max_len: int) -> list[list[int]]:
    tables, next_block = [], 1
    for i, prompt in enumerate(prompts):
        if not prompt:
            raise InvalidRequestError(f"prompt {i} is empty; prompts need >= 1 token", param="prompts")
        total = len(prompt) + max_tokens
        if total > max_len:
            raise InvalidRequestError(
                f"prompt {i} has {len(prompt)} tokens; this model accepts at most {max_len} including "
                f"max_tokens={max_tokens}", param="max_tokens")
        num = -(-total // block_size)
        tables.append(list(range(next_block, next_block + num)))
        next_block += num
    return tables


def _run(runner: ModelRunner, news: list[NewRequestData], max_tokens: int, eos: frozenset[int]) -> list[list[int]]:
    """Step until every request has ``max_tokens`` tokens or hit EOS."""
    outputs: dict[str, list[int]] = {new.req_id: [] for new in news}
    computed = {new.req_id: 0 for new in news}
    plan = SchedulerOutput(news, CachedRequestData(), {n.req_id: len(n.spec.prompt_token_ids) for n in news},
                           sum(len(n.spec.prompt_token_ids) for n in news))
    while plan.num_scheduled_tokens:
        sampled = runner.execute_model(plan).sampled_token_ids
        active, finished = [], set()
        for req_id, num_new in plan.num_scheduled_tokens.items():
            token = sampled[req_id][0]
            computed[req_id] += num_new
            outputs[req_id].append(token)
            if len(outputs[req_id]) < max_tokens and token not in eos:
                active.append(req_id)
            else:
                finished.add(req_id)
        cached = CachedRequestData(active, [[] for _ in active], [computed[r] for r in active])
        plan = SchedulerOutput([], cached, dict.fromkeys(active, 1), len(active), finished)
    return [outputs[new.req_id] for new in news]
