"""Shared fixtures: tiny Hugging Face checkpoints with random weights, built offline.

``checkpoint_factory(architecture=..., tokenizer_kind=..., dtype=..., seed=..., **overrides)``
builds each distinct checkpoint once per test session (in ``tmp_path_factory``) and returns its
folder. The folders are shared between tests: read them, never modify them (copy first).
The BPE tokenizer is trained once per session and the Tekken conversion done once, see
:mod:`kvserve.testing.tokenizer_kinds`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

# Python's default, whatever the environment says: compiled modules are kept in __pycache__. Where
# PYTHONDONTWRITEBYTECODE is set, every process the tests start (servers, ranks, CLI runs) would
# compile torch's and transformers' sources again: 12 s instead of 6 s per start on a 2-core host.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# Triton kernels run under Triton's interpreter here (their tests give CPU tensors): Triton reads
# this when it is imported, whichever test imports it first.
os.environ.setdefault("TRITON_INTERPRET", "1")

from kvserve.cpu_threads import process_environment  # noqa: E402

# Under pytest-xdist (two workers, pyproject.toml) each worker and the processes it starts run one
# OpenMP thread, unless a test sets more: two workers of two threads each on two cores contend.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# The process settings of `kvserve serve` (OpenMP's threads sleep at once, so the C++ kernels run
# on their own worker pool), set before torch loads: libgomp reads them once.
if "torch" not in sys.modules:
    os.environ.update(process_environment())

import pytest  # noqa: E402
import torch  # noqa: E402

from kvserve.testing.checkpoints import build_checkpoint  # noqa: E402


@pytest.fixture
def one_torch_thread():
    """The test on one torch thread, restored after it: tiny models and tensors run fastest so;
    with other work on the machine, OpenMP threads contend and a 2-thread run was 20x slower.
    Folders of such tests request it for every test (an autouse fixture in their conftest)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def checkpoint_factory(tmp_path_factory):
    """A function ``(architecture="LlamaForCausalLM", tokenizer_kind="bpe", dtype="float32",
    seed=0, **overrides) -> Path`` with the arguments of
    :func:`kvserve.testing.checkpoints.build_checkpoint` (``max_shard_size`` and config fields
    go in ``overrides``); equal arguments return the same folder."""
    built: dict[str, Path] = {}

    def build(
        architecture: str = "LlamaForCausalLM",
        tokenizer_kind: str = "bpe",
        dtype: str = "float32",
        seed: int = 0,
        **overrides,
    ) -> Path:
        key = json.dumps([architecture, tokenizer_kind, dtype, seed, overrides], sort_keys=True)
        if key not in built:
            folder = tmp_path_factory.mktemp(f"{architecture}-{tokenizer_kind}-{dtype}")
            built[key] = build_checkpoint(
                folder, architecture, tokenizer_kind, dtype, seed, **overrides
            )
        return built[key]

    return build


@pytest.fixture(scope="session")
def tiny_llama(checkpoint_factory) -> Path:
    """LlamaForCausalLM, hidden 64, 2 layers, 4 heads / 2 KV heads, BPE tokenizer, float32."""
    return checkpoint_factory("LlamaForCausalLM")


@pytest.fixture(scope="session")
def tiny_llama_bf16(checkpoint_factory) -> Path:
    """As ``tiny_llama`` (same seed) with weights stored in bfloat16."""
    return checkpoint_factory("LlamaForCausalLM", dtype="bfloat16")


@pytest.fixture(scope="session")
def tiny_llama_sentencepiece(checkpoint_factory) -> Path:
    """LlamaForCausalLM with Mistral v3's SentencePiece tokenizer (32,768 tokens)."""
    return checkpoint_factory("LlamaForCausalLM", tokenizer_kind="sentencepiece")


@pytest.fixture(scope="session")
def tiny_mistral(checkpoint_factory) -> Path:
    """MistralForCausalLM with a BPE tokenizer, sliding window 4096 (the config default)."""
    return checkpoint_factory("MistralForCausalLM")


@pytest.fixture(scope="session")
def tiny_mistral_tekken(checkpoint_factory) -> Path:
    """MistralForCausalLM with the Tekken tokenizer (131,072 tokens, hidden 32, tied)."""
    return checkpoint_factory("MistralForCausalLM", tokenizer_kind="tekken")


@pytest.fixture(scope="session")
def tiny_qwen2(checkpoint_factory) -> Path:
    """Qwen2ForCausalLM with a BPE tokenizer (q/k/v biases)."""
    return checkpoint_factory("Qwen2ForCausalLM")


@pytest.fixture(scope="session")
def tiny_qwen3(checkpoint_factory) -> Path:
    """Qwen3ForCausalLM with a BPE tokenizer (q/k norms)."""
    return checkpoint_factory("Qwen3ForCausalLM")
