"""The workload spec of ``kvserve bench compare``: one YAML file that writes the selection down.

    name / description / hardware   what is being chosen, on which machines
    model        the model name sent, its local tokenizer folder, its context length
    requests     the request mix: datasets with length distributions (kvserve.bench.compare.
                 distributions), shared-prefix share, long-context share, chat vs completions,
                 structured-output and tool-call fractions
    load         concurrency levels (closed loop) or request rates (open loop: Poisson or gamma
                 arrivals), warm-up, requests or seconds per level
    slos         TTFT / TPOT / ITL / E2E limits at percentiles: they define goodput and the knee
    capacity     a target request rate (and a replica budget) to size the fleet for
    probes       the failure-mode probes and their sizes
    engines      name, base_url, model, api_key, start / stop / restart commands, metrics_url

Validated once, here, with pydantic (unknown keys are errors); :func:`load_spec` turns every
problem into one :class:`InvalidRequestError` listing each field's dotted path and what is allowed.
``docs/bench_compare.md`` documents every field with an example.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, ValidationError, field_validator, \
    model_validator

from kvserve.bench.compare.distributions import LengthDistribution
from kvserve.bench.compare.probe_spec import ProbesSpec
from kvserve.errors import InvalidRequestError

STOP_START = "stop-start"  # restart keyword: stop the engine, then run its start command again
SLO_METRICS = ("ttft", "tpot", "itl", "e2el")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
DEFAULT_JSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "count": {"type": "integer"}},
    "required": ["name", "count"],
}
DEFAULT_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Current weather of a city",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Share = Field(default=0.0, ge=0.0, le=1.0)


class ModelSpec(_Strict):
    """``name``: the ``model`` field sent (an engine's own ``model`` wins; neither: the server's
    first model). ``tokenizer``: a local tokenizer folder (default: the built-in model's, when the
    served model is kvserve's built-in one). ``max_model_len``: the context length, used by the
    over-long-prompt probe when ``/v1/models`` does not report it."""

    name: str | None = None
    tokenizer: str | None = None
    max_model_len: PositiveInt | None = None


class SharedPrefix(_Strict):
    """A ``share`` of the dataset's prompts start with one of ``num_prefixes`` common prefixes of
    ``prefix_len`` tokens (a system prompt); their drawn input length follows the prefix."""

    share: float = Share
    prefix_len: PositiveInt
    num_prefixes: PositiveInt = 1


class LongContext(_Strict):
    """A ``share`` of all requests take their prompt length from ``input_len`` instead (no prefix)."""

    share: float = Share
    input_len: LengthDistribution


class StructuredOutputs(_Strict):
    """A ``share`` of the dataset's requests ask for JSON matching ``json_schema``."""

    share: float = Share
    json_schema: dict[str, Any] = Field(default_factory=lambda: dict(DEFAULT_JSON_SCHEMA))


class ToolCalls(_Strict):
    """A ``share`` of the dataset's chat requests carry ``tools`` with ``tool_choice: required``."""

    share: float = Share
    tools: list[dict[str, Any]] = Field(default_factory=lambda: [dict(DEFAULT_TOOL)], min_length=1)


class DatasetSpec(_Strict):
    """One kind of request, drawn with probability ``weight / sum(weights)``."""

    name: str
    weight: float = Field(default=1.0, gt=0)
    api: Literal["completions", "chat"] = "completions"
    input_len: LengthDistribution
    output_len: LengthDistribution
    shared_prefix: SharedPrefix | None = None
    structured_outputs: StructuredOutputs | None = None
    tool_calls: ToolCalls | None = None

    @model_validator(mode="after")
    def _tools_need_chat(self):
        if self.tool_calls is not None and self.tool_calls.share > 0 and self.api != "chat":
            raise ValueError("tool_calls need api: chat (tools are a chat completions feature)")
        return self


class RequestsSpec(_Strict):
    """The request mix. ``seed`` fixes every prompt (level ``i`` uses ``seed + 100 * i``), so all
    engines get the same prompts at the same level. ``ignore_eos`` makes every request generate
    its drawn output length (an engine without it needs ``count_output_tokens``/``extra_body``)."""

    datasets: list[DatasetSpec] = Field(min_length=1)
    long_context: LongContext | None = None
    ignore_eos: bool = True
    temperature: float | None = Field(default=0.0, ge=0.0)
    seed: int = 0

    @field_validator("datasets")
    @classmethod
    def _unique(cls, datasets):
        names = [d.name for d in datasets]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"dataset names must be unique, repeated: {', '.join(dupes)}")
        return datasets


