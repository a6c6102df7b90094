"""Write a layer-truncated draft model: the first N decoder layers of a checkpoint, with its
embeddings, final norm, LM head and tokenizer (the draft shares the target's vocabulary).

    python benchmarks/make_truncated_draft.py --model /tmp/qwen-shaped --layers 2 --out /tmp/qwen-shaped-draft2

A speculative-decoding draft for ``--speculative-config '{"method": "draft_model", "model": OUT,
...}'``: it costs about N / layers of the target per token and proposes what the target's first
N layers, read out by the target's own head, predict. Never commit the output.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def truncate(model: Path, out: Path, layers: int) -> int:
    """Copy ``model`` to ``out`` keeping decoder layers ``0 .. layers - 1``; returns the number of
    tensors kept."""
    config = json.loads((model / "config.json").read_text())
    if not 1 <= layers <= config["num_hidden_layers"]:
        raise SystemExit(f"--layers must be in 1..{config['num_hidden_layers']}")
    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for shard in sorted(model.glob("*.safetensors")):
        for name, tensor in load_file(shard).items():
            match = _LAYER.match(name)
            if match is None or int(match.group(1)) < layers:
                tensors[name] = tensor
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    config["num_hidden_layers"] = layers
    for key in ("layer_types",):
        if isinstance(config.get(key), list):
            config[key] = config[key][:layers]
    if "max_window_layers" in config:
        config["max_window_layers"] = min(config["max_window_layers"], layers)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for path in model.iterdir():
        if path.suffix != ".safetensors" and path.name not in ("config.json", "model.safetensors.index.json") \
                and path.is_file():
            shutil.copy(path, out / path.name)
    return len(tensors)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    kept = truncate(Path(args.model), Path(args.out), args.layers)
    print(f"wrote {args.out}: {args.layers} layers, {kept} tensors")


if __name__ == "__main__":
    main()
