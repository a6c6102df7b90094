"""Small decoder rerankers with random weights, written offline for the scoring tests.

:func:`build_original_reranker`: a ``Qwen3ForCausalLM`` checkpoint laid out as the original
Qwen3-Reranker (an LM whose "no" / "yes" logits at the last position are the relevance), its BPE
tokenizer with ``no`` and ``yes`` as tokens of their own, to be served with vLLM's
``--hf-overrides`` recipe (:data:`QWEN3_RERANKER_OVERRIDES`).

:func:`build_seq_cls_decoder`: a ``*ForSequenceClassification`` decoder checkpoint (transformers'
own class: ``model.*`` and a trained ``score`` head, as converted rerankers are published).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvserve.testing.checkpoints import build_checkpoint

QWEN3_RERANKER_OVERRIDES: dict[str, Any] = {
    "architectures": ["Qwen3ForSequenceClassification"],
    "classifier_from_token": ["no", "yes"],
    "is_original_qwen3_reranker": True,
}
# The tiny BPE tokenizer has 960 tokens; the two added ones must fit the embedding table.
RERANKER_VOCAB = 1024


def build_original_reranker(path: str | Path, architecture: str = "Qwen3ForCausalLM", seed: int = 0,
                            **overrides: Any) -> Path:
    """A Qwen3-Reranker-shaped LM (module docstring) in ``path``; ``overrides``: config fields
    (``tie_word_embeddings``, ...). Returns the folder."""
    from transformers import AutoTokenizer

    path = Path(build_checkpoint(path, architecture, seed=seed, vocab_size=RERANKER_VOCAB, **overrides))
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.add_tokens(["no", "yes"])
    tokenizer.save_pretrained(path)
    return path


def build_seq_cls_decoder(path: str | Path, architecture: str = "Qwen3ForSequenceClassification", num_labels: int = 1,
                          seed: int = 0) -> Path:
    """A decoder sequence classifier (transformers' ``architecture``) of ``num_labels`` labels,
    its body the tiny ``*ForCausalLM`` of :func:`kvserve.testing.checkpoints.build_checkpoint`
    (the same seed) and a random ``score`` head; a pad token set, as transformers' classifiers
    need for batches. Returns the folder."""
    import torch
    import transformers

    path = Path(path)
    causal = architecture.replace("ForSequenceClassification", "ForCausalLM")
    build_checkpoint(path, causal, seed=seed)
    config = transformers.AutoConfig.from_pretrained(path)
    config.architectures = [architecture]
    config.num_labels = num_labels
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 1)
        model = getattr(transformers, architecture).from_pretrained(path, config=config, dtype=torch.float32)
        torch.nn.init.normal_(model.score.weight, 0.0, 0.5)
    model.config.pad_token_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    for stale in path.glob("model*.safetensors*"):
        stale.unlink()
    model.save_pretrained(path, safe_serialization=True)
    return path