class ArrivalSpec(_Strict):
    """How open-loop requests arrive: ``poisson`` (exponential gaps) or ``gamma`` gaps with shape
    ``burstiness`` (< 1 burstier than Poisson, > 1 more regular)."""

    process: Literal["poisson", "gamma"] = "poisson"
    burstiness: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _shape(self):
        if self.process == "gamma" and self.burstiness is None:
            raise ValueError("process: gamma needs burstiness (the gamma shape, > 0; 1 is Poisson)")
        if self.process == "poisson" and self.burstiness not in (None, 1.0):
            raise ValueError("process: poisson has burstiness 1; use process: gamma for another shape")
        return self

    @property
    def shape(self) -> float:
        return self.burstiness if self.process == "gamma" else 1.0


class LoadSpec(_Strict):
    """The load levels: ``concurrency`` (closed loop: that many requests in flight, sent as fast as
    they finish) or ``request_rates`` (open loop, requests/s, with ``arrival``; ``max_concurrency``
    caps requests in flight). Each level sends ``requests_per_level`` requests, or with
    ``duration_s`` keeps sending (cycling those prompts) for that long, after ``warmup_requests``."""

    concurrency: list[PositiveInt] | None = None
    request_rates: list[float] | None = None
    max_concurrency: PositiveInt | None = None
    arrival: ArrivalSpec = Field(default_factory=ArrivalSpec)
    warmup_requests: NonNegativeInt = 2
    requests_per_level: PositiveInt = 100
    duration_s: float | None = Field(default=None, gt=0)
    request_timeout_s: float = Field(default=300.0, gt=0)

    @model_validator(mode="after")
    def _levels(self):
        if (self.concurrency is None) == (self.request_rates is None):
            raise ValueError("give exactly one of concurrency (a list of levels) or request_rates (a list of "
                             "requests/s); the knee is found along one axis")
        levels = self.concurrency if self.concurrency is not None else self.request_rates
        if not levels:
            raise ValueError("the list of load levels is empty")
        if self.request_rates is not None and any(math.isnan(r) or r <= 0 or math.isinf(r)
                                                  for r in self.request_rates):
            raise ValueError(f"request_rates must be finite numbers > 0, got {self.request_rates}")
        if list(levels) != sorted(set(levels)):
            raise ValueError(f"load levels must be strictly increasing, got {list(levels)}")
        if self.concurrency is not None and self.max_concurrency is not None:
            raise ValueError("max_concurrency caps request_rates levels; concurrency levels set it themselves")
        return self

    @property
    def axis(self) -> Literal["concurrency", "request_rate"]:
        return "concurrency" if self.concurrency is not None else "request_rate"

    @property
    def levels(self) -> list[float]:
        return [float(x) for x in (self.concurrency if self.concurrency is not None else self.request_rates)]


class SLO(_Strict):
    """At least ``percentile`` % of the requests sent must be within ``limit_ms`` (failed requests
    count as misses)."""

    limit_ms: float = Field(gt=0)
    percentile: float = Field(default=99.0, gt=0, lt=100)


class SLOSpec(_Strict):
    """``ttft``: first token; ``tpot``: (E2E - TTFT) / (output tokens - 1); ``itl``: a request's
    longest gap between two chunks; ``e2el``: whole request. At least one."""

    ttft: SLO | None = None
    tpot: SLO | None = None
    itl: SLO | None = None
    e2el: SLO | None = None

    @model_validator(mode="after")
    def _one(self):
        if not self.items():
            raise ValueError(f"give at least one SLO ({', '.join(SLO_METRICS)}): goodput is defined by them")
        return self

    def items(self) -> dict[str, SLO]:
        return {m: getattr(self, m) for m in SLO_METRICS if getattr(self, m) is not None}


class CapacitySpec(_Strict):
    """Size a fleet for ``target_request_rate`` (requests/s) at each engine's knee, using only
    ``headroom`` of a replica's goodput; ``max_replicas`` is the budget."""

    target_request_rate: float = Field(gt=0)
    headroom: float = Field(default=1.0, gt=0, le=1)
    max_replicas: PositiveInt | None = None


