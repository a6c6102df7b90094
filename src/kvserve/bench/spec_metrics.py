"""Speculative-decoding acceptance of a ``kvserve bench serve`` run, from the server's counters.

The server's ``/metrics`` is read before and after the run; the difference of vLLM's
``spec_decode_*`` counters (``kvserve:`` or ``vllm:`` prefix, matched by name suffix) gives::

    acceptance rate    = accepted tokens / draft tokens
    acceptance length  = 1 + accepted tokens / drafts        (the target's own token counted)
    per position       = drafts accepted at position i / drafts

A server without these counters (no speculation, or another engine) gives None: nothing is
printed or stored.
"""

from __future__ import annotations

from typing import Any

import httpx

from kvserve.spec_decode.stats import SpecDecodingStats

_SUFFIXES = {"spec_decode_num_drafts_total": "num_drafts", "spec_decode_num_draft_tokens_total": "num_draft_tokens",
             "spec_decode_num_accepted_tokens_total": "num_accepted_tokens"}
_PER_POS = "spec_decode_num_accepted_tokens_per_pos_total"


def parse_counters(text: str) -> SpecDecodingStats | None:
    """The counters in a Prometheus text body, summed over label sets (engines, models); None when
    the body has none."""
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, int] = {}
    per_pos: dict[int, int] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith(_PER_POS):
                position = int(sample.labels.get("position", 0))
                per_pos[position] = per_pos.get(position, 0) + int(sample.value)
                continue
            for suffix, field in _SUFFIXES.items():
                if sample.name.endswith(suffix):
                    totals[field] = totals.get(field, 0) + int(sample.value)
    if not totals:
        return None
    return SpecDecodingStats(**totals, num_accepted_tokens_per_pos=tuple(per_pos.get(i, 0) for i in range(len(per_pos))))


def read_counters(base_url: str, headers: dict[str, str], verify: bool = True) -> SpecDecodingStats | None:
    """``GET {base_url}/metrics`` parsed (None when unreachable or without the counters)."""
    try:
        response = httpx.get(base_url.rstrip("/") + "/metrics", headers=headers, verify=verify, timeout=10.0)
        response.raise_for_status()
    except httpx.HTTPError:
        return None
    return parse_counters(response.text)


def acceptance(before: SpecDecodingStats | None, after: SpecDecodingStats | None) -> dict[str, Any] | None:
    """The run's acceptance figures (see the module docstring), or None when nothing was drafted."""
    if after is None:
        return None
    run = after.minus(before or SpecDecodingStats())
    if run.num_draft_tokens <= 0 or run.num_drafts <= 0:
        return None
    return {"spec_decode_acceptance_rate": 100.0 * run.num_accepted_tokens / run.num_draft_tokens,
            "spec_decode_acceptance_length": run.mean_acceptance_length,
            "spec_decode_num_drafts": run.num_drafts, "spec_decode_draft_tokens": run.num_draft_tokens,
            "spec_decode_accepted_tokens": run.num_accepted_tokens,
            "spec_decode_per_position_acceptance_rates": [a / run.num_drafts for a in run.num_accepted_tokens_per_pos]}


def format_acceptance(figures: dict[str, Any]) -> str:
    """The block printed after the summary."""
    num, line = "{:<40} {:<10.2f}".format, "{:<40} {:<10}".format
    per_pos = ", ".join(f"{100 * r:.1f}" for r in figures["spec_decode_per_position_acceptance_rates"])
    return "\n".join(["{s:{c}^{n}}".format(s="Speculative Decoding", n=50, c="-"),
                      num("Acceptance rate (%):", figures["spec_decode_acceptance_rate"]),
                      num("Acceptance length:", figures["spec_decode_acceptance_length"]),
                      line("Drafts:", figures["spec_decode_num_drafts"]),
                      line("Draft tokens:", figures["spec_decode_draft_tokens"]),
                      line("Accepted tokens:", figures["spec_decode_accepted_tokens"]),
                      line("Per-position acceptance (%):", per_pos), "=" * 50])
