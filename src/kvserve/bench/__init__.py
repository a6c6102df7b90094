"""``kvserve bench``: an honest load generator and report for OpenAI-compatible servers.

    kvserve bench serve --backend vllm --model MODEL --endpoint /v1/completions \
        --dataset-name random --random-input-len 512 --random-output-len 128 --num-prompts 200 \
        --request-rate 4 --max-concurrency 32 --goodput ttft:500 tpot:100 \
        --save-result --result-dir bench_results          # any `vllm bench serve` command line
    kvserve bench sweep --base-url ... --tokenizer MODEL_DIR --concurrency 1,8,32 \
        --result-file bench_results/sweep.json           # + sweep.png (throughput vs TTFT/TPOT)
    kvserve bench throughput --input-len 512 --output-len 128 --num-prompts 64   # built-in model

Modules:
    flags, refused  vLLM's ``bench serve`` flags (implemented / refused by name) and kvserve's
    cli, commands   parsing to a ``ServeConfig`` (``add_bench_parser``, ``run_bench``), command bodies
    arrivals   seeded Poisson / gamma arrivals, vLLM's rescaled fixed-count schedule and ramp-up
    datasets   workload registry (random, prefix_repetition, shared-prefix) + file_datasets
               (sharegpt, custom, spec_bench, jsonl)
    prompts    exact-token-length prompt text under the target tokenizer
    client     one streamed request (httpx) with vLLM's payloads and headers
    stream     SSE framing and per-request timing (TTFT, ITL, E2E)
    metrics    summary statistics, throughput, goodput, peak concurrency
    runner     the online loop: ready check, warmups, arrivals, concurrency cap, duration
    vllm_result  vLLM's flat result keys, printed summary and file name
    sweep      several load levels, plot and table
    throughput offline run through ``kvserve.engine.llm.LLM``
    machine_probe, roofline, roofline_report  the machine's bandwidth and matmul peak (same run),
               the workload's bound from the model's shapes, each run's fraction of it
    provenance command line, git, versions, machine, server; report writes result files
"""
