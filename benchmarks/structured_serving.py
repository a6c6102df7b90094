"""What structured outputs cost a served model: throughput at a concurrency with every request
constrained by a typical tool schema against the same requests unconstrained, and the time to
first token of a schema the server has not compiled yet against a cached one.

One kvserve server (``--model``, default the built-in model) runs every phase, in this order:

1. warm-up;
2. ``--concurrency`` streams of ``--num-requests`` chat requests without a constraint (greedy,
   ``--output-len`` tokens, ``ignore_eos``); then the same with ``response_format`` set to a tool
   schema (the same schema for every request: the steady state of an agent), twice alternating;
3. TTFT one request at a time: a new schema each time (a distinct property name) against the
   same schema again (cached) against no schema.

    python benchmarks/structured_serving.py --model /tmp/qwen-shaped --concurrency 32 --num-requests 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import httpx

from servers import KVSERVE, free_port, running_server

TOOL_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "enum": ["get_weather", "search", "book_flight"]},
        "arguments": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "units": {"enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
    "required": ["name", "arguments"],
}


def body(model: str, output_len: int, schema: dict | None, stream: bool = False) -> dict:
    request = {"model": model, "messages": [{"role": "user", "content": "What is the weather in Paris for 3 days?"}],
               "max_tokens": output_len, "temperature": 0, "ignore_eos": True, "stream": stream}
    if schema is not None:
        request["response_format"] = {"type": "json_schema", "json_schema": {"name": "call", "schema": schema}}
    return request


async def throughput(client: httpx.AsyncClient, model: str, args, schema: dict | None) -> float:
    """Output tokens per second over ``num_requests`` requests at ``concurrency``."""
    queue: asyncio.Queue = asyncio.Queue()
    for _ in range(args.num_requests):
        queue.put_nowait(None)
    tokens = 0

    async def worker() -> None:
        nonlocal tokens
        while not queue.empty():
            queue.get_nowait()
            response = await client.post("/v1/chat/completions", json=body(model, args.output_len, schema))
            response.raise_for_status()
            tokens += response.json()["usage"]["completion_tokens"]

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    return tokens / (time.perf_counter() - start)


async def ttft(client: httpx.AsyncClient, model: str, schema: dict | None) -> float:
    start = time.perf_counter()
    async with client.stream("POST", "/v1/chat/completions", json=body(model, 4, schema, stream=True)) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: ") and '"content"' in line and '"content":""' not in line:
                return time.perf_counter() - start
    raise RuntimeError("no content streamed")


def fresh_schema(index: int) -> dict:
    schema = json.loads(json.dumps(TOOL_SCHEMA))
    schema["properties"]["arguments"]["properties"][f"field_{index}"] = {"type": "integer"}
    return schema


async def measure(base_url: str, model: str, args) -> dict:
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:
        await throughput(client, model, argparse.Namespace(**{**vars(args), "num_requests": args.concurrency}), None)
        rounds = {"unconstrained": [], "tool schema": []}
        for _ in range(2):
            rounds["unconstrained"].append(await throughput(client, model, args, None))
            rounds["tool schema"].append(await throughput(client, model, args, TOOL_SCHEMA))
        latencies = {"no schema": [], "cached schema": [], "new schema": []}
        for i in range(args.ttft_samples):
            latencies["no schema"].append(await ttft(client, model, None))
            latencies["cached schema"].append(await ttft(client, model, TOOL_SCHEMA))
            latencies["new schema"].append(await ttft(client, model, fresh_schema(i)))
    return {"throughput_tok_s": {k: statistics.mean(v) for k, v in rounds.items()},
            "ttft_ms_median": {k: 1e3 * statistics.median(v) for k, v in latencies.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model folder (default: the built-in model)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=48)
    parser.add_argument("--ttft-samples", type=int, default=8)
    parser.add_argument("--out", default="/tmp/structured_serving")
    parser.add_argument("--server-arg", action="append", default=[], help="extra kvserve serve argument")
    args = parser.parse_args()
    port = free_port()
    command = [*KVSERVE, "serve", *([args.model] if args.model else []), "--host", "127.0.0.1", "--port", str(port),
               "--max-num-seqs", str(args.concurrency), *args.server_arg]
    with running_server(command, f"http://127.0.0.1:{port}/health", Path(args.out) / "server.log"):
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["data"]
        result = asyncio.run(measure(f"http://127.0.0.1:{port}", models[0]["id"], args))
    throughput_ = result["throughput_tok_s"]
    result["constrained_fraction"] = throughput_["tool schema"] / throughput_["unconstrained"]
    print(json.dumps(result, indent=2))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "result.json").write_text(json.dumps({"command": vars(args), **result}, indent=2))


if __name__ == "__main__":
    main()
