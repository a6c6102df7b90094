"""``report.md``: the comparison's summary as Markdown tables (capacity, levels, probes,
provenance), for a pull request or ``docs/benchmarks.md``."""

from __future__ import annotations

import json
from typing import Any

from kvserve.bench.compare.probes import PROBES


def _f(value: Any, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(d: dict[str, Any]) -> str:
    prov = d["provenance"]
    slos = ", ".join(f"{m} <= {s['limit_ms']:g} ms for {s['percentile']:g}% of requests" for m, s in d["slos"].items())
    out = [f"# bench compare: {d['name']}", "",
           f"{d['description']}".strip(), "",
           f"Hardware: {d['hardware'] or 'not described'}. Levels ({d['axis']}): {', '.join(d['levels'])}. "
           f"SLOs: {slos}.", "",
           f"Run {prov['timestamp']}, kvserve {prov['kvserve_version']} at commit "
           f"{prov['git_commit'] or prov['git_error']}{' (dirty)' if prov['git_dirty'] else ''}, "
           f"{prov['cpu_model']}, {prov['cpu_count']} CPUs.", "",
           "## Capacity", "", "| engine | status | knee | goodput at knee (req/s) | replicas | arithmetic |",
           "|---|---|---|---|---|---|"]
    for e in d["engines"]:
        cap = e["capacity"] or {}
        out.append(f"| {e['name']} | {e['status']} | {e['knee']['label'] if e['knee'] else 'none'} | "
                   f"{_f(e['knee']['goodput'] if e['knee'] else None, '{:.3f}')} | {_f(cap.get('replicas'), '{}')} | "
                   f"{_cell(cap.get('arithmetic', 'no capacity target'))} |")
    out += ["", "## Load levels", "",
            "| engine | level | ok/sent | req/s | out tok/s | goodput | TTFT p50 | TTFT p99 | TPOT p50 | TPOT p99 "
            "| ITL p99 | E2E p99 | SLOs |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for e in d["engines"]:
        for lvl in e["levels"]:
            out.append(f"| {e['name']} | {lvl['label']} | {lvl['completed']}/{lvl['requests']} | "
                       f"{lvl['request_throughput']:.2f} | {lvl['output_throughput']:.1f} | {lvl['goodput']:.2f} | "
                       + " | ".join(_f(lvl[k]) for k in ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms",
                                                         "itl_p99_ms", "e2el_p99_ms"))
                       + f" | {'met' if lvl['meets_slos'] else 'missed'} |")
    out += ["", "Latencies in ms.", *[f"- {n}" for e in d["engines"] for n in e["notes"]], "",
            "## Failure modes", "", "| engine | probe | outcome | summary |", "|---|---|---|---|"]
    for e in d["engines"]:
        for p in PROBES:
            r = e["probes"].get(p)
            out.append(f"| {e['name']} | {p} | {r['outcome'] if r else 'not run'} | {_cell(r['summary']) if r else ''} |")
    out += ["", "## Provenance", "", "| engine | /version | model | commit | flags | machine |", "|---|---|---|---|---|---|"]
    for e in d["engines"]:
        i = e["info"]
        version = json.dumps(i["version"]) if i.get("version") else None
        out.append(f"| {e['name']} | {_cell(version or i.get('version_error') or i.get('skipped') or i.get('error') or '-')} "
                   f"| {i.get('model') or '-'} | {i.get('commit') or 'unknown'} | "
                   f"`{_cell(' '.join(i.get('flags') or [])) or '-'}` | {_cell(i.get('machine') or '-')} |")
    return "\n".join(out) + "\n"
