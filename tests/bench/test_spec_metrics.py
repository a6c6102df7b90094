"""``kvserve bench serve``'s speculative-decoding block: the difference of the server's
``spec_decode_*`` counters over the run, with either prefix, summed over engines."""

from __future__ import annotations

import pytest

from kvserve.bench.spec_metrics import acceptance, format_acceptance, parse_counters
from kvserve.spec_decode.stats import SpecDecodingStats


def body(prefix: str, drafts: int, draft_tokens: int, accepted: int, per_pos: list[int], engines=("0",)) -> str:
    lines = []
    for name, value in (("spec_decode_num_drafts", drafts), ("spec_decode_num_draft_tokens", draft_tokens),
                        ("spec_decode_num_accepted_tokens", accepted)):
        lines.append(f"# TYPE {prefix}{name} counter")
        lines += [f'{prefix}{name}_total{{engine="{e}",model_name="m"}} {value}' for e in engines]
    lines.append(f"# TYPE {prefix}spec_decode_num_accepted_tokens_per_pos counter")
    lines += [f'{prefix}spec_decode_num_accepted_tokens_per_pos_total{{engine="{e}",model_name="m",position="{i}"}} {v}'
              for e in engines for i, v in enumerate(per_pos)]
    lines.append("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("prefix", ["kvserve:", "vllm:"])
def test_acceptance_over_a_run(prefix):
    before = parse_counters(body(prefix, 10, 40, 20, [8, 6, 4, 2]))
    after = parse_counters(body(prefix, 30, 120, 90, [28, 24, 20, 18]))
    assert before == SpecDecodingStats(10, 40, 20, (8, 6, 4, 2))
    figures = acceptance(before, after)
    assert figures == {"spec_decode_acceptance_rate": 100 * 70 / 80, "spec_decode_acceptance_length": 1 + 70 / 20,
                       "spec_decode_num_drafts": 20, "spec_decode_draft_tokens": 80, "spec_decode_accepted_tokens": 70,
                       "spec_decode_per_position_acceptance_rates": [1.0, 0.9, 0.8, 0.8]}
    text = format_acceptance(figures)
    assert "Acceptance rate (%):                     87.50" in text and "100.0, 90.0, 80.0, 80.0" in text


def test_engines_are_summed_and_absent_counters_give_nothing():
    two = parse_counters(body("kvserve:", 1, 4, 3, [1, 1, 1, 0], engines=("0", "1")))
    assert two == SpecDecodingStats(2, 8, 6, (2, 2, 2, 0))
    assert parse_counters("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\n") is None
    assert acceptance(None, None) is None
    same = parse_counters(body("kvserve:", 5, 20, 10, [3, 3, 2, 2]))
    assert acceptance(same, same) is None  # nothing drafted during the run
    assert acceptance(None, same)["spec_decode_num_drafts"] == 5
