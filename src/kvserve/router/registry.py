"""The files that declare a fleet: the worker registry and the model registry (YAML, checked by
pydantic; an unknown key or a wrong type is a one-line error naming the file and the field).

Worker registry (``--registry-file``)::

    workers:
      - url: http://10.0.0.5:8000
        model: qwen2.5-0.5b             # optional: asked from the worker's /v1/models otherwise
        kv_events: tcp://10.0.0.5:5557  # optional: "PUB[,REPLAY]" (replay default: port + 1)
        standby: false                  # true = warm pool

Model registry (``--model-registry``)::

    models:
      - name: qwen2.5-0.5b              # what clients send as "model"
        version: "2024-09"
        weights: /models/Qwen2.5-0.5B-Instruct
        tokenizer: /models/Qwen2.5-0.5B-Instruct   # default: weights
        chat_template: null             # a template file; default: the tokenizer's
        quantization: null              # what the workers run (reported in /v1/models)
        block_size: 16                  # the workers' KV block size
        workers: [http://10.0.0.5:8000]
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from kvserve.errors import ConfigError


class WorkerEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str
    model: str | None = None
    kv_events: str | None = None
    standby: bool = False


class WorkerRegistry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    workers: list[WorkerEntry] = []


class ModelEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())
    name: str
    version: str | None = None
    weights: str | None = None
    tokenizer: str | None = None
    chat_template: str | None = None
    quantization: str | None = None
    block_size: int = 16
    workers: list[str] = []

    @property
    def tokenizer_path(self) -> str | None:
        return self.tokenizer or self.weights


class ModelRegistry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    models: list[ModelEntry] = []

    def find(self, name: str) -> ModelEntry | None:
        return next((m for m in self.models if m.name == name), None)


def _load(path: str, kind: type[BaseModel]) -> BaseModel:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    try:
        return kind.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ConfigError(f"{path}: {where}: {first['msg']}") from None


def load_worker_registry(path: str) -> WorkerRegistry:
    """Raises: ConfigError (unreadable, not YAML, unknown key, wrong type)."""
    return _load(path, WorkerRegistry)


def load_model_registry(path: str) -> ModelRegistry:
    """Raises: ConfigError (unreadable, not YAML, unknown key, wrong type, duplicate name)."""
    registry = _load(path, ModelRegistry)
    names = [m.name for m in registry.models]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: model names must be distinct, got {names}")
    return registry
