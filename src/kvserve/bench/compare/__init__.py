"""``kvserve bench compare``: the engine-selection procedure as one command.

    kvserve bench compare --spec benchmarks/compare/qwen_shaped.yaml --out bench_results/compare-qwen

Write the workload down (spec), load every engine at every level one engine at a time, probe the
failure modes, find each engine's goodput knee and the replicas a target rate needs, and report
it all with provenance (docs/bench_compare.md).

Modules:
    spec            the YAML spec, validated with pydantic (load_spec)
    distributions   length distributions: fixed, uniform, normal, lognormal, file
    workload        the request mix as prompts (SampleRequest lists)
    engine_process  start / stop / restart shell commands of one engine
    probe_client    canary requests, dropped streams, Prometheus gauges, first-token wait
    probes          the failure-mode probes
    store           the output folder: cells, probes, provenance; resume keys
    run             the orchestration with a progress display (Compare)
    stats           SLO attainment, goodput, knee, replicas, tail-percentile sample sizes
    analysis        stored files -> compare.json, report.md, report.html
    plots, html_report, markdown   the figures (matplotlib SVG) and the two documents
"""
