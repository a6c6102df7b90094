"""``report.html``: one self-contained page (inline CSS, figures as base64 SVG data URIs, no
script, nothing fetched at view time). Rendered with Jinja2 with autoescaping on; every figure is
an ``<img data-plot="NAME">`` so a browser test can find each one."""

from __future__ import annotations

import base64
import json
from typing import Any

from jinja2 import Environment

from kvserve.bench.compare.plots import PLOTS, TITLES

_TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>kvserve bench compare: {{ d.name }}</title>
<style>
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1200px;padding:0 1em;color:#222}
h1{font-size:1.6em}h2{margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.6em 0;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums}
.pass{color:#14642a;font-weight:600}.fail{color:#a11;font-weight:600}.skipped{color:#777}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #eee}
code,pre{font:12px ui-monospace,monospace;white-space:pre-wrap;word-break:break-all}
.note{color:#8a5a00}
</style></head><body>
<h1>kvserve bench compare: {{ d.name }}</h1>
{% if d.description %}<p>{{ d.description }}</p>{% endif %}
<p>Hardware: {{ d.hardware or "not described" }} · load axis: {{ d.axis }} ({{ d.levels|join(", ") }}) ·
generated {{ d.provenance.timestamp }} by kvserve {{ d.provenance.kvserve_version }} at commit
<code>{{ d.provenance.git_commit or d.provenance.git_error }}</code>{% if d.provenance.git_dirty %} (dirty tree){% endif %}</p>

<h2 id="slos">SLOs</h2>
<table><tr><th>metric</th><th>limit</th><th>at least this share of requests sent</th></tr>
{% for m, s in d.slos.items() %}<tr><td>{{ m }}</td><td class="num">{{ "%g"|format(s.limit_ms) }} ms</td>
<td class="num">{{ "%g"|format(s.percentile) }} %</td></tr>{% endfor %}</table>
<p>Goodput: requests completed within every limit per second. A level meets the SLOs when each
limit holds for at least its share of the requests sent (failures count as misses); the knee is
the highest level that does, walking up until the first that does not.</p>

<h2 id="capacity">Capacity</h2>
<table><tr><th>engine</th><th>status</th><th>knee</th><th>goodput at knee (req/s)</th><th>replicas</th><th>arithmetic</th></tr>
{% for e in d.engines %}<tr><td>{{ e.name }}</td><td>{{ e.status }}</td>
<td>{{ e.knee.label if e.knee else "none" }}</td>
<td class="num">{{ "%.3f"|format(e.knee.goodput) if e.knee else "-" }}</td>
<td class="num">{{ e.capacity.replicas if e.capacity and e.capacity.replicas is not none else "-" }}</td>
<td>{{ e.capacity.arithmetic if e.capacity else "no capacity target in the spec" }}</td></tr>{% endfor %}</table>

<h2 id="plots">Plots</h2>
{% for name, title, uri in plots %}<figure id="plot-{{ name }}"><img data-plot="{{ name }}" alt="{{ title }}" src="{{ uri }}">
<figcaption>{{ title }}</figcaption></figure>
{% endfor %}

<h2 id="levels">Load levels</h2>
{% for e in d.engines %}<h3>{{ e.name }}</h3>
{% if e.levels %}<table><tr><th>level</th><th>ok / sent</th><th>req/s</th><th>out tok/s</th><th>goodput req/s</th>
<th>TTFT p50</th><th>TTFT p99</th><th>TPOT p50</th><th>TPOT p99</th><th>ITL p99</th><th>E2E p99</th><th>peak conc.</th><th>SLOs</th></tr>
{% for l in e.levels %}<tr><td>{{ l.label }}</td><td class="num">{{ l.completed }} / {{ l.requests }}</td>
<td class="num">{{ "%.2f"|format(l.request_throughput) }}</td><td class="num">{{ "%.1f"|format(l.output_throughput) }}</td>
<td class="num">{{ "%.2f"|format(l.goodput) }}</td>
{% for k in ["ttft_p50_ms","ttft_p99_ms","tpot_p50_ms","tpot_p99_ms","itl_p99_ms","e2el_p99_ms"] %}
<td class="num">{{ "%.1f"|format(l[k]) if l[k] is not none else "-" }}</td>{% endfor %}
<td class="num">{{ l.peak_concurrency }}</td>
<td class="{{ 'pass' if l.meets_slos else 'fail' }}">{{ "met" if l.meets_slos else "missed" }}
{% for s in l.slos %}<br>{{ s.metric }} {{ "%.1f"|format(100 * s.attainment) }}% ≤ {{ "%g"|format(s.limit_ms) }} ms{% endfor %}</td></tr>
{% endfor %}</table>{% else %}<p class="note">no measured level{% if e.info.skipped %}: {{ e.info.skipped }}{% elif e.info.error %}: {{ e.info.error }}{% endif %}</p>{% endif %}
{% for n in e.notes %}<p class="note">{{ n }}</p>{% endfor %}
{% endfor %}

<h2 id="failures">Failure modes</h2>
<table><tr><th>engine</th>{% for p in probes %}<th>{{ p }}</th>{% endfor %}</tr>
{% for e in d.engines %}<tr><td>{{ e.name }}</td>{% for p in probes %}{% set r = e.probes.get(p) %}
<td>{% if r %}<span class="{{ r.outcome }}">{{ r.outcome }}</span><br>{{ r.summary }}{% else %}<span class="skipped">not run</span>{% endif %}</td>
{% endfor %}</tr>{% endfor %}</table>

<h2 id="provenance">Provenance</h2>
<table><tr><th>engine</th><th>/version</th><th>model</th><th>flags</th><th>commit</th><th>machine</th><th>commands</th></tr>
{% for e in d.engines %}{% set i = e.info %}<tr><td>{{ e.name }}<br><code>{{ i.base_url }}</code></td>
<td><code>{{ i.version|tojson if i.version else i.version_error or i.skipped or i.error or "-" }}</code></td>
<td>{{ i.model or "-" }}{% if i.served_models %}<br>served: {{ i.served_models|join(", ") }}{% endif %}{% if i.max_model_len %}<br>context {{ i.max_model_len }}{% endif %}</td>
<td><code>{{ (i.flags or [])|join(" ") or "-" }}</code></td>
<td><code>{{ i.commit or "unknown" }}</code>{% if i.dirty %} (dirty){% endif %}</td>
<td>{{ i.machine or "-" }}</td>
<td>{% for k in ["start","stop","restart"] %}{% if i[k] %}{{ k }}: <code>{{ i[k] }}</code><br>{% endif %}{% endfor %}
{% if i.metrics_url %}metrics: <code>{{ i.metrics_url }}</code> ({{ "read" if i.metrics_readable else i.metrics_error }}){% endif %}</td></tr>
{% endfor %}</table>
<p>This report: <code>{{ d.provenance.command|join(" ") }}</code> on {{ d.provenance.hostname }}
({{ d.provenance.cpu_model }}, {{ d.provenance.cpu_count }} CPUs, {{ d.provenance.platform }}), python
{{ d.provenance.python_version }}, torch {{ d.provenance.torch_version or "-" }}.</p>
<h2 id="spec">Spec</h2><pre>{{ spec_json }}</pre>
</body></html>
"""


def svg_data_uri(svg: str) -> str:
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode("utf-8")).decode("ascii")


def render_html(data: dict[str, Any], plots: dict[str, str]) -> str:
    """The page for ``compare.json``'s data and the SVG figures of :func:`make_plots`."""
    from kvserve.bench.compare.probes import PROBES

    env = Environment(autoescape=True, trim_blocks=True, lstrip_blocks=True)
    figures = [(name, TITLES[name], svg_data_uri(plots[name])) for name in PLOTS]
    return env.from_string(_TEMPLATE).render(d=data, plots=figures, probes=PROBES,
                                             spec_json=json.dumps(data["spec"], indent=2))
