"""allowed_token_ids (vLLM): only the listed ids can be generated, greedy or random, while
logprobs stay those of the raw logits; rows without the restriction are untouched."""

from __future__ import annotations

import math

import pytest
import torch

from kvserve.engine.param_validation import validate_sampling_params
from kvserve.errors import InvalidRequestError
from kvserve.sample.sampler import Sampler
from kvserve.sampling_params import SamplingParams

V = 64


def random_logits(rows: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, V, generator=torch.Generator().manual_seed(seed)) * 3.0


def argmax_over(row: list[float], ids: list[int]) -> int:
    return max(ids, key=lambda t: row[t])


def test_greedy_takes_the_argmax_over_the_allowed_ids(make_request, build):
    logits = random_logits(4, 0)
    allowed = [[3, 17, 40], None, [63], [0, 1, 2, 5, 8, 13]]
    requests = [make_request(temperature=0.0, allowed_token_ids=ids) for ids in allowed]
    sampled = Sampler()(logits, build(requests, V)).sampled_token_ids.tolist()
    rows = logits.tolist()
    assert sampled == [argmax_over(rows[0], allowed[0]), argmax_over(rows[1], list(range(V))), 63,
                       argmax_over(rows[3], allowed[3])]
    # The restriction matters: without it rows 0, 2 and 3 pick tokens outside their lists.
    unrestricted = logits.argmax(dim=1).tolist()
    assert all(unrestricted[r] not in allowed[r] for r in (0, 2, 3))


def test_random_rows_draw_only_allowed_ids_in_their_proportions(make_request, build):
    logits = random_logits(2, 1)
    allowed = [4, 9, 30]
    requests = [make_request(temperature=1.0, allowed_token_ids=allowed), make_request(temperature=1.0)]
    metadata = build(requests, V)
    counts = {t: 0 for t in allowed}
    other = set()
    for seed in range(400):
        sampled = Sampler(torch.Generator().manual_seed(seed))(logits, metadata).sampled_token_ids.tolist()
        counts[sampled[0]] += 1
        other.add(sampled[1])
    assert sum(counts.values()) == 400
    assert len(other) > 3  # the unrestricted row still draws from the whole vocabulary
    probs = torch.softmax(logits[0, allowed].double(), dim=0).tolist()
    for token, p in zip(allowed, probs):  # 400 draws: within 5 standard deviations
        assert abs(counts[token] / 400 - p) <= 5 * math.sqrt(p * (1 - p) / 400) + 1e-9


def test_logprobs_stay_raw_and_masked_rows_use_a_copy(make_request, build):
    logits = random_logits(1, 2)
    before = logits.clone()
    request = make_request(temperature=0.0, logprobs=2, allowed_token_ids=[7, 8])
    output = Sampler()(logits, build([request], V))
    token = output.sampled_token_ids.item()
    assert token == argmax_over(logits[0].tolist(), [7, 8])
    raw = torch.log_softmax(logits[0].double(), dim=0)
    assert math.isclose(output.logprobs[0].logprob, float(raw[token]), abs_tol=1e-5)
    assert output.logprobs[0].top_token_ids == raw.topk(2).indices.tolist()  # of the raw model
    assert torch.equal(logits, before)


def test_other_processors_apply_within_the_allowed_ids(make_request, build):
    logits = torch.zeros(1, V)
    logits[0, 10], logits[0, 11], logits[0, 12] = 5.0, 4.0, 1.0
    # A +50 bias on a token that is not allowed cannot bring it back; on an allowed one it wins.
    blocked = make_request(temperature=0.0, allowed_token_ids=[11, 12], logit_bias={10: 50.0, 20: 50.0})
    favoured = make_request(temperature=0.0, allowed_token_ids=[11, 12], logit_bias={12: 50.0})
    sampled = Sampler()(logits.repeat(2, 1), build([blocked, favoured], V)).sampled_token_ids.tolist()
    assert sampled == [11, 12]


def test_validation():
    with pytest.raises(InvalidRequestError) as info:
        validate_sampling_params(SamplingParams(allowed_token_ids=[]), V)
    assert info.value.param == "allowed_token_ids"
    with pytest.raises(InvalidRequestError, match="integers >= 0"):
        validate_sampling_params(SamplingParams(allowed_token_ids=[3, -1]), V)
    validate_sampling_params(SamplingParams(allowed_token_ids=[0, V - 1]), V)
    with pytest.raises(InvalidRequestError) as info:
        validate_sampling_params(SamplingParams(allowed_token_ids=[1, V]), V)
    assert info.value.param == "allowed_token_ids" and f"0..{V - 1}" in info.value.message
