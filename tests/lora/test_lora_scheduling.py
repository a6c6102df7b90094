"""The scheduler's side of LoRA (pure Python): at most ``max_loras`` adapters among running
requests, block hashes keyed by adapter, LoRA stats; and the flags."""

from __future__ import annotations

import argparse

import pytest

from kvserve.api.server_args import add_server_args
from kvserve.api.settings import settings_from_args
from kvserve.config import LoRAConfig, SchedulerConfig
from kvserve.engine.arg_utils import add_engine_args, engine_config_from_args
from kvserve.errors import ConfigError
from kvserve.kv_cache.block_hash import update_block_hashes
from kvserve.kv_cache.manager import KVCacheManager
from kvserve.lora.flags import LoRAModulePath, lora_module
from kvserve.lora.request import LoRARequest
from kvserve.outputs import ModelRunnerOutput
from kvserve.request import Request
from kvserve.sampling_params import SamplingParams
from kvserve.scheduler.scheduler import Scheduler

A, B, C = (LoRARequest(name, i + 1, f"/adapters/{name}") for i, name in enumerate("abc"))


def _request(request_id: str, lora: LoRARequest | None, prompt=(1, 2, 3, 4, 5), max_tokens: int = 2) -> Request:
    return Request.of(request_id, list(prompt), SamplingParams(max_tokens=max_tokens), max_tokens=max_tokens,
                   lora_request=lora)


def _scheduler(max_loras: int) -> Scheduler:
    config = SchedulerConfig(max_model_len=64, max_num_batched_tokens=64)
    return Scheduler(config, KVCacheManager(64, 4), max_loras=max_loras)


def _step(scheduler: Scheduler) -> list[str]:
    output = scheduler.schedule()
    tokens = {r: [7] for r, n in output.num_scheduled_tokens.items()
              if scheduler.requests[r].num_computed_tokens + n >= scheduler.requests[r].num_tokens}
    scheduler.update_from_output(output, ModelRunnerOutput(sampled_token_ids=tokens))
    return list(output.num_scheduled_tokens)


def test_at_most_max_loras_adapters_run_and_later_requests_pass_a_blocked_one():
    scheduler = _scheduler(max_loras=2)
    requests = [_request("a1", A), _request("b1", B), _request("c1", C), _request("base", None), _request("a2", A)]
    for i, request in enumerate(requests):  # distinct prompts: no request waits for another's prefix
        request.prompt_token_ids[0] = request.all_token_ids[0] = 10 + i
        scheduler.add_request(request)
    assert _step(scheduler) == ["a1", "b1", "base", "a2"]  # c1 waits in its place, the others go
    stats = scheduler.make_stats().lora
    assert (stats.max_loras, stats.running, stats.waiting) == (2, {"a": 2, "b": 1}, {"c": 1})
    assert _step(scheduler) == ["a1", "b1", "base", "a2"]  # they finish (2 tokens each)
    assert _step(scheduler) == ["c1"]
    assert scheduler.make_stats().lora.running == {"c": 1}


def test_block_hashes_differ_per_adapter_and_not_for_the_base_model():
    prompt = list(range(8))
    hashes = [update_block_hashes(_request("r", lora, prompt), 4) for lora in (None, A, B, A)]
    assert hashes[1] == hashes[3] and len({tuple(h) for h in hashes}) == 3
    plain = Request.of("p", prompt, SamplingParams())
    assert update_block_hashes(plain, 4) == hashes[0]


def _parse(argv: str):
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    add_engine_args(parser)
    add_server_args(parser)
    return parser.parse_args(["m", *argv.split()])


def test_lora_flags(monkeypatch):
    args = _parse("--enable-lora --max-loras 8 --max-lora-rank 32 --max-cpu-loras 16 --lora-dtype bfloat16 "
                  "--lora-modules sql=/a/sql --lora-modules "
                  '{"name":"chat","path":"/a/chat","base_model_name":"Qwen/Qwen2.5-0.5B"}')
    assert engine_config_from_args("m", args).lora == LoRAConfig(8, 32, 16, "bfloat16")
    monkeypatch.delenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", raising=False)
    settings = settings_from_args(args)
    assert settings.lora_modules == (LoRAModulePath("sql", "/a/sql"),
                                     LoRAModulePath("chat", "/a/chat", "Qwen/Qwen2.5-0.5B"))
    assert settings.allow_runtime_lora_updating is False
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
    assert settings_from_args(args).allow_runtime_lora_updating is True
    assert engine_config_from_args("m", _parse("--no-enable-lora")).lora is None
    with pytest.raises(ValueError, match="--lora-modules needs --enable-lora"):
        settings_from_args(_parse("--lora-modules a=/x"))
    with pytest.raises(ConfigError, match="--max-cpu-loras"):
        engine_config_from_args("m", _parse("--enable-lora --max-loras 4 --max-cpu-loras 2"))


@pytest.mark.parametrize("text", ["noequals", "=path", '{"name": "x"}', '{"name": "x", "path": "p", "extra": 1}'])
def test_bad_lora_module_values_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError):
        lora_module(text)
