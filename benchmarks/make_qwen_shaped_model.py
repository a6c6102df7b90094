"""Write a checkpoint shaped like Qwen2.5-0.5B-Instruct with random bfloat16 weights.

    python benchmarks/make_qwen_shaped_model.py                  # -> /tmp/qwen-shaped
    python benchmarks/make_qwen_shaped_model.py --out DIR --seed 0

The benchmarks need a model of a real size, and the machines cannot download one. This folder
has Qwen2.5-0.5B-Instruct's exact tensor shapes (Qwen2ForCausalLM: hidden 896, 24 layers, 14
query heads / 2 KV heads of 64, intermediate 4864, vocab 151,936, tied embeddings, q/k/v biases,
rope_theta 1e6, max_position_embeddings 32,768; 494M parameters, 988 MB in bfloat16), so every
matmul costs what the real model's does; only the values are random.

The tokenizer is a byte-level BPE that covers all 151,936 ids (:func:`full_vocab_tokenizer`), with
the normalizer, pre-tokenizer (Qwen2's split regex), special tokens and ChatML template of the
``bpe`` kind of :mod:`kvserve.testing.tokenizer_kinds`. It must cover every id: random weights
sample ids uniformly, and with the 1,024-token ``bpe`` kind 99% of generated ids would decode to
no text at all (streams with no text count as failed requests, and llama.cpp needs a token for
every embedding row). Its merges are built, not trained: the 256 byte symbols, every pair and
triple of ASCII letters, and a space (``Ġ``) before a letter, a pair and the first triples.

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
from kvserve.testing.tokenizer_kinds import BPE_SPECIAL_TOKENS, CHATML_TEMPLATE, QWEN2_SPLIT_REGEX

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


def _merge_plan(num_merges: int) -> list[tuple[str, str]]:
    """``num_merges`` merges in rank order (see the module docstring)."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [chr(c) for c in range(ord("A"), ord("Z") + 1)]
    pairs = [(a, b) for a in letters for b in letters]
    triples = [(a + b, c) for a in letters for b in letters for c in letters]
    spaced = [("Ġ", a) for a in letters] + [("Ġ", a + b) for a, b in pairs] + [("Ġ", a + c) for a, c in triples]
    merges = (pairs + triples + spaced)[:num_merges]
    if len(merges) < num_merges:
        raise ValueError(f"cannot build {num_merges} merges; at most {len(pairs + triples + spaced)}")
    return merges


def full_vocab_tokenizer(vocab_size: int):
    """A ``PreTrainedTokenizerFast`` with exactly ``vocab_size`` tokens: the four ``bpe``-kind
    special tokens at ids 0-3, the 256 byte symbols, then built merges (``Ġ`` = space).

    Raises:
        ValueError: ``vocab_size`` below 260 or above what the merge plan can build.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 260:
        raise ValueError(f"vocab_size must be >= 260 (4 special + 256 bytes), got {vocab_size}")
    vocab = {tok: i for i, tok in enumerate(BPE_SPECIAL_TOKENS)}
    for symbol in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[symbol] = len(vocab)
    merges = _merge_plan(vocab_size - len(vocab))
    for left, right in merges:
        vocab[left + right] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(BPE_SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=BPE_SPECIAL_TOKENS[0],
                                   eos_token=BPE_SPECIAL_TOKENS[1], pad_token=BPE_SPECIAL_TOKENS[1],
                                   unk_token=BPE_SPECIAL_TOKENS[1], chat_template=CHATML_TEMPLATE)


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
    record = {"architecture": "Qwen2ForCausalLM", "tokenizer": "full-vocab byte-level BPE", "dtype": "bfloat16",
              "seed": seed, "shape": shape}
    marker = out / "shape.json"
    if not force and marker.exists() and json.loads(marker.read_text()) == record:
        return out
    build_checkpoint(out, "Qwen2ForCausalLM", "bpe", "bfloat16", seed, **shape)
    tokenizer = full_vocab_tokenizer(shape["vocab_size"])
    assert len(tokenizer) == shape["vocab_size"]
    tokenizer.save_pretrained(out)  # replaces the 1,024-token files build_checkpoint wrote
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
