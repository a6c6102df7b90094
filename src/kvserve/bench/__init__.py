"""``kvserve bench``: an honest load generator and report for OpenAI-compatible servers.

    kvserve bench serve --base-url http://127.0.0.1:8000 --tokenizer MODEL_DIR \
        --dataset-name random --input-len 512 --output-len 128 --num-prompts 200 \
        --request-rate 4 --burstiness 1 --max-concurrency 32 --num-warmups 4 \
        --goodput ttft:500 tpot:100 --result-file bench_results/serve.json
    kvserve bench sweep --base-url ... --tokenizer MODEL_DIR --concurrency 1,8,32 \
        --result-file bench_results/sweep.json           # + sweep.png (throughput vs TTFT/TPOT)
    kvserve bench throughput --model MODEL_DIR --input-len 512 --output-len 128 --num-prompts 64

Modules:
    arrivals   seeded Poisson / gamma inter-arrival gaps
    datasets   workload registry (random, shared-prefix) + file_datasets (sharegpt, jsonl)
    prompts    exact-token-length prompt text under the target tokenizer
    client     one streamed request (httpx), payloads for completions and chat
    stream     SSE framing and per-request timing (TTFT, ITL, E2E)
    metrics    summary statistics, throughput, goodput, peak concurrency
    runner     the online loop: warmups, arrivals, concurrency cap, duration
    sweep      several load levels, plot and table
    throughput offline run through ``kvserve.engine.llm.LLM``
    provenance command line, git, versions, machine, server; report writes result files
    cli, commands   argument parsing (``add_bench_parser``, ``run_bench``) and command bodies
"""
