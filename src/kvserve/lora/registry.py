"""The front end's adapters: names clients send as ``model``, each checked once when registered
(``--lora-modules`` at start-up, ``POST /v1/load_lora_adapter``, a new ``LoRARequest`` given to
the offline ``LLM``). Thread-safe: the HTTP handlers and the engine's callers share it.

Unloading removes the name: new requests for it get 404, requests already admitted finish with
the adapter they started with (they carry their ``LoRARequest``).
"""

from __future__ import annotations

import itertools
import threading

from kvserve.config import LoRAConfig
from kvserve.lora.peft_adapter import LoRAAdapterError, check_base_model, load_adapter
from kvserve.lora.request import LoRARequest
from kvserve.model.arch_config import ModelArchConfig


class LoRARegistry:
    """Args:
    config: the LoRA flags (``--max-lora-rank`` is checked at registration).
    arch: the base model's config (adapter shapes are checked against it).
    reserved_names: names an adapter may not take (the served model's names).
    """

    def __init__(self, config: LoRAConfig, arch: ModelArchConfig, reserved_names: tuple[str, ...] = ()):
        check_base_model(arch)
        self.config = config
        self.arch = arch
        self.reserved_names = frozenset(reserved_names)
        self._by_name: dict[str, LoRARequest] = {}
        self._checked: set[LoRARequest] = set()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def check(self, lora_request: LoRARequest) -> None:
        """Check an adapter's folder against the base model (config fields, tensor names and
        shapes; the weights themselves are read by the runner), once per ``LoRARequest``.

        Raises:
            LoRAAdapterError: the folder cannot be served (the message names the field).
        """
        if lora_request in self._checked:
            return
        load_adapter(lora_request.lora_path, self.arch, self.config.max_lora_rank, dtype=None)
        with self._lock:
            self._checked.add(lora_request)

    def add(self, name: str, path: str, base_model_name: str | None = None) -> LoRARequest:
        """Register ``name`` for the adapter at ``path`` with a new id.

        Raises:
            ValueError: the name is empty, already an adapter's, or a served model name.
            LoRAAdapterError: the folder cannot be served.
        """
        if not name:
            raise ValueError("lora_name must be a non-empty string")
        if name in self.reserved_names:
            raise ValueError(f"the name {name!r} is the base model's; choose another lora_name")
        with self._lock:
            if name in self._by_name:
                raise ValueError(f"The lora adapter '{name}' has already been loaded.")
            lora_request = LoRARequest(name, next(self._ids), path, base_model_name)
        self.check(lora_request)
        with self._lock:
            if name in self._by_name:  # registered meanwhile by another caller
                raise ValueError(f"The lora adapter '{name}' has already been loaded.")
            self._by_name[name] = lora_request
        return lora_request

    def remove(self, name: str) -> LoRARequest:
        """Unregister ``name``.

        Raises:
            KeyError: no adapter has that name.
        """
        with self._lock:
            lora_request = self._by_name.pop(name, None)
        if lora_request is None:
            raise KeyError(name)
        return lora_request

    def get(self, name: str) -> LoRARequest | None:
        return self._by_name.get(name)

    def list(self) -> list[LoRARequest]:
        """Registered adapters, in registration order."""
        with self._lock:
            return list(self._by_name.values())


__all__ = ["LoRARegistry", "LoRAAdapterError"]