class EngineSpec(_Strict):
    """One engine (a variant such as prefix caching off is another entry).

    ``start``/``stop``/``restart`` are shell commands run from the spec file's folder. Without
    ``start`` the engine must already be running. Without ``stop`` the tool ends the process group
    of its ``start``. ``restart: stop-start`` stops and starts the engine with those commands.
    ``only_if``: a shell command; the engine is skipped (and the report says so) when it fails.
    ``extra_body`` joins every request to this engine (e.g. a ``logit_bias`` where there is no
    ``ignore_eos``). ``count_output_tokens: max_tokens`` counts a completed request's output as its
    ``max_tokens`` when the server reports no usage (only true when the engine cannot stop early).
    ``commit``, ``machine``, ``notes``: provenance the engine cannot report itself."""

    name: str
    base_url: str
    model: str | None = None
    api_key: str | None = None
    api_key_env: str | None = None
    start: str | None = None
    stop: str | None = None
    restart: str | None = None
    metrics_url: str | None = None
    ready_timeout_s: float = Field(default=600.0, gt=0)
    only_if: str | None = None
    extra_body: dict[str, Any] = Field(default_factory=dict)
    count_output_tokens: Literal["usage", "max_tokens"] = "usage"
    commit: str | None = None
    machine: str | None = None
    notes: str | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, name):
        if not _NAME.match(name):
            raise ValueError(f"{name!r} must be letters, digits, '.', '_' or '-' (it names files)")
        return name

    @field_validator("base_url", "metrics_url")
    @classmethod
    def _url(cls, url):
        if url is not None and not re.match(r"^https?://[^/\s]+", url):
            raise ValueError(f"{url!r} must be an http:// or https:// URL")
        return url.rstrip("/") if url is not None else None

    @model_validator(mode="after")
    def _commands(self):
        if self.restart == STOP_START and self.start is None:
            raise ValueError(f"restart: {STOP_START} needs a start command")
        if self.api_key is not None and self.api_key_env is not None:
            raise ValueError("give api_key or api_key_env, not both")
        return self


class CompareSpec(_Strict):
    """The whole spec (see the module docstring)."""

    name: str
    description: str = ""
    hardware: str = ""
    model: ModelSpec = Field(default_factory=ModelSpec)
    requests: RequestsSpec
    load: LoadSpec
    slos: SLOSpec
    capacity: CapacitySpec | None = None
    probes: ProbesSpec = Field(default_factory=ProbesSpec)
    engines: list[EngineSpec] = Field(min_length=1)

    @field_validator("engines")
    @classmethod
    def _unique(cls, engines):
        names = [e.name for e in engines]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"engine names must be unique, repeated: {', '.join(dupes)}")
        return engines


def _where(loc: tuple) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in ("fixed", "uniform", "normal", "lognormal", "file"):
            continue  # the discriminated union's tag adds nothing for the reader
        else:
            path += f".{part}" if path else str(part)
    return path or "(top level)"


def format_validation_error(exc: ValidationError, source: str) -> str:
    """One line per problem: ``engines[1].base_url: Field required``."""
    lines = [f"invalid compare spec {source}:"]
    for err in exc.errors(include_url=False):
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = "unknown field (check its spelling; docs/bench_compare.md lists the fields)"
        lines.append(f"  {_where(err['loc'])}: {message}")
    return "\n".join(lines)


def parse_spec(data: Any, source: str = "<spec>", base_dir: str | Path = ".") -> CompareSpec:
    """Validate already-parsed YAML/JSON data.

    Raises:
        InvalidRequestError: every validation problem, one per line.
    """
    if not isinstance(data, dict):
        raise InvalidRequestError(f"invalid compare spec {source}: the top level must be a mapping of fields "
                                  f"(name, requests, load, slos, engines, ...), got {type(data).__name__}", "spec")
    try:
        return CompareSpec.model_validate(data, context={"base_dir": str(base_dir)})
    except ValidationError as exc:
        raise InvalidRequestError(format_validation_error(exc, source), "spec") from None


def load_spec(path: str | Path) -> CompareSpec:
    """Read and validate a spec file; relative length-file paths are taken from its folder.

    Raises:
        InvalidRequestError: unreadable file, YAML syntax error (with its line), or invalid fields.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidRequestError(f"cannot read compare spec {path}: {exc.strerror or exc}", "spec") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidRequestError(f"compare spec {path} is not valid YAML: {exc}", "spec") from None
    return parse_spec(data, str(path), path.parent)
