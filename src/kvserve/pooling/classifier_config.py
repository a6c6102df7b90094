"""What a sequence classifier's config.json says about its output (``ClassifierConfig``): how many
labels, their names, the activation of ``use_activation``, whether its head is made from LM-head
rows, and how a (query, document) pair becomes one prompt.

    num_labels     config.json's ``id2label`` (its length), else ``num_labels``, else 2
                   (transformers' default); 1 for ``method: from_2_way_softmax``, one per token for
                   ``no_post_processing``
    activation     ``problem_type`` regression -> none, multi_label_classification -> sigmoid;
                   sentence-transformers' ``activation_fn`` (``sentence_transformers`` or
                   ``sbert_ce_default_activation_function``: Identity -> none, Sigmoid/Softmax ->
                   classify); else classify: sigmoid for one label, softmax over several
    from tokens    ``classifier_from_token`` + ``method``: the head is built from the LM head's
                   rows of those tokens (``from_2_way_softmax``: one logit ``row[1] - row[0]``,
                   so sigmoid(logit) = softmax over the two tokens' logits; ``no_post_processing``:
                   one logit per token). ``is_original_qwen3_reranker: true`` means
                   ``from_2_way_softmax`` over exactly two tokens (``["no", "yes"]``).
    use_sep_token  a pair is tokenized as ``tokenizer(query, document)`` (the cross-encoder's
                   separator and segment ids) when true (the default), else as the text
                   ``query + document`` (an LLM reranker; the default when ``method`` is set);
                   ``use_pad_token``, its older name, wins when present

Source: vLLM 0.32 ``vllm/model_executor/layers/pooler/activations.py`` (``get_act_fn``),
``vllm/model_executor/models/adapters.py`` (``_resolve_num_labels``, ``SequenceClassificationConfig``,
``load_weights_using_from_2_way_softmax``, ``load_weights_no_post_processing``),
``vllm/model_executor/models/config.py`` (``Qwen3ForSequenceClassificationConfig``),
``vllm/config/model.py`` (``use_sep_token``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from kvserve.errors import CheckpointError

Activation = Literal["classify", "sigmoid", "identity"]
METHODS = ("from_2_way_softmax", "no_post_processing")
_ACTIVATION_PREFIX = "torch.nn.modules."
_ST_ACTIVATIONS: dict[str, Activation] = {"Identity": "identity", "Sigmoid": "classify", "Softmax": "classify"}


@dataclass(frozen=True)
class ClassifierConfig:
    """Attributes (module docstring):
        num_labels: logits per prompt.
        id2label: label index -> name (``/classify``'s ``label``); may be empty.
        activation: ``classify`` (sigmoid for one label, softmax for more), ``sigmoid`` (each
            label alone) or ``identity``; applied when ``PoolingParams.use_activation``.
        from_tokens: the tokens whose LM-head rows make the head, or None (a trained head).
        method: ``from_2_way_softmax`` or ``no_post_processing`` with ``from_tokens``, else None.
        use_sep_token: pairs tokenized as a pair (True) or as one concatenated text (False).
    """

    num_labels: int
    id2label: dict[int, str] = field(default_factory=dict)
    activation: Activation = "classify"
    from_tokens: tuple[str, ...] | None = None
    method: str | None = None
    use_sep_token: bool = True


def read_classifier_config(raw: dict[str, Any], source: str = "config.json") -> ClassifierConfig:
    """The ``ClassifierConfig`` of config.json's ``raw`` (with ``--hf-overrides`` applied).

    Raises:
        CheckpointError: ``is_original_qwen3_reranker`` without two ``classifier_from_token``, a
            ``method`` kvserve does not know or without tokens, an activation outside
            ``torch.nn.modules`` or one kvserve does not run.
    """
    method, tokens = _from_tokens(raw, source)
    id2label = _id2label(raw.get("id2label"), source)
    if method == "from_2_way_softmax":
        num_labels = 1
    elif method == "no_post_processing":
        num_labels = len(tokens)
    else:
        num_labels = len(id2label) or int(raw.get("num_labels") or 2)
    sep = raw.get("use_pad_token", raw.get("use_sep_token", method is None))
    return ClassifierConfig(num_labels=num_labels, id2label=id2label, activation=_activation(raw, source),
                            from_tokens=tokens, method=method, use_sep_token=bool(sep))


def _id2label(value: Any, source: str) -> dict[int, str]:
    """config.json's ``id2label`` (``{"0": "negative", ...}``) with integer keys.

    Raises:
        CheckpointError: not an object, or a key that is not an integer.
    """
    if not value:
        return {}
    if not isinstance(value, dict):
        raise CheckpointError(f"{source}: id2label must be an object of label ids to names (e.g. {{\"0\": "
                              f"\"negative\", \"1\": \"positive\"}}), got {type(value).__name__}")
    labels = {}
    for key, name in value.items():
        try:
            labels[int(key)] = str(name)
        except (TypeError, ValueError):
            raise CheckpointError(f"{source}: id2label's keys must be label ids (integers), got {key!r}") from None
    return labels


def _from_tokens(raw: dict[str, Any], source: str) -> tuple[str | None, tuple[str, ...] | None]:
    tokens = raw.get("classifier_from_token")
    method = raw.get("method")
    if raw.get("is_original_qwen3_reranker", False):
        if not isinstance(tokens, list) or len(tokens) != 2:
            raise CheckpointError(f"{source}: is_original_qwen3_reranker needs classifier_from_token with two "
                                  "tokens (Qwen3-Reranker: [\"no\", \"yes\"]); try loading the original Qwen3 "
                                  "Reranker with --hf-overrides as docs/pooling.md shows")
        method = "from_2_way_softmax"
    if method is None:
        return None, None
    if method not in METHODS:
        raise CheckpointError(f"{source}: method {method!r} is not supported; kvserve builds a classifier head from "
                              f"LM-head rows with {' or '.join(METHODS)}")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise CheckpointError(f"{source}: method {method!r} needs classifier_from_token, a list of tokens")
    if method == "from_2_way_softmax" and len(tokens) != 2:
        raise CheckpointError(f"{source}: from_2_way_softmax needs exactly two classifier_from_token, got {tokens}")
    return method, tuple(tokens)


def _activation(raw: dict[str, Any], source: str) -> Activation:
    problem = raw.get("problem_type") or ""
    if problem == "regression":
        return "identity"
    if problem == "single_label_classification":
        return "classify"
    if problem == "multi_label_classification":
        return "sigmoid"
    st = raw.get("sentence_transformers")
    name = st.get("activation_fn") if isinstance(st, dict) else None
    name = name or raw.get("sbert_ce_default_activation_function")
    if name is None:
        return "classify"
    if not str(name).startswith(_ACTIVATION_PREFIX):
        raise CheckpointError(f"{source}: activation function {name!r} is refused: only torch.nn.modules activations "
                              "load (vLLM's rule, for safety)")
    kind = _ST_ACTIVATIONS.get(str(name).rsplit(".", 1)[-1])
    if kind is None:
        raise CheckpointError(f"{source}: activation function {name!r} is not supported; kvserve applies Identity, "
                              "Sigmoid or Softmax")
    return kind
