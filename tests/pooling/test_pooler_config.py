"""``--runner`` / ``--convert`` / ``--task`` resolved as vLLM 0.32 does, and the pooling read from
a folder (sentence-transformers' files, else the architecture's default), with the refusals
naming what kvserve does not run."""

from __future__ import annotations

import json
import shlex
import shutil

import pytest

from kvserve.cli import build_parser
from kvserve.config import ModelConfig
from kvserve.engine.arg_utils import engine_config_from_args, model_from_args
from kvserve.errors import CheckpointError, ConfigError
from kvserve.pooling.config import resolve_pooler_config
from kvserve.testing.encoder_checkpoints import add_sentence_transformers


def _serve(command: str, model_dir):
    args = build_parser().parse_args(["serve", str(model_dir), *shlex.split(command)])
    return engine_config_from_args(model_from_args(args), args)


def _pooler(model_dir, runner="auto", convert="auto"):
    return resolve_pooler_config(ModelConfig(model=str(model_dir), runner=runner, convert=convert))


@pytest.mark.parametrize("command, runner", [("", "auto"), ("--runner pooling", "pooling"), ("--task embed", "pooling"),
                                             ("--runner generate", "generate"), ("--convert embed", "auto")])
def test_vllm_flags_land_in_the_model_config(tiny_llama, command, runner):
    config = _serve(command, tiny_llama)
    assert config.model.runner == runner
    assert config.model.convert == ("embed" if "convert" in command else "auto")


@pytest.mark.parametrize("command, named", [("--convert token_classify", "--convert"), ("--task classify", "--task"),
                                            ("--runner draft", "--runner"), ("--task score", "--task")])
def test_values_kvserve_does_not_run_are_refused_by_name(tiny_llama, command, named, capsys):
    with pytest.raises(SystemExit) as info:
        _serve(command, tiny_llama)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert named in err and "token-level pooling and plugins are not implemented" in err


def test_runner_resolution(tiny_llama, bert_cls, qwen3_last, encoder_factory):
    assert _pooler(tiny_llama) is None  # a decoder generates by default
    assert _pooler(tiny_llama, runner="pooling").pooling_type == "LAST"
    assert _pooler(tiny_llama, convert="embed").pooling_type == "LAST"  # --convert embed implies pooling
    assert _pooler(qwen3_last).pooling_type == "LAST"  # modules.json: a pooling model under --runner auto
    bare_bert = _pooler(encoder_factory("BertModel"))
    assert (bare_bert.pooling_type, bare_bert.use_activation, bare_bert.encoder_only) == ("CLS", True, True)
    assert _pooler(bert_cls).source == "sentence-transformers modules.json"
    with pytest.raises(ConfigError, match="does not support `--runner generate`"):
        _pooler(bert_cls, runner="generate")
    with pytest.raises(ConfigError, match="`--convert embed` to adapt it"):
        _pooler(tiny_llama, runner="pooling", convert="none")
    with pytest.raises(ConfigError, match="use it with `--runner pooling`"):
        _pooler(tiny_llama, runner="generate", convert="embed")


def test_sentence_transformers_fields(encoder_factory, tmp_path):
    folder = encoder_factory("BertModel", {"pooling": "mean", "normalize": False, "max_seq_length": 20,
                                           "do_lower_case": True}, matryoshka_dimensions=[16, 32, 64])
    config = _pooler(folder)
    assert (config.pooling_type, config.use_activation, config.max_seq_length, config.do_lower_case) == (
        "MEAN", False, 20, True)
    assert config.is_matryoshka and config.matryoshka_dimensions == (16, 32, 64) and config.hidden_size == 64


@pytest.mark.parametrize("pooling_config, message", [
    ({"pooling_mode_max_tokens": True}, "pooling mode max_tokens is not supported"),
    ({"pooling_mode": "weightedmean"}, "pooling mode weightedmean is not supported"),
    ({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": True}, "exactly one of cls, mean and lasttoken"),
    ({"pooling_mode": "mean", "include_prompt": False}, "include_prompt false"),
])
def test_pooling_modes_kvserve_does_not_run_are_refused(bert_cls, tmp_path, pooling_config, message):
    shutil.copytree(bert_cls, tmp_path, dirs_exist_ok=True)
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config))
    with pytest.raises(CheckpointError, match=message):
        _pooler(tmp_path)


def test_a_dense_module_is_refused_by_name(bert_cls, tmp_path):
    shutil.copytree(bert_cls, tmp_path, dirs_exist_ok=True)
    modules = json.loads((tmp_path / "modules.json").read_text())
    modules.insert(2, {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(CheckpointError, match="module '2' of type sentence_transformers.models.Dense is not supported"):
        _pooler(tmp_path)


def test_max_seq_length_caps_the_context(bert_cls, tmp_path):
    shutil.copytree(bert_cls, tmp_path, dirs_exist_ok=True)
    add_sentence_transformers(tmp_path, 64, pooling="cls", max_seq_length=24)
    from pooling_helpers import make_llm

    assert make_llm(tmp_path).llm_engine.max_model_len == 24
    with pytest.raises(ConfigError, match="exceeds the model's max_seq_length"):
        make_llm(tmp_path, max_model_len=64)


@pytest.mark.parametrize("kwargs, message", [
    ({"enable_lora": True}, "--enable-lora with --runner pooling"),
    ({"speculative_config": '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2}'},
     "--speculative-config with --runner pooling"),
])
def test_engine_features_pooling_does_not_use_are_refused(bert_cls, kwargs, message):
    from pooling_helpers import make_llm

    with pytest.raises(ConfigError, match=message):
        make_llm(bert_cls, **kwargs)


def test_kvserve_serve_start_up_checks_and_ready_line(bert_cls, tmp_path):
    from kvserve.api.launcher import check_model, ready_message
    from kvserve.api.settings import ServerSettings

    shutil.copytree(bert_cls, tmp_path, dirs_exist_ok=True)
    add_sentence_transformers(tmp_path, 64, pooling="cls", max_seq_length=24)
    arch, max_model_len = check_model(_serve("", tmp_path))  # what the launcher checks before loading
    assert (arch.architecture, max_model_len) == ("BertModel", 24)
    with pytest.raises(ConfigError, match="does not support `--runner generate`"):
        check_model(_serve("--runner generate", tmp_path))
    line = ready_message("emb", ServerSettings(), 1.0, pooling=True)
    assert "/v1/embeddings" in line and '"input": ' in line and "kvserve chat" not in line
