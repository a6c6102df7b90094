"""Multi-LoRA serving: many PEFT adapters over one base model, mixed in one batch.

    request (model: "<lora name>") ──► LoRARegistry (front end: names, validated at registration)
        │  LoRARequest travels with the request: EngineRequest ─► Request ─► NewRequestData
        ▼
    Scheduler            at most --max-loras distinct adapters running at once; block hashes
                         carry the adapter (no prefix reuse across adapters)
    ModelRunner          LoRAManager: adapters read from disk into a CPU LRU cache
                         (--max-cpu-loras), copied into --max-loras preallocated slots;
                         LoRALinear wrappers add each row's adapter to the fused projections

Files: ``request`` (LoRARequest), ``peft_adapter`` (reading and checking PEFT folders),
``layers`` (the batched apply), ``manager`` (slots and cache), ``registry`` (names),
``flags`` (``--lora-modules``).
"""

from kvserve.lora.request import LoRARequest

__all__ = ["LoRARequest"]
