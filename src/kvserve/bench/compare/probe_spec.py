"""The ``probes`` section of the ``bench compare`` spec: which failure-mode probes run, and their
sizes and time limits (the probes themselves: ``kvserve.bench.compare.probes``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, PositiveInt


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class OverLongPromptProbe(_Strict):
    """A prompt ``excess_tokens`` longer than the context: a clean 4xx is expected."""

    enabled: bool = True
    excess_tokens: PositiveInt = 16
    timeout_s: float = Field(default=60.0, gt=0)


class CacheExhaustionProbe(_Strict):
    """``requests`` long requests at once (prompt ``prompt_len`` tokens, default 3/4 of the
    context); then canaries until one is within ``recovery_factor`` x the idle canary latency."""

    enabled: bool = True
    requests: PositiveInt = 32
    prompt_len: PositiveInt | None = None
    output_len: PositiveInt = 32
    recovery_factor: float = Field(default=2.0, gt=1)
    recovery_timeout_s: float = Field(default=120.0, gt=0)


class DisconnectStormProbe(_Strict):
    """``requests`` streams that the client closes after ``disconnect_after_chunks`` chunks; then
    the engine's gauges until nothing runs or waits, and the next canary's latency."""

    enabled: bool = True
    requests: PositiveInt = 16
    output_len: PositiveInt = 256
    disconnect_after_chunks: PositiveInt = 1
    settle_timeout_s: float = Field(default=30.0, gt=0)


class RestartProbe(_Strict):
    """Runs only for an engine with a ``restart`` command: ``concurrency`` streams of load,
    ``load_before_s`` seconds, the restart, until ready, ``load_after_s`` seconds more."""

    enabled: bool = True
    concurrency: PositiveInt = 2
    load_before_s: float = Field(default=1.0, ge=0)
    load_after_s: float = Field(default=1.0, ge=0)
    timeout_s: float = Field(default=600.0, gt=0)


class ColdStartProbe(_Strict):
    """Runs only for an engine with a ``start`` command: start command to first token."""

    enabled: bool = True
    timeout_s: float = Field(default=600.0, gt=0)


class CanarySpec(_Strict):
    """The small request the probes time the engine with (ignore_eos)."""

    prompt_len: PositiveInt = 16
    output_len: PositiveInt = 8


class ProbesSpec(_Strict):
    over_long_prompt: OverLongPromptProbe = Field(default_factory=OverLongPromptProbe)
    cache_exhaustion: CacheExhaustionProbe = Field(default_factory=CacheExhaustionProbe)
    disconnect_storm: DisconnectStormProbe = Field(default_factory=DisconnectStormProbe)
    restart: RestartProbe = Field(default_factory=RestartProbe)
    cold_start: ColdStartProbe = Field(default_factory=ColdStartProbe)
    canary: CanarySpec = Field(default_factory=CanarySpec)
