"""Helpers of the pooling tests: an offline engine, embeddings as tensors, and the references
(sentence-transformers, transformers' hidden states) with the comparison every test uses."""

from __future__ import annotations

import warnings

import httpx
import torch
import torch.nn.functional as F

from kvserve.engine.llm import LLM

TEXTS = ["The quick brown fox jumps over the lazy dog.", "hi", "Paris is the capital of France. Berlin is the "
         "capital of Germany. Rome is in Italy, and numbers 10 100 1000.", "Embeddings map text to vectors."]


def make_llm(model_dir, **kwargs) -> LLM:
    defaults = dict(dtype="float32", max_num_seqs=16, seed=0)
    return LLM(str(model_dir), **{**defaults, **kwargs})


def embed(llm: LLM, prompts, **kwargs) -> list[torch.Tensor]:
    return [torch.tensor(o.outputs.embedding, dtype=torch.float32) for o in llm.embed(prompts, use_tqdm=False, **kwargs)]


def sentence_transformers_reference(model_dir, texts: list[str], **kwargs) -> list[torch.Tensor]:
    """sentence-transformers' embeddings, one text per batch (no padding), float32."""
    from sentence_transformers import SentenceTransformer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = SentenceTransformer(str(model_dir), device="cpu")
        out = model.encode(texts, batch_size=1, convert_to_tensor=True, **kwargs)
    return [row.float() for row in out]


def transformers_hidden(model_dir, token_ids: list[int]) -> torch.Tensor:
    """The final hidden states [n, H] of transformers' ``AutoModel`` (float32) for one prompt."""
    from transformers import AutoModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModel.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        return model(input_ids=torch.tensor([token_ids])).last_hidden_state[0]


def assert_close(ours: torch.Tensor, reference: torch.Tensor) -> tuple[float, float]:
    """cos >= 0.99999 and the same length; returns (cosine, max abs diff)."""
    assert ours.shape == reference.shape
    cosine = F.cosine_similarity(ours, reference, dim=0).item()
    diff = (ours - reference).abs().max().item()
    assert cosine >= 0.99999, (cosine, diff)
    return cosine, diff


KEY = "test-key"  # the API key of the pooling tests' live servers


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
