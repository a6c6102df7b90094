"""What a classifier's config.json (with ``--hf-overrides``) says: labels, vLLM's activation rules,
heads from LM-head rows, the pair rule; and how ``--runner`` / ``--convert classify`` resolve a
classifier, with the refusals naming what kvserve does not run."""

from __future__ import annotations

import json
import shlex
import shutil

import pytest

from kvserve.cli import build_parser
from kvserve.config import ModelConfig
from kvserve.engine.arg_utils import engine_config_from_args, model_from_args
from kvserve.errors import CheckpointError, ConfigError
from kvserve.model.hf_overrides import apply_hf_overrides, parse_hf_overrides, read_config_json
from kvserve.pooling.classifier_config import read_classifier_config
from kvserve.pooling.config import resolve_pooler_config
from kvserve.testing.reranker_checkpoints import QWEN3_RERANKER_OVERRIDES


def _pooler(model_dir, runner="auto", convert="auto", **overrides):
    return resolve_pooler_config(ModelConfig(model=str(model_dir), runner=runner, convert=convert,
                                             hf_overrides=overrides))


def test_hf_overrides_replace_flat_values_and_merge_objects(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["A"], "rope_scaling": {"type": "linear",
                                                                                              "factor": 2.0}}))
    merged = read_config_json(tmp_path, {"architectures": ["B"], "rope_scaling": {"factor": 4.0}, "new": 1})
    assert merged == {"architectures": ["B"], "rope_scaling": {"type": "linear", "factor": 4.0}, "new": 1}
    assert apply_hf_overrides({"a": 1}, None) == {"a": 1}
    assert parse_hf_overrides('{"is_original_qwen3_reranker": true}') == {"is_original_qwen3_reranker": True}
    assert parse_hf_overrides(None) == {} and parse_hf_overrides({"a": 1}) == {"a": 1}
    for bad in ("{not json", "[1, 2]"):
        with pytest.raises(ValueError, match="--hf-overrides must be a JSON object"):
            parse_hf_overrides(bad)


def test_the_flag_lands_in_the_model_config(tiny_qwen3):
    command = f"--runner pooling --hf-overrides {shlex.quote(json.dumps(QWEN3_RERANKER_OVERRIDES))}"
    args = build_parser().parse_args(["serve", str(tiny_qwen3), *shlex.split(command)])
    config = engine_config_from_args(model_from_args(args), args)
    assert config.model.hf_overrides == QWEN3_RERANKER_OVERRIDES and config.model.runner == "pooling"
    args = build_parser().parse_args(["serve", str(tiny_qwen3), "--convert", "classify"])
    assert engine_config_from_args(model_from_args(args), args).model.convert == "classify"


@pytest.mark.parametrize("raw, expected", [
    ({"id2label": {"0": "LABEL_0"}}, (1, {0: "LABEL_0"}, "classify", None, None, True)),
    ({"id2label": {"0": "neg", "1": "neu", "2": "pos"}}, (3, {0: "neg", 1: "neu", 2: "pos"}, "classify", None, None,
                                                         True)),
    ({}, (2, {}, "classify", None, None, True)),  # transformers' default: two labels
    ({"num_labels": 1}, (1, {}, "classify", None, None, True)),
    ({"problem_type": "regression"}, (2, {}, "identity", None, None, True)),
    ({"problem_type": "multi_label_classification"}, (2, {}, "sigmoid", None, None, True)),
    ({"sentence_transformers": {"activation_fn": "torch.nn.modules.linear.Identity"}},
     (2, {}, "identity", None, None, True)),
    ({"sbert_ce_default_activation_function": "torch.nn.modules.activation.Sigmoid"},
     (2, {}, "classify", None, None, True)),
    ({"classifier_from_token": ["no", "yes"], "is_original_qwen3_reranker": True},
     (1, {}, "classify", ("no", "yes"), "from_2_way_softmax", False)),
    ({"classifier_from_token": ["a", "b", "c"], "method": "no_post_processing"},
     (3, {}, "classify", ("a", "b", "c"), "no_post_processing", False)),
    ({"classifier_from_token": ["no", "yes"], "method": "from_2_way_softmax", "use_sep_token": True},
     (1, {}, "classify", ("no", "yes"), "from_2_way_softmax", True)),
    ({"use_pad_token": False, "use_sep_token": True}, (2, {}, "classify", None, None, False)),
])
def test_classifier_config_follows_vllm(raw, expected):
    config = read_classifier_config(raw)
    assert (config.num_labels, config.id2label, config.activation, config.from_tokens, config.method,
            config.use_sep_token) == expected


