"""How the engine runs a pooling model: the scheduling and caching rules, applied to the
``EngineConfig`` once at start-up (``EngineCore``).

- **No chunked prefill**: a pooling request's prompt runs whole in one step, so the runner sees
  every hidden state it pools (MEAN, CLS) and an encoder attends over the whole prompt. The step
  budget is raised to ``max_model_len`` where it is smaller, so any prompt that fits the context
  fits a step (vLLM disables chunked prefill for encoders and for MEAN/CLS pooling too).
- **No prefix caching**: a cached prefix would skip computing hidden states the pooler needs (and
  an encoder caches no K/V at all). vLLM keeps it for LAST-pooling decoders; kvserve turns it off
  for every pooling run.
- Not with tensor parallelism, LoRA adapters or speculative decoding (refused at start-up).
"""

from __future__ import annotations

import dataclasses
import logging

from kvserve.config import EngineConfig
from kvserve.errors import ConfigError
from kvserve.pooling.config import PoolerConfig

logger = logging.getLogger(__name__)


def check_pooling_options(config: EngineConfig) -> None:
    """Raises ConfigError naming a flag a pooling run does not support."""
    if config.parallel.tensor_parallel_size > 1:
        raise ConfigError(f"--runner pooling with --tensor-parallel-size {config.parallel.tensor_parallel_size} is "
                          "not supported; pooling models run in one process")
    if config.lora is not None:
        raise ConfigError("--enable-lora with --runner pooling is not supported: pooling runs the base model only")
    if config.speculative is not None:
        raise ConfigError("--speculative-config with --runner pooling does not apply: pooling generates no tokens")


def pooling_engine_config(config: EngineConfig, pooler: PoolerConfig, max_model_len: int) -> EngineConfig:
    """``config`` with the rules of the module docstring (a log line says what changed)."""
    if config.model.runner == "auto":
        logger.info("Resolved `--runner auto` to `--runner pooling`. Pass the value explicitly to silence this message.")
    scheduler, cache = config.scheduler, config.cache
    budget = max(scheduler.max_num_batched_tokens, max_model_len)
    if budget != scheduler.max_num_batched_tokens or scheduler.enable_chunked_prefill or cache.enable_prefix_caching:
        logger.info("pooling model (%s): prompts run whole, one step each (no chunked prefill, step budget %d "
                    "tokens), no prefix caching", pooler.describe(), budget)
    return dataclasses.replace(
        config,
        scheduler=dataclasses.replace(scheduler, enable_chunked_prefill=False, max_num_batched_tokens=budget),
        cache=dataclasses.replace(cache, enable_prefix_caching=False),
    )
