"""Whether a checkpoint runs as a pooling model, and how it pools (vLLM 0.32's rules).

``--runner`` / ``--convert`` (vLLM's ``ModelConfig.runner`` / ``convert``; the older ``--task
embed`` means ``--runner pooling``) resolve against the folder::

    --runner auto      sentence-transformers folder (modules.json)  -> pooling
                       encoder architecture (BertModel, ...)        -> pooling
                       sequence classifier (*ForSequenceClassification) -> pooling (classify)
                       --convert embed | classify                   -> pooling
                       otherwise                                    -> generate
    --runner pooling   an encoder, or a decoder (*ForCausalLM) adapted by --convert embed (the
                       default for decoders): last-token pooling of the final hidden states;
                       --convert classify makes a *ForCausalLM its *ForSequenceClassification
                       (kvserve.model.seq_cls)
    --runner generate  a decoder; an encoder or a classifier is refused (no language-model head)

A sequence classifier's task is ``classify`` (``PoolerConfig.classifier``: labels, activation,
``kvserve.pooling.classifier_config``); it pools with its architecture's default (CLS for BERT and
RoBERTa, LAST for decoders): a sentence-transformers CrossEncoder folder's modules.json holds no
Pooling module.

How a pooling model pools (``PoolerConfig``): a sentence-transformers folder's ``modules.json``
names a ``Pooling`` module whose ``config.json`` gives the mode (``pooling_mode`` or the older
``pooling_mode_cls_token`` / ``pooling_mode_mean_tokens`` / ``pooling_mode_lasttoken`` flags) and
a ``Normalize`` module turns L2 normalisation on (without one, embeddings are not normalised);
otherwise the architecture's default applies (encoders: CLS; decoders: LAST) with normalisation on,
as vLLM. ``sentence_*_config.json``'s ``max_seq_length`` caps the context and its
``do_lower_case`` lower-cases text before tokenizing. Matryoshka dimensions come from config.json
(``is_matryoshka``, ``matryoshka_dimensions``), as vLLM reads them.

Source: vLLM 0.32 ``vllm/config/model.py`` (``_get_runner_type``, ``_get_convert_type``),
``vllm/transformers_utils/config.py`` (``get_pooling_config``,
``get_sentence_transformer_tokenizer_config``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from kvserve.errors import CheckpointError, ConfigError
from kvserve.pooling.classifier_config import ClassifierConfig, read_classifier_config

PoolingType = Literal["CLS", "MEAN", "LAST"]
RUNNERS = ("auto", "generate", "pooling")
CONVERTS = ("auto", "none", "embed", "classify")

# sentence-transformers module types, by the end of their dotted name (its classic
# ``sentence_transformers.models.X`` names and those of sentence-transformers >= 5).
_ST_TRANSFORMER, _ST_POOLING, _ST_NORMALIZE = ".Transformer", ".Pooling", ".Normalize"
# Pooling modes (sentence-transformers' names) -> ours; the other modes are refused by name.
_ST_MODES = {"cls": "CLS", "cls_token": "CLS", "mean": "MEAN", "mean_tokens": "MEAN", "lasttoken": "LAST"}
_ST_TOKENIZER_CONFIGS = ("sentence_bert_config.json", "sentence_roberta_config.json",
                         "sentence_distilbert_config.json", "sentence_xlm-roberta_config.json")


@dataclass(frozen=True)
class PoolerConfig:
    """How a pooling model turns a prompt's final hidden states into its output.

    Attributes:
        task: the model's task (``embed``; ``classify`` for sequence-classification heads).
        architecture: the registered class to build (``*ForSequenceClassification`` for a
            ``*ForCausalLM`` under ``--convert classify``).
        pooling_type: ``CLS`` (the first token's state), ``MEAN`` (the mean over the prompt's
            tokens) or ``LAST`` (the last token's state).
        use_activation: the default of ``PoolingParams.use_activation`` (embed: L2-normalise).
        hidden_size: the length of an embedding (the model's hidden size).
        is_matryoshka: the model accepts ``dimensions`` (any value in [1, hidden_size], or one of
            ``matryoshka_dimensions`` when listed).
        matryoshka_dimensions: the dimensions the model was trained for, or None.
        encoder_only: bidirectional attention (BERT and kin): a prompt runs whole in one step and
            no KV cache is kept.
        max_seq_length: sentence-transformers' ``max_seq_length`` (caps the context), or None.
        do_lower_case: text is lower-cased before tokenizing (sentence-transformers).
        source: where the pooling came from, for the start-up log.
        classifier: a ``classify`` model's labels, activation and pair rule, else None.
        token_types: a text pair carries segment ids to the model (BERT cross-encoders).
    """

    task: str
    pooling_type: PoolingType
    use_activation: bool
    hidden_size: int
    architecture: str = ""
    is_matryoshka: bool = False
    matryoshka_dimensions: tuple[int, ...] | None = None
    encoder_only: bool = False
    max_seq_length: int | None = None
    do_lower_case: bool = False
    source: str = ""
    classifier: ClassifierConfig | None = None
    token_types: bool = False

    def describe(self) -> str:
        """e.g. ``embed: CLS pooling, normalized (modules.json), 384 dimensions``, ``classify: LAST
        pooling, 1 label (classify activation) (Qwen3ForSequenceClassification's default)``."""
        if self.classifier is not None:
            labels = self.classifier.num_labels
            return (f"{self.task}: {self.pooling_type} pooling, {labels} label{'s' if labels != 1 else ''} "
                    f"({self.classifier.activation} activation) ({self.source})")
        norm = "normalized" if self.use_activation else "not normalized"
        dims = f", Matryoshka {list(self.matryoshka_dimensions)}" if self.matryoshka_dimensions else (
            ", Matryoshka" if self.is_matryoshka else "")
        return f"{self.task}: {self.pooling_type} pooling, {norm} ({self.source}), {self.hidden_size} dimensions{dims}"


def resolve_runner(model_dir: str | Path, architecture: str, runner: str, convert: str) -> str:
    """``generate`` or ``pooling`` for ``--runner`` / ``--convert`` on this folder (module
    docstring).

    Raises:
        ConfigError: an encoder or a classifier with ``--runner generate``; a decoder with
            ``--runner pooling --convert none``; ``--convert embed|classify`` with ``--runner
            generate``; unknown values.
    """
    from kvserve.model.registry import default_pooling_task, is_encoder_only

    if runner not in RUNNERS:
        raise ConfigError(f"--runner {runner!r} is not supported; choose one of {', '.join(RUNNERS)}")
    if convert not in CONVERTS:
        raise ConfigError(f"--convert {convert!r} is not supported; choose one of {', '.join(CONVERTS)}")
    pooling_only = is_encoder_only(architecture) or default_pooling_task(architecture) == "classify"
    if runner == "auto":
        if pooling_only or convert in ("embed", "classify") or (Path(model_dir) / "modules.json").is_file():
            return "pooling"
        return "generate"
    if runner == "generate":
        if pooling_only:
            raise ConfigError(f"{architecture} does not support `--runner generate` (it has no language model "
                              "head); use `--runner pooling` or `--runner auto`")
        if convert in ("embed", "classify"):
            raise ConfigError(f"--convert {convert} adapts a model to pooling: use it with `--runner pooling` "
                              "(or auto)")
        return "generate"
    if not pooling_only and convert == "none":
        raise ConfigError(f"{architecture} does not support `--runner pooling` as it is. You can pass "
                          "`--convert embed` to adapt it into a pooling model (the default of --convert auto)")
    return "pooling"


def pooled_architecture(architecture: str, convert: str) -> str:
    """The class a pooling run builds: ``architecture``, or its sequence classifier under
    ``--convert classify``.

    Raises:
        ConfigError: ``--convert classify`` on an architecture without a classifier form;
            ``--convert embed`` on a sequence classifier.
    """
    from kvserve.model.registry import classifier_architecture, default_pooling_task

    if convert == "classify":
        converted = classifier_architecture(architecture)
        if converted is None:
            raise ConfigError(f"--convert classify: {architecture} has no sequence-classification form in kvserve "
                              "(Llama, Mistral, Qwen2 and Qwen3 decoders convert; encoders need a "
                              "*ForSequenceClassification checkpoint)")
        return converted
    if convert == "embed" and default_pooling_task(architecture) == "classify":
        raise ConfigError(f"--convert embed: {architecture} is a sequence classifier; serve it as it is "
                          "(--convert auto)")
    return architecture


def load_pooler_config(model_dir: str | Path, arch: Any, convert: str = "auto") -> PoolerConfig:
    """The ``PoolerConfig`` of a pooling model's folder (module docstring); ``arch`` is its
    ``ModelArchConfig`` (``--hf-overrides`` applied).

    Raises:
        CheckpointError: a sentence-transformers module or pooling mode kvserve does not run
            (named), a modules.json / module config that is not valid JSON, a classifier's
            config.json fields kvserve does not run (``kvserve.pooling.classifier_config``).
        ConfigError: as :func:`pooled_architecture`.
    """
    from kvserve.model.registry import default_pooling_task, default_pooling_type, get_model_class, is_encoder_only

    folder = Path(model_dir)
    architecture = pooled_architecture(arch.architecture, convert)
    task = default_pooling_task(architecture)
    st = _sentence_transformers_pooling(folder) if task == "embed" else None
    pooling_type, use_activation, source = st if st is not None else (
        default_pooling_type(architecture), True, f"{architecture}'s default")
    raw = arch.raw
    dims = raw.get("matryoshka_dimensions") if task == "embed" else None
    tokenizer_config = _sentence_tokenizer_config(folder)
    max_seq = tokenizer_config.get("max_seq_length")
    classifier = read_classifier_config(raw, str(folder / "config.json")) if task == "classify" else None
    token_types = (classifier is not None and getattr(get_model_class(architecture), "uses_token_type_ids", False)
                   and int(raw.get("type_vocab_size", 2)) > 1)
    return PoolerConfig(
        task=task, pooling_type=pooling_type, use_activation=use_activation, hidden_size=arch.hidden_size,
        architecture=architecture,
        is_matryoshka=bool(dims) or (task == "embed" and bool(raw.get("is_matryoshka", False))),
        matryoshka_dimensions=tuple(int(d) for d in dims) if dims else None,
        encoder_only=is_encoder_only(architecture),
        max_seq_length=int(max_seq) if max_seq else None,
        do_lower_case=bool(tokenizer_config.get("do_lower_case", False)), source=source,
        classifier=classifier, token_types=token_types,
    )


def resolve_pooler_config(model_config: Any, arch: Any = None) -> PoolerConfig | None:
    """The ``PoolerConfig`` when ``model_config`` (a ``kvserve.config.ModelConfig``) runs as a
    pooling model, else None. ``arch``: its ``ModelArchConfig`` when already read (with the
    model's ``hf_overrides``).

    Raises:
        ConfigError, CheckpointError: as ``resolve_runner`` and ``load_pooler_config``; a GGUF
            file with ``--runner pooling``.
    """
    from kvserve.model.gguf_file import find_gguf
    from kvserve.model.loader import load_arch_config

    model = model_config.model
    if find_gguf(model) is not None:
        if model_config.runner == "pooling" or model_config.convert in ("embed", "classify"):
            raise ConfigError("--runner pooling loads Hugging Face folders (config.json and safetensors), not GGUF files")
        return None
    arch = arch if arch is not None else load_arch_config(model, model_config.hf_overrides)
    if resolve_runner(model, arch.architecture, model_config.runner, model_config.convert) != "pooling":
        return None
    return load_pooler_config(model, arch, model_config.convert)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from exc


def _sentence_transformers_pooling(folder: Path) -> tuple[PoolingType, bool, str] | None:
    """(pooling type, normalize, source) from ``modules.json``, or None without that file."""
    path = folder / "modules.json"
    if not path.is_file():
        return None
    modules = _read_json(path)
    if not isinstance(modules, list):
        raise CheckpointError(f"{path} must hold a list of sentence-transformers modules")
    pooling, normalize = None, False
    for module in modules:
        kind = str(module.get("type", ""))
        if kind.endswith(_ST_POOLING):
            pooling = _pooling_mode(folder / module.get("path", "") / "config.json")
        elif kind.endswith(_ST_NORMALIZE):
            normalize = True
        elif not kind.endswith(_ST_TRANSFORMER):
            raise CheckpointError(f"{path}: the sentence-transformers module {module.get('name', '?')!r} of type {kind} "
                                  "is not supported; kvserve runs Transformer, Pooling and Normalize modules")
    if pooling is None:
        raise CheckpointError(f"{path} has no Pooling module; kvserve needs one to know how to pool")
    return pooling, normalize, "sentence-transformers modules.json"


def _pooling_mode(path: Path) -> PoolingType:
    """The one pooling mode of a sentence-transformers ``Pooling`` module's ``config.json``.

    Raises:
        CheckpointError: no mode, several, one kvserve does not implement, or
            ``include_prompt: false`` (instruction tokens left out of the mean).
    """
    config = _read_json(path) if path.is_file() else {}
    mode = config.get("pooling_mode")
    modes = ([mode] if isinstance(mode, str) else list(mode)) if mode else [
        key.removeprefix("pooling_mode_") for key, value in config.items()
        if key.startswith("pooling_mode_") and value is True]
    unknown = [m for m in modes if m not in _ST_MODES]
    if unknown or len(modes) != 1:
        raise CheckpointError(f"{path}: pooling mode {', '.join(modes) or 'none'} is not supported; kvserve pools "
                              "with exactly one of cls, mean and lasttoken")
    if config.get("include_prompt", True) is False:
        raise CheckpointError(f"{path}: include_prompt false (the instruction left out of the pooling) is not supported")
    return _ST_MODES[modes[0]]


def _sentence_tokenizer_config(folder: Path) -> dict[str, Any]:
    """sentence-transformers' ``sentence_*_config.json`` (``max_seq_length``, ``do_lower_case``),
    or {}."""
    for name in _ST_TOKENIZER_CONFIGS:
        path = folder / name
        if path.is_file():
            config = _read_json(path)
            return config if isinstance(config, dict) else {}
    return {}
