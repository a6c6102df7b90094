"""``LoRARequest``: which adapter a request runs with (vLLM's ``vllm.lora.request.LoRARequest``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    """An adapter, as vLLM names it: ``LoRARequest(lora_name, lora_int_id, lora_path)``.

    Two requests with equal ``LoRARequest`` values run with the same weights; the value is the
    adapter's identity in the runner's caches and in prefix-cache block hashes.

    Attributes:
        lora_name: the name clients send as ``model``.
        lora_int_id: a positive id, unique per adapter (vLLM's rule; 0 would mean "no adapter").
        lora_path: the PEFT folder (``adapter_config.json`` + ``adapter_model.safetensors``).
        base_model_name: the base model the adapter was trained on, shown as ``parent`` in
            ``/v1/models`` (None: the served model).

    Raises:
        ValueError: an empty name or path, or an id below 1.
    """

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    base_model_name: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError("LoRARequest.lora_name must be a non-empty string")
        if isinstance(self.lora_int_id, bool) or not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise ValueError(f"LoRARequest.lora_int_id must be an integer >= 1, got {self.lora_int_id!r}")
        if not isinstance(self.lora_path, str) or not self.lora_path:
            raise ValueError(f"LoRARequest {self.lora_name!r}: lora_path must name the adapter's folder")

    @property
    def adapter_id(self) -> int:
        """vLLM's ``adapter_id`` alias of ``lora_int_id``."""
        return self.lora_int_id

    @property
    def hash_key(self) -> tuple:
        """The prefix-cache extra key: blocks computed under this adapter are found only by
        requests with the same adapter (name, id and folder)."""
        return ("lora", self.lora_int_id, self.lora_name, self.lora_path)
