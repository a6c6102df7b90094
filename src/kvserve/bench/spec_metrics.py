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

from dataclasses import dataclass
from typing import Any

import httpx

_SUFFIXES = {"spec_decode_num_drafts_total": "drafts", "spec_decode_num_draft_tokens_total": "draft_tokens",
             "spec_decode_num_accepted_tokens_total": "accepted_tokens"}
_PER_POS = "spec_decode_num_accepted_tokens_per_pos_total"


@dataclass(frozen=True)
class SpecDecodeCounters:
    """Totals read from ``/metrics``; ``per_pos[i]``: drafts accepted at position ``i``."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    per_pos: tuple[float, ...] = ()


def parse_counters(text: str) -> SpecDecodeCounters | None:
    """The counters in a Prometheus text body, summed over label sets (engines, models); None when
    the body has none."""
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith(_PER_POS):
                position = int(sample.labels.get("position", 0))
                per_pos[position] = per_pos.get(position, 0.0) + float(sample.value)
                continue
            for suffix, field in _SUFFIXES.items():
                if sample.name.endswith(suffix):
                    totals[field] = totals.get(field, 0.0) + float(sample.value)
    if not totals:
        return None
    return SpecDecodeCounters(**totals, per_pos=tuple(per_pos.get(i, 0.0) for i in range(len(per_pos))))


def read_counters(base_url: str, headers: dict[str, str], verify: bool = True) -> SpecDecodeCounters | None:
    """``GET {base_url}/metrics`` parsed (None when unreachable or without the counters)."""
    try:
        response = httpx.get(base_url.rstrip("/") + "/metrics", headers=headers, verify=verify, timeout=10.0)
        response.raise_for_status()
    except httpx.HTTPError:
        return None
    return parse_counters(response.text)


def acceptance(before: SpecDecodeCounters | None, after: SpecDecodeCounters | None) -> dict[str, Any] | None:
    """The run's acceptance figures (see the module docstring), or None when nothing was drafted."""
    if after is None:
        return None
    before = before or SpecDecodeCounters()
    drafts, draft_tokens = after.drafts - before.drafts, after.draft_tokens - before.draft_tokens
    accepted = after.accepted_tokens - before.accepted_tokens
    if draft_tokens <= 0 or drafts <= 0:
        return None
    per_pos = [(a - (before.per_pos[i] if i < len(before.per_pos) else 0.0)) / drafts
               for i, a in enumerate(after.per_pos)]
    return {"spec_decode_acceptance_rate": 100.0 * accepted / draft_tokens,
            "spec_decode_acceptance_length": 1.0 + accepted / drafts,
            "spec_decode_num_drafts": int(drafts), "spec_decode_draft_tokens": int(draft_tokens),
            "spec_decode_accepted_tokens": int(accepted),
            "spec_decode_per_position_acceptance_rates": per_pos}


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
