"""The small model that ships inside the package, so ``kvserve serve`` and ``kvserve chat`` work
offline with no download.

``kvserve-builtin-austen-5m`` is a 5.6M-parameter ``LlamaForCausalLM`` (hidden 256, 6 layers,
8 query / 2 KV heads, intermediate 768, tied embeddings, vocab 4096, context 256 tokens, float32
weights) trained from scratch on Jane Austen's six novels by ``scripts/train_builtin_model.py``.
It writes readable, Austen-flavoured English and nothing more: it is a fixture for serving, not an
assistant. Provenance, licence and loss curve: ``docs/builtin_model.md`` and the folder's
``training_log.json``.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

from kvserve.errors import CheckpointError

BUILTIN_MODEL_NAME = "kvserve-builtin-austen-5m"
"""The name clients use in ``model`` when the server runs the built-in model."""

BUILTIN_MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
)
"""Files a complete built-in model folder holds (``training_log.json`` and ``corpus_words.txt``
ship beside them as documentation)."""


def builtin_model_path() -> Path:
    """Path of the Hugging Face folder of the built-in model (``kvserve/builtin_model/``).

    Found with :mod:`importlib.resources`, so it works from a source checkout, an editable
    install and a wheel alike.

    Returns:
        The folder, a real directory on disk (zip imports are not supported).

    Raises:
        CheckpointError: the folder or one of :data:`BUILTIN_MODEL_FILES` is missing (a broken
            install, or a checkout without the trained weights).
    """
    folder = resources.files("kvserve") / "builtin_model"
    path = Path(str(folder))
    missing = [name for name in BUILTIN_MODEL_FILES if not (path / name).is_file()]
    if missing:
        raise CheckpointError(
            f"the built-in model folder {path} lacks {', '.join(missing)}; reinstall kvserve or "
            f"rebuild it with `python scripts/train_builtin_model.py --out {path}`"
        )
    return path


BUILTIN_DRAFT_MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
"""Files of the built-in model's draft folder (``builtin_model/draft/``; its ``training_log.json``
ships beside them)."""


def builtin_draft_model_path() -> Path:
    """Path of the built-in model's draft: a ~0.9M-parameter model trained by the same script on
    the same corpus with the same tokenizer, for ``--speculative-config '{"method": "draft_model",
    "model": PATH, ...}'`` with the built-in model (``docs/builtin_model.md``, "The draft").

    Raises:
        CheckpointError: the folder or one of :data:`BUILTIN_DRAFT_MODEL_FILES` is missing.
    """
    path = builtin_model_path() / "draft"
    missing = [name for name in BUILTIN_DRAFT_MODEL_FILES if not (path / name).is_file()]
    if missing:
        raise CheckpointError(f"the built-in draft model folder {path} lacks {', '.join(missing)}; reinstall "
                              f"kvserve or rebuild it with the command in docs/builtin_model.md")
    return path


def is_builtin_model_name(name: str) -> bool:
    """True when ``name`` asks for the built-in model: :data:`BUILTIN_MODEL_NAME` or ``builtin``."""
    return name in (BUILTIN_MODEL_NAME, "builtin")


def resolve_model(model: str | None) -> tuple[str, str]:
    """The model folder and default served name for a ``MODEL`` argument: ``None`` (or
    ``builtin``) = the built-in model under :data:`BUILTIN_MODEL_NAME`; a folder is served under
    its own name, a ``.gguf`` file under its name without the suffix.

    Raises:
        CheckpointError: the built-in model is asked for but missing, or ``model`` is not a folder.
    """
    if model is None or is_builtin_model_name(model):
        return str(builtin_model_path()), BUILTIN_MODEL_NAME
    if Path(model).suffix.lower() == ".gguf" and Path(model).is_file():
        return model, Path(model).stem  # a GGUF file (kvserve.model.gguf_file)
    if not Path(model).is_dir():
        raise CheckpointError(_not_a_folder_message(model))
    return model, Path(model).resolve().name


def _not_a_folder_message(model: str) -> str:
    """Why ``model`` cannot be served; a Hub id (``org/name``) gets the download command."""
    if re.fullmatch(r"[\w.-]+/[\w.-]+", model) and not Path(model).exists():
        local = model.split("/")[1]
        return (f"{model!r} is not a folder here; kvserve loads local model folders and downloads nothing. "
                f"If it is a Hugging Face Hub id, download it first: hf download {model} --local-dir ./{local} "
                f"(pip install huggingface_hub), then: kvserve serve ./{local}")
    return (f"model folder {model!r} does not exist; give a Hugging Face model folder (config.json, "
            f"*.safetensors, tokenizer files), a .gguf file, or no argument for the built-in model")