@pytest.mark.parametrize("raw, message", [
    ({"is_original_qwen3_reranker": True, "classifier_from_token": ["yes"]}, "needs classifier_from_token with two"),
    ({"is_original_qwen3_reranker": True}, "needs classifier_from_token with two"),
    ({"method": "from_3_way", "classifier_from_token": ["a"]}, "method 'from_3_way' is not supported"),
    ({"method": "no_post_processing"}, "needs classifier_from_token"),
    ({"method": "from_2_way_softmax", "classifier_from_token": ["a", "b", "c"]}, "exactly two"),
    ({"sbert_ce_default_activation_function": "os.system"}, "only torch.nn.modules activations load"),
    ({"sentence_transformers": {"activation_fn": "torch.nn.modules.activation.Tanh"}}, "Identity, Sigmoid or Softmax"),
])
def test_classifier_fields_kvserve_does_not_run_are_refused(raw, message):
    with pytest.raises(CheckpointError, match=message):
        read_classifier_config(raw)


def test_runner_and_convert_resolve_classifiers(bert_cross_encoder, xlmr_cross_encoder, qwen3_reranker, bert_cls,
                                                tiny_qwen3):
    bert = _pooler(bert_cross_encoder)  # --runner auto: a classifier pools
    assert (bert.task, bert.pooling_type, bert.architecture, bert.token_types, bert.encoder_only) == (
        "classify", "CLS", "BertForSequenceClassification", True, True)
    assert bert.classifier.num_labels == 1 and "1 label (classify activation)" in bert.describe()
    xlmr = _pooler(xlmr_cross_encoder)
    assert (xlmr.task, xlmr.pooling_type, xlmr.token_types) == ("classify", "CLS", False)
    reranker = _pooler(qwen3_reranker, **QWEN3_RERANKER_OVERRIDES)
    assert (reranker.task, reranker.pooling_type, reranker.architecture) == (
        "classify", "LAST", "Qwen3ForSequenceClassification")
    assert (reranker.classifier.num_labels, reranker.classifier.use_sep_token) == (1, False)
    converted = _pooler(tiny_qwen3, runner="pooling", convert="classify")
    assert (converted.task, converted.architecture, converted.pooling_type) == (
        "classify", "Qwen3ForSequenceClassification", "LAST")
    assert _pooler(tiny_qwen3, convert="classify").task == "classify"  # --convert classify implies pooling
    with pytest.raises(ConfigError, match="does not support `--runner generate`"):
        _pooler(bert_cross_encoder, runner="generate")
    with pytest.raises(ConfigError, match="does not support `--runner generate`"):
        _pooler(qwen3_reranker, runner="generate", **QWEN3_RERANKER_OVERRIDES)
    with pytest.raises(ConfigError, match="--convert classify adapts a model to pooling"):
        _pooler(tiny_qwen3, runner="generate", convert="classify")
    with pytest.raises(ConfigError, match="BertModel has no sequence-classification form"):
        _pooler(bert_cls, convert="classify")
    with pytest.raises(ConfigError, match="is a sequence classifier"):
        _pooler(bert_cross_encoder, convert="embed")


def test_a_cross_encoder_folder_of_sentence_transformers_pools_by_its_architecture(bert_cross_encoder, tmp_path):
    """sentence-transformers' CrossEncoder writes a modules.json without a Pooling module."""
    shutil.copytree(bert_cross_encoder, tmp_path, dirs_exist_ok=True)
    (tmp_path / "modules.json").write_text(json.dumps([{"idx": 0, "name": "0", "path": "",
                                                        "type": "sentence_transformers.base.modules.Transformer"}]))
    assert _pooler(tmp_path).pooling_type == "CLS"


def test_tensor_parallel_refuses_hf_overrides(qwen3_reranker):
    from kvserve.config import EngineConfig, ParallelConfig
    from kvserve.distributed.shard import check_parallel_options

    config = EngineConfig(model=ModelConfig(model=str(qwen3_reranker), hf_overrides={"x": 1}),
                          parallel=ParallelConfig(tensor_parallel_size=2))
    with pytest.raises(ConfigError, match="with --hf-overrides is not supported"):
        check_parallel_options(config)


def test_start_up_checks_and_ready_line(qwen3_reranker):
    from kvserve.api.launcher import check_model, ready_message
    from kvserve.api.settings import ServerSettings

    command = f"--runner pooling --hf-overrides {shlex.quote(json.dumps(QWEN3_RERANKER_OVERRIDES))}"
    args = build_parser().parse_args(["serve", str(qwen3_reranker), *shlex.split(command)])
    arch, _ = check_model(engine_config_from_args(model_from_args(args), args))
    assert arch.architecture == "Qwen3ForSequenceClassification"  # the checks read config.json with the overrides
    rerank = ready_message("rr", ServerSettings(), 1.0, pooling="rerank")
    assert "/rerank " in rerank and '"query": ' in rerank and '"documents": ' in rerank
    assert "/classify " in ready_message("cls", ServerSettings(), 1.0, pooling="classify")
    assert "/v1/embeddings " in ready_message("emb", ServerSettings(), 1.0, pooling="embeddings")
    assert "/v1/completions " in ready_message("gen", ServerSettings(), 1.0)
