"""logit_bias, min_tokens and penalties against plain-Python formulas on hand-made logits."""

from __future__ import annotations

import pytest
import torch

from kvserve.engine.param_validation import validate_sampling_params
from kvserve.errors import InvalidRequestError
from kvserve.sampling_params import SamplingParams
from kvserve.sample.sampler import Sampler

V = 8
LOGITS = [
    [2.0, -1.0, 0.5, 3.0, -2.5, 0.0, 1.5, -0.5],
    [-3.0, 1.0, 2.5, -0.25, 4.0, 0.75, -1.5, 0.1],
    [0.3, 0.2, -0.1, 1.1, -4.0, 2.2, 0.0, 5.0],
]


def reference_penalties(logits, prompt, output, repetition, presence, frequency):
    """CTRL repetition over prompt+output, then OpenAI presence/frequency over output."""
    result = []
    for token, value in enumerate(logits):
        if token in prompt or token in output:
            value = value / repetition if value > 0 else value * repetition
        count = output.count(token)
        value -= frequency * count + presence * (1 if count else 0)
        result.append(value)
    return result


def test_penalty_arithmetic_matches_formula(make_request, build):
    cases = [
        dict(prompt=[0, 1, 1], output=[3, 3, 5], repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.25),
        dict(prompt=[4], output=[4, 2, 2, 2, 7], repetition_penalty=0.8, presence_penalty=-1.0, frequency_penalty=1.5),
        dict(prompt=[7, 6], output=[], repetition_penalty=1.0, presence_penalty=2.0, frequency_penalty=2.0),
    ]
    requests = [make_request(temperature=0.0, **case) for case in cases]
    metadata = build(requests, V)
    processed = Sampler._process_logits(torch.tensor(LOGITS), metadata)
    for row, case in enumerate(cases):
        expected = reference_penalties(
            LOGITS[row], case["prompt"], case["output"],
            case["repetition_penalty"], case["presence_penalty"], case["frequency_penalty"],
        )
        assert processed[row].tolist() == pytest.approx(expected, abs=1e-6)


def test_no_penalties_leaves_logits_unchanged_and_skips_count_tensors(make_request, build):
    metadata = build([make_request(output=[1, 1], temperature=0.0)], V)
    assert metadata.penalties is None
    logits = torch.tensor(LOGITS[:1])
    assert Sampler._process_logits(logits, metadata) is logits


def test_logit_bias_added_to_the_right_rows(make_request, build):
    requests = [
        make_request(temperature=0.0, logit_bias={1: 100.0, 3: -2.0}),
        make_request(temperature=0.0),
        make_request(temperature=0.0, logit_bias={7: -100.0}),
    ]
    processed = Sampler._process_logits(torch.tensor(LOGITS), build(requests, V))
    expected = [list(row) for row in LOGITS]
    expected[0][1] += 100.0
    expected[0][3] -= 2.0
    expected[2][7] -= 100.0
    assert torch.allclose(processed, torch.tensor(expected), atol=1e-6, rtol=0)
    sampled = Sampler()(torch.tensor(LOGITS), build(requests, V)).sampled_token_ids
    assert sampled.tolist() == [1, 4, 5]


def test_logit_bias_outside_vocab_is_rejected(make_request, build):
    with pytest.raises(InvalidRequestError, match="out of the vocabulary") as info:
        validate_sampling_params(SamplingParams(logit_bias={V: 1.0}), V)
    assert info.value.param == "logit_bias"


def test_min_tokens_masks_eos_and_stop_ids_until_reached(make_request, build):
    # Token 3 (row 0's argmax) is EOS, token 4 (row 1's argmax) is a stop token id.
    requests = [
        make_request(eos=[3], output=[0], min_tokens=2, temperature=0.0),
        make_request(eos=[0], output=[], min_tokens=1, stop_token_ids=[4], temperature=0.0),
        make_request(eos=[7], output=[1], min_tokens=1, temperature=0.0),  # reached: no mask
        make_request(eos=[3], output=[], min_tokens=3, ignore_eos=True, stop_token_ids=[6], temperature=0.0),
    ]
    logits = torch.tensor(LOGITS + [LOGITS[0]])
    processed = Sampler._process_logits(logits, build(requests, V))
    inf = float("-inf")
    masked = {(r, t) for r in range(4) for t in range(V) if processed[r, t] == inf}
    # ignore_eos bans EOS too (vLLM bans ``all_stop_token_ids``, EOS included, whatever ignore_eos).
    assert masked == {(0, 3), (1, 0), (1, 4), (3, 3), (3, 6)}
    assert Sampler()(logits, build(requests, V)).sampled_token_ids.tolist() == [0, 2, 7, 0]
    # Once min_tokens output tokens exist, EOS is allowed again.
    requests[0].append_output_token_ids([5])
    assert Sampler()(logits, build(requests, V)).sampled_token_ids[0].item() == 3


def test_penalties_change_greedy_choice(make_request, build):
    # Row 1's argmax (token 4, logit 4.0) was generated 3 times: 4.0 - 3*1.0 - 0.5 = 0.5 < 2.5.
    request = make_request(output=[4, 4, 4], frequency_penalty=1.0, presence_penalty=0.5, temperature=0.0)
    sampled = Sampler()(torch.tensor(LOGITS[1:2]), build([request], V)).sampled_token_ids
    assert sampled.tolist() == [2]


def test_only_penalized_rows_change_and_statistics_cover_only_them(make_request, build):
    requests = [
        make_request(temperature=0.0),
        make_request(output=[3, 3], frequency_penalty=1.0, temperature=0.0),
        make_request(output=[0], temperature=0.0),
    ]
    metadata = build(requests, V)
    assert metadata.penalties.rows.tolist() == [1]
    assert metadata.penalties.output_token_counts.shape == (1, V)
    processed = Sampler._process_logits(torch.tensor(LOGITS), metadata)
    original = torch.tensor(LOGITS)
    assert torch.equal(processed[0], original[0]) and torch.equal(processed[2], original[2])
    expected = reference_penalties(LOGITS[1], [1, 2, 3], [3, 3], 1.0, 0.0, 1.0)
    assert torch.allclose(processed[1], torch.tensor(expected), atol=1e-6, rtol=0)
