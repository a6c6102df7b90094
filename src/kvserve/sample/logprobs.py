"""Log-probabilities returned to users: the chosen (or actual) token's logprob and rank, and the
top-k alternatives, from the raw ``log_softmax`` of the logits (before logit_bias, penalties and
temperature), which is what vLLM returns by default."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from kvserve.outputs import PromptLogprobsChunk, TokenLogprobs


def gather_logprobs(
    logprobs: torch.Tensor, token_ids: torch.Tensor, num_logprobs: list[int]
) -> list[TokenLogprobs]:
    """Turn a ``[M, V]`` log-probability matrix into one ``TokenLogprobs`` per row.

    Args:
        logprobs: float32 ``[M, V]``, normalized log-probabilities.
        token_ids: int64 ``[M]``, the token to score in each row.
        num_logprobs: per row, how many top alternatives to return (0..V).

    Returns:
        One ``TokenLogprobs`` per row: ``logprob`` of ``token_ids[i]``, its 1-based ``rank``
        (1 + the number of tokens with a strictly larger logprob, as vLLM), and the
        ``num_logprobs[i]`` most likely ids and their logprobs, most likely first.
    """
    if logprobs.shape[0] == 0:
        return []
    chosen = logprobs.gather(1, token_ids.unsqueeze(1))
    ranks = (logprobs > chosen).sum(dim=1) + 1
    max_k = max(num_logprobs)
    top_values, top_ids = logprobs.topk(max_k, dim=1)
    # One device-to-host copy per tensor; the rest is list slicing.
    chosen_list = chosen.squeeze(1).tolist()
    rank_list = ranks.tolist()
    top_id_list = top_ids.tolist()
    top_value_list = top_values.tolist()
    return [
        TokenLogprobs(
            token_id=token_id,
            logprob=chosen_list[i],
            rank=rank_list[i],
            top_token_ids=top_id_list[i][:k],
            top_logprobs=top_value_list[i][:k],
        )
        for i, (token_id, k) in enumerate(zip(token_ids.tolist(), num_logprobs))
    ]


def prompt_logprobs_from_logits(
    logits: torch.Tensor, token_ids: torch.Tensor | list[int], k: int
) -> list[TokenLogprobs]:
    """Logprobs of prompt tokens.

    Row ``i`` of ``logits`` is the model's prediction for ``token_ids[i]``: the caller passes the
    logits of prompt positions ``0..P-1`` with the prompt tokens shifted by one (tokens ``1..P``).

    Args:
        logits: ``[P, V]`` raw logits (any float dtype; computed in float32).
        token_ids: int ``[P]``, the actual next tokens.
        k: number of top alternatives per position (``SamplingParams.prompt_logprobs``).

    Returns:
        ``P`` entries of ``TokenLogprobs`` (logprob and rank of the actual token, top ``k``).
    """
    token_ids = torch.as_tensor(token_ids, dtype=torch.int64, device=logits.device)
    if token_ids.shape != logits.shape[:1]:
        raise ValueError(f"token_ids has shape {tuple(token_ids.shape)}, expected ({logits.shape[0]},)")
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    return gather_logprobs(logprobs, token_ids, [k] * logits.shape[0])


def batch_prompt_logprobs(model: Any, batch: Any, rows: np.ndarray, req_ids: list[str], hidden: torch.Tensor,
                          query_start_loc: np.ndarray) -> dict[str, PromptLogprobsChunk]:
    """The prompt logprobs a step computes for ``rows`` of the runner's ``InputBatch``: logits
    row i of a request computing tokens ``[c, c + n)`` scores prompt token ``c + i + 1`` (through
    ``model.compute_logits`` of its ``hidden`` rows); a recompute after preemption scores positions
    again (the scheduler passes each position on once)."""
    result = {}
    for i, (row, req_id) in enumerate(zip(rows.tolist(), req_ids)):
        state = batch.states[row]
        k = state.spec.sampling_params.prompt_logprobs
        start = int(batch.num_computed_tokens[row])
        num_prompt = len(state.spec.prompt_token_ids)
        if k is None or start >= num_prompt - 1:
            continue
        end = min(start + int(query_start_loc[i + 1] - query_start_loc[i]), num_prompt - 1)
        logits = model.compute_logits(hidden[query_start_loc[i] : query_start_loc[i] + end - start])
        targets = state.spec.prompt_token_ids[start + 1 : end + 1]
        result[req_id] = PromptLogprobsChunk(start + 1, prompt_logprobs_from_logits(logits, targets, k))
    return result
