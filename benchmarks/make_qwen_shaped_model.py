"""Write a checkpoint shaped like Qwen2.5-0.5B-Instruct with random bfloat16 weights.

    python benchmarks/make_qwen_shaped_model.py                  # -> /tmp/qwen-shaped
    python benchmarks/make_qwen_shaped_model.py --out DIR --seed 0

The benchmarks need a model of a real size, and the machines cannot download one. This folder
has Qwen2.5-0.5B-Instruct's exact tensor shapes (Qwen2ForCausalLM: hidden 896, 24 layers, 14
query heads / 2 KV heads of 64, intermediate 4864, vocab 151,936, tied embeddings, q/k/v biases,
rope_theta 1e6, max_position_embeddings 32,768; 494M parameters, 988 MB in bfloat16), so every
matmul costs what the real model's does; only the values are random.

The tokenizer is the ``bpe`` kind of :mod:`kvserve.testing.tokenizer_kinds` (a real byte-level
BPE of 1,024 tokens with Qwen2's split regex and ChatML template); the model's vocabulary stays
151,936, as Qwen's own checkpoints have more embedding rows than tokenizer entries.

Weights: ``transformers``' own initialisation under ``torch.manual_seed(seed)`` in float32,
rounded to bfloat16 (:func:`kvserve.testing.checkpoints.build_checkpoint`); the same seed gives
byte-identical files. Takes about a minute and 2.5 GB of RAM. A folder that already holds this
shape and seed (``shape.json``) is reused unless ``--force``. Never commit the output.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from kvserve.testing.checkpoints import build_checkpoint

DEFAULT_OUT = "/tmp/qwen-shaped"

# Qwen2.5-0.5B-Instruct's config.json, minus the fields build_checkpoint sets from the tokenizer.
QWEN25_05B_SHAPE: dict = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 32768,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "use_sliding_window": False,
    "sliding_window": None,
    "max_window_layers": 24,
}


def make_qwen_shaped_model(out: str | Path = DEFAULT_OUT, seed: int = 0, force: bool = False,
                           **shape_overrides) -> Path:
    """Write (or reuse) the checkpoint folder and return it.

    Args:
        out: output folder (created).
        seed: weight seed.
        force: rewrite even if ``out/shape.json`` says the folder already holds this shape.
        **shape_overrides: config fields that replace the Qwen2.5-0.5B values (for quick checks
            such as ``num_hidden_layers=2``).

    Raises:
        kvserve.errors.CheckpointError: a field override the builder rejects.
    """
    out = Path(out)
    shape = {**QWEN25_05B_SHAPE, **shape_overrides}
    record = {"architecture": "Qwen2ForCausalLM", "tokenizer_kind": "bpe", "dtype": "bfloat16",
              "seed": seed, "shape": shape}
    marker = out / "shape.json"
    if not force and marker.exists() and json.loads(marker.read_text()) == record:
        return out
    build_checkpoint(out, "Qwen2ForCausalLM", "bpe", "bfloat16", seed, **shape)
    marker.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-hidden-layers", type=int, default=None,
                   help="fewer layers for a quick check (default: 24, as Qwen2.5-0.5B)")
    p.add_argument("--force", action="store_true", help="rewrite an existing folder")
    args = p.parse_args(argv)
    overrides = {}
    if args.num_hidden_layers is not None:
        overrides = {"num_hidden_layers": args.num_hidden_layers, "max_window_layers": args.num_hidden_layers}
    t0 = time.perf_counter()
    path = make_qwen_shaped_model(args.out, args.seed, args.force, **overrides)
    size = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    print(f"{path}: {size / 1e6:.0f} MB of safetensors ({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
