"""Peak memory of ``load_model``: the weights plus about one tensor, never a second full copy.

Runs the load in a fresh Python process and samples its anonymous resident memory (``RssAnon`` in
/proc/self/status: the heap, where parameters live; the memory-mapped safetensors pages are
file-backed and dropped when the file is closed) every millisecond.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import save_file

BIG = dict(hidden=1024, intermediate=2048, vocab=8192, layers=4)  # ~59M parameters
SMALL = dict(hidden=64, intermediate=128, vocab=256, layers=1)

MEASURE = textwrap.dedent(
    """
    import sys, threading, time
    import torch
    from kvserve.model.loader import load_model

    def rss_anon():
        for line in open("/proc/self/status"):
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024

    peak, done = [0], [False]
    def sample():
        while not done[0]:
            peak[0] = max(peak[0], rss_anon())
            time.sleep(0.001)

    load_model(sys.argv[3], dtype=sys.argv[2])  # warm-up: lazy imports inside torch and kvserve
    base = rss_anon()
    thread = threading.Thread(target=sample)
    thread.start()
    loaded = load_model(sys.argv[1], dtype=sys.argv[2])
    done[0] = True
    thread.join()
    peak[0] = max(peak[0], rss_anon())
    print(peak[0] - base)
    """
)


def write_checkpoint(folder, dtype: torch.dtype, hidden: int, intermediate: int, vocab: int, layers: int) -> int:
    """A LlamaForCausalLM whose weights are zeros; returns the bytes of its weights."""
    folder.mkdir(exist_ok=True)
    config = dict(
        architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=vocab, hidden_size=hidden,
        intermediate_size=intermediate, num_hidden_layers=layers, num_attention_heads=8,
        num_key_value_heads=8, tie_word_embeddings=False, dtype=str(dtype).removeprefix("torch."),
    )
    (folder / "config.json").write_text(json.dumps(config))
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,),
              "lm_head.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            shapes[p + f"self_attn.{name}.weight"] = (hidden, hidden)
        shapes[p + "mlp.gate_proj.weight"] = shapes[p + "mlp.up_proj.weight"] = (intermediate, hidden)
        shapes[p + "mlp.down_proj.weight"] = (hidden, intermediate)
        shapes[p + "input_layernorm.weight"] = shapes[p + "post_attention_layernorm.weight"] = (hidden,)
    tensors = {name: torch.zeros(shape, dtype=dtype) for name, shape in shapes.items()}
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return sum(t.numel() * t.element_size() for t in tensors.values())


@pytest.mark.slow
def test_peak_memory_is_about_the_weights(tmp_path):
    weight_bytes = write_checkpoint(tmp_path / "big", torch.bfloat16, **BIG)
    write_checkpoint(tmp_path / "small", torch.bfloat16, **SMALL)
    result = subprocess.run(
        [sys.executable, "-c", MEASURE, str(tmp_path / "big"), "bfloat16", str(tmp_path / "small")],
        capture_output=True, text=True, check=True,
    )
    peak = int(result.stdout.strip().splitlines()[-1])
    assert weight_bytes > 100e6
    # Weights + one tensor in flight (the largest is 16 MB) + allocator slack.
    assert peak <= 1.2 * weight_bytes, (peak / weight_bytes, peak, weight_bytes)
