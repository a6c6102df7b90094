"""PEFT adapters made in the test with ``peft`` on random weights, and their reference logits.

``make_adapter(base_dir, out_dir, spec)`` loads the base checkpoint with ``transformers``, wraps it
with ``peft`` (``init_lora_weights=False``: A and B both random, so the adapter changes the
logits), saves the adapter with ``save_pretrained`` and returns the ``PeftModel`` (eval mode) as
the reference.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "model"))  # model_fixtures (tiny random bases)


@dataclass(frozen=True)
class AdapterSpec:
    rank: int
    targets: tuple[str, ...] | str
    use_rslora: bool = False
    alpha: int = 16
    seed: int = 0


# Ranks 4-64, rsLoRA on and off, every supported module somewhere (q/k/v/o/gate/up/down).
SPECS = (
    AdapterSpec(4, ("q_proj", "v_proj"), seed=1),
    AdapterSpec(8, "all-linear", use_rslora=True, seed=2),
    AdapterSpec(16, ("o_proj", "gate_proj", "down_proj"), alpha=8, seed=3),
    AdapterSpec(64, ("k_proj", "up_proj", "q_proj"), use_rslora=True, alpha=32, seed=4),
)


def make_adapter(base_dir: Path, out_dir: Path, spec: AdapterSpec):
    """Write a PEFT adapter of ``spec`` for ``base_dir`` into ``out_dir``; returns the reference
    ``PeftModel`` (float32, eval)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    targets = spec.targets if isinstance(spec.targets, str) else list(spec.targets)
    config = LoraConfig(r=spec.rank, lora_alpha=spec.alpha, target_modules=targets, use_rslora=spec.use_rslora,
                        init_lora_weights=False, lora_dropout=0.0, bias="none")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = get_peft_model(base, config)
    model.save_pretrained(str(out_dir))
    return model.eval()


def edit_adapter_config(folder: Path, **changes) -> None:
    path = folder / "adapter_config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def peft_logits(model, token_ids: list[int]) -> torch.Tensor:
    """The reference's float32 logits [len, vocab] of one unpadded sequence."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([token_ids])).logits[0].float()
