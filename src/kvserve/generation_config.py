"""Default sampling values from a model's ``generation_config.json``, resolved as vLLM resolves them.

A model creator ships recommended sampling values (Qwen2.5-Instruct: ``temperature`` 0.7, ``top_p``
0.8, ``top_k`` 20, ``repetition_penalty`` 1.05); vLLM applies them to every request that omits the
field. The rule (vLLM's ``ModelConfig.get_diff_sampling_param``), for ``--generation-config``:

    auto (default)  the model folder's generation_config.json
    vllm            nothing: the neutral defaults of the API (temperature 1, top_p 1, ...)
    FOLDER          FOLDER/generation_config.json

then ``--override-generation-config '{"temperature": 0.5}'`` is laid over the result (also with
``vllm``), and of the merged values only ``temperature``, ``top_p``, ``top_k``, ``min_p``,
``repetition_penalty`` and ``max_new_tokens`` count. ``max_new_tokens`` becomes ``max_tokens``, a
*cap*: vLLM gives a request ``min(context left, request's max_tokens, default max_tokens)``.

A folder without generation_config.json has no defaults (vLLM then builds a GenerationConfig from
config.json, which carries no sampling values in transformers 5). Values are taken as written
(``"top_k": 50`` counts even though it equals transformers 4's default, as with transformers 5).

    default_sampling_values(model_dir, "auto", override) ──► SamplingDefaults (frozen, once at start)
                                                              │ .value("temperature", request value)
                                                              ▼ .cap_max_tokens(max_tokens)
                                                         the input processor, per request
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from kvserve.errors import InvalidRequestError, KVServeError

GENERATION_CONFIG_FILE = "generation_config.json"
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_new_tokens")
"""The generation_config.json keys that become sampling defaults (vLLM's list)."""
MODES = ("auto", "vllm")


class GenerationConfigError(KVServeError, ValueError):
    """``--generation-config`` / ``--override-generation-config`` or the file they name is invalid."""


@dataclass(frozen=True)
class SamplingDefaults:
    """Sampling values for requests that omit them; ``None`` = the API's own default.

    Attributes:
        temperature, top_p, top_k, min_p, repetition_penalty: as in ``SamplingParams``.
        max_tokens: a cap on every request's ``max_tokens`` (from ``max_new_tokens``), or None.
        source: where the values came from, for the start-up log line.
    """

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    max_tokens: int | None = None
    source: str = "none"

    def as_dict(self) -> dict[str, Any]:
        """The set values, keyed as ``SamplingParams`` fields (vLLM's ``diff_sampling_param``)."""
        return {k: v for k, v in asdict(self).items() if k != "source" and v is not None}

    def value(self, name: str, requested: Any) -> Any:
        """``requested`` when the request gave it (not None), else this default (may be None).

        Raises:
            KeyError: ``name`` is not one of the five sampling fields.
        """
        if name not in _SAMPLING_FIELDS:
            raise KeyError(f"{name!r} has no default; one of {', '.join(_SAMPLING_FIELDS)}")
        return requested if requested is not None else getattr(self, name)

    def cap_max_tokens(self, max_tokens: int | None) -> int | None:
        """``min(max_tokens, self.max_tokens)`` ignoring Nones (the context bound is the caller's)."""
        values = [v for v in (max_tokens, self.max_tokens) if v is not None]
        return min(values) if values else None


_SAMPLING_FIELDS = tuple(f.name for f in fields(SamplingDefaults) if f.name not in ("max_tokens", "source"))


def parse_override(text: str | None) -> dict[str, Any]:
    """Parse ``--override-generation-config`` (a JSON object of :data:`SAMPLING_KEYS`).

    Raises:
        GenerationConfigError: not JSON, not an object, or a key outside :data:`SAMPLING_KEYS`.
    """
    if text is None or not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GenerationConfigError(
            f"--override-generation-config is not valid JSON ({exc.msg}); give an object such as "
            "'{\"temperature\": 0.5}'") from exc
    if not isinstance(value, dict):
        raise GenerationConfigError(
            f"--override-generation-config must be a JSON object, got {type(value).__name__}")
    unknown = sorted(set(value) - set(SAMPLING_KEYS))
    if unknown:
        raise GenerationConfigError(
            f"--override-generation-config has unknown key(s) {', '.join(unknown)}; "
            f"allowed: {', '.join(SAMPLING_KEYS)}")
    return value


def default_sampling_values(model_dir: str | Path, generation_config: str = "auto",
                            override: dict[str, Any] | None = None) -> SamplingDefaults:
    """Resolve the sampling defaults for a model, as vLLM does (see the module docstring).

    Args:
        model_dir: the model folder (read for ``auto``).
        generation_config: ``auto``, ``vllm`` or a folder holding generation_config.json.
        override: values laid over the file's (keys from :data:`SAMPLING_KEYS`).

    Raises:
        GenerationConfigError: a folder given as ``generation_config`` lacks the file, the file
            is not a JSON object, an override key is unknown, or a value is out of range (the
            message names the key and where it came from).
    """
    override = dict(override or {})
    unknown = sorted(set(override) - set(SAMPLING_KEYS))
    if unknown:
        raise GenerationConfigError(
            f"unknown generation config override key(s) {', '.join(unknown)}; allowed: {', '.join(SAMPLING_KEYS)}")
    config, source = _read(Path(model_dir), generation_config)
    config.update(override)
    if override:
        source = "--override-generation-config" if source == "none" else f"{source} + --override-generation-config"
    values = {key: config[key] for key in SAMPLING_KEYS if config.get(key) is not None}
    if "max_new_tokens" in values:
        values["max_tokens"] = values.pop("max_new_tokens")
    _validate(values, source)
    return SamplingDefaults(**values, source=source)


def _read(model_dir: Path, generation_config: str) -> tuple[dict[str, Any], str]:
    if generation_config == "vllm":
        return {}, "vllm"
    if generation_config == "auto":
        path = model_dir / GENERATION_CONFIG_FILE
        if not path.is_file():
            return {}, "none"
    else:
        path = Path(generation_config) / GENERATION_CONFIG_FILE
        if not path.is_file():
            raise GenerationConfigError(
                f"--generation-config {generation_config!r}: no {GENERATION_CONFIG_FILE} in that folder; "
                f"give 'auto' (the model's), 'vllm' (no model defaults) or a folder holding the file")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise GenerationConfigError(f"cannot read {path}: {exc}") from exc
    if not isinstance(config, dict):
        raise GenerationConfigError(f"{path} must hold a JSON object, got {type(config).__name__}")
    return config, str(path)


def _validate(values: dict[str, Any], source: str) -> None:
    """Check the values with the same rules as a request's (``validate_sampling_params``)."""
    from kvserve.engine.param_validation import validate_sampling_params
    from kvserve.sampling_params import SamplingParams

    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise GenerationConfigError(f"{key} in {source} must be a number, got {value!r}")
    if "top_k" in values and values["top_k"] != int(values["top_k"]):
        raise GenerationConfigError(f"top_k in {source} must be an integer, got {values['top_k']!r}")
    if "max_tokens" in values and (values["max_tokens"] != int(values["max_tokens"]) or values["max_tokens"] < 1):
        raise GenerationConfigError(f"max_new_tokens in {source} must be an integer >= 1, got {values['max_tokens']!r}")
    try:
        validate_sampling_params(SamplingParams(**values), vocab_size=2**31)  # token ids are not in play
    except InvalidRequestError as exc:
        key = "max_new_tokens" if exc.param == "max_tokens" else exc.param
        raise GenerationConfigError(f"{key} in {source}: {exc.message}") from exc
    for key in ("top_k", "max_tokens"):
        if key in values:
            values[key] = int(values[key])
