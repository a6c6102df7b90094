"""A minimal offline driver: greedy generation for a handful of prompts through the paged runtime.

All prompts run together: step 0 prefills every prompt in one flat batch, each later step decodes
one token for every unfinished request. KV blocks are handed out once, up front, in order
(request 0 gets blocks 0..k-1, request 1 the next ones, ...); the real scheduler and KV-cache
manager live in ``kvserve.scheduler`` / ``kvserve.kv_cache``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from kvserve.errors import InvalidRequestError
from kvserve.model.loader import LoadedModel, load_model
from kvserve.model.runner import ModelRunner
from kvserve.request import Request
from kvserve.sampling_params import SamplingParams
from kvserve.scheduler.output import ScheduledRequest, SchedulerOutput


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
    loaded = load_model(model_dir, dtype=dtype, device=device)
    token_prompts = _tokenize(model_dir, prompts) if isinstance(prompts[0], str) else [list(p) for p in prompts]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos)
    eos = frozenset() if ignore_eos else _eos_ids(loaded)
    requests = [
        Request(str(i), ids, params, eos_token_ids=eos, max_tokens=max_tokens) for i, ids in enumerate(token_prompts)
    ]
    block_tables = _allocate_blocks(requests, max_tokens, block_size, loaded.arch.max_position_embeddings)
    runner = ModelRunner(loaded, sum(len(b) for b in block_tables), block_size, device)
    _run(runner, requests, block_tables)
    return [r.output_token_ids for r in requests]


def _allocate_blocks(requests: list[Request], max_tokens: int, block_size: int, max_len: int) -> list[list[int]]:
    if max_tokens < 1:
        raise InvalidRequestError(f"max_tokens must be >= 1, got {max_tokens}", param="max_tokens")
    tables, next_block = [], 0
    for r in requests:
        if r.num_prompt_tokens == 0:
            raise InvalidRequestError(f"prompt {r.request_id} is empty; prompts need >= 1 token", param="prompts")
        total = r.num_prompt_tokens + max_tokens
        if total > max_len:
            raise InvalidRequestError(
                f"prompt {r.request_id} has {r.num_prompt_tokens} tokens; this model accepts at most "
                f"{max_len} including max_tokens={max_tokens}",
                param="max_tokens",
            )
        num = -(-total // block_size)
        tables.append(list(range(next_block, next_block + num)))
        next_block += num
    return tables


def _run(runner: ModelRunner, requests: list[Request], block_tables: list[list[int]]) -> None:
    """Step until every request has ``max_tokens`` tokens or hit EOS."""
    active = list(range(len(requests)))
    while active:
        scheduled = []
        for i in active:
            r = requests[i]
            scheduled.append(ScheduledRequest(r, r.num_computed_tokens, r.num_tokens - r.num_computed_tokens,
                                              block_tables[i]))
        output = SchedulerOutput(scheduled, sum(s.num_new_tokens for s in scheduled))
        next_tokens = runner.execute_model(output).argmax(dim=-1).tolist()
        still_active = []
        for i, s, token in zip(active, scheduled, next_tokens, strict=True):
            r = requests[i]
            r.num_computed_tokens += s.num_new_tokens
            r.append_output_token_ids([token])
            if r.num_output_tokens < r.max_tokens and token not in r.eos_token_ids:
                still_active.append(i)
        active = still_active


def generate_cli_main(args: list[str] | None = None) -> int:
    """``kvserve generate MODEL_DIR --prompt TEXT [--prompt TEXT ...] --max-tokens N``: print the
    decoded greedy continuation of each prompt. Returns the exit status."""
    parser = argparse.ArgumentParser(prog="kvserve generate", description=generate_cli_main.__doc__)
    parser.add_argument("model")
    parser.add_argument("--prompt", action="append", required=True)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    parser.add_argument("--block-size", type=int, default=16)
    ns = parser.parse_args(args)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ns.model)
    outputs = generate(ns.model, ns.prompt, ns.max_tokens, dtype=ns.dtype, block_size=ns.block_size)
    for prompt, ids in zip(ns.prompt, outputs, strict=True):
        print(f"{prompt!r} -> {tokenizer.decode(ids)!r}")
    return 0


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    raise SystemExit(generate_cli_main())
