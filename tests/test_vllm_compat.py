"""`vllm serve` command lines, written here from vLLM's documentation, given to `kvserve serve`:
every flag lands in the configs with vLLM's meaning, or the start stops with one line naming the
flag and why (exit status 2). vLLM facts used: ``human_readable_int`` (1k = 1,000, 1K = 1,024,
no decimals with binary suffixes), ``--host`` unset = every interface, ``--served-model-name``
takes several names (the first is reported), ``--allowed-origins`` is a JSON list."""

from __future__ import annotations

import shlex

import pytest

from kvserve.api.settings import ServerSettings, settings_from_args
from kvserve.cli import build_parser
from kvserve.config import QuantizationConfig
from kvserve.engine.arg_utils import engine_config_from_args, engine_config_from_kwargs, model_from_args
from kvserve.generation_config import SamplingDefaults
from kvserve.metrics.wiring import observability_config_from_args
from kvserve.vllm_compat import FRONTEND_REFUSED_FLAGS, REFUSED_FLAGS


@pytest.fixture(autouse=True)
def no_key_env(monkeypatch):
    monkeypatch.delenv("KVSERVE_API_KEY", raising=False)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)


def configs(command: str, model_dir) -> tuple:
    """Parse ``vllm serve ...`` as ``kvserve serve ...`` (``MODEL`` = the tiny checkpoint)."""
    argv = shlex.split(command.replace("MODEL", str(model_dir)))
    assert argv[:2] == ["vllm", "serve"]
    args = build_parser().parse_args(["serve", *argv[2:]])
    model = model_from_args(args)
    return engine_config_from_args(model, args), settings_from_args(args), observability_config_from_args(args)


def refusal(command: str, model_dir, capsys) -> str:
    with pytest.raises(SystemExit) as info:
        configs(command, model_dir)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line
    return err


def test_quickstart_command_defaults(tiny_llama):
    engine, server, observability = configs("vllm serve MODEL", tiny_llama)
    assert engine.model.model == str(tiny_llama) and engine.model.max_model_len is None
    assert server.host == "0.0.0.0" and server.port == 8000 and server.api_keys == ()
    assert server.allowed_origins == ("*",) and server.root_path == "" and not server.disable_fastapi_docs
    assert observability.enable_log_requests is False and observability.log_stats_interval == 10.0


def test_openai_server_docs_command(tiny_llama):
    # docs.vllm.ai "OpenAI-Compatible Server": vllm serve NousResearch/Meta-Llama-3-8B-Instruct --dtype auto --api-key token-abc123
    engine, server, _ = configs("vllm serve MODEL --dtype auto --api-key token-abc123", tiny_llama)
    assert engine.model.dtype == "auto" and server.api_keys == ("token-abc123",) and server.api_key_env is None


def test_every_listed_flag_lands_in_the_configs(tiny_llama, tmp_path):
    template = tmp_path / "template.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    key.write_text("k"), cert.write_text("c")
    engine, server, observability = configs(
        f"vllm serve --model MODEL --served-model-name my-model alias-b --trust-remote-code "
        f"--tensor-parallel-size 1 -tp 1 --enforce-eager --disable-log-requests --disable-log-stats "
        f"--generation-config vllm --override-generation-config '{{\"temperature\": 0.5, \"top_p\": 0.9}}' "
        f"--response-role assistant --root-path /llm/ --allowed-origins '[\"https://a.example\"]' "
        f"--allowed-methods '[\"GET\", \"POST\"]' --allowed-headers '[\"Authorization\"]' --allow-credentials "
        f"--ssl-keyfile {key} --ssl-certfile {cert} --max-model-len 4k --max-num-batched-tokens 8K "
        f"--kv-cache-memory-bytes 2G --dtype half --chat-template {template} --host 10.1.2.3 --port 8080 "
        f"--uvicorn-log-level warning --disable-fastapi-docs --enable-request-id-headers "
        f"--max-num-seqs 128 --block-size 32 --seed 42 --no-enable-prefix-caching --kv-cache-dtype auto "
        f"--load-format safetensors --max-logprobs 20 --pipeline-parallel-size 1 --no-enable-lora", tiny_llama)
    model = engine.model
    assert engine.parallel.tensor_parallel_size == 1
    assert (model.model, model.served_model_name, model.dtype, model.seed) == (str(tiny_llama), "my-model", "float16", 42)
    assert model.max_model_len == 4000 and engine.scheduler.max_num_batched_tokens == 8192
    assert engine.cache.kv_cache_memory_bytes == 2 * 2**30 and engine.cache.block_size == 32
    assert engine.cache.enable_prefix_caching is False and engine.scheduler.max_num_seqs == 128
    assert model.sampling_defaults == SamplingDefaults(temperature=0.5, top_p=0.9,
                                                       source="vllm + --override-generation-config")
    assert server.served_model_name == "my-model" and server.served_model_aliases == ("alias-b",)
    assert server.served_model_names == ("my-model", "alias-b")
    assert (server.host, server.port, server.log_level) == ("10.1.2.3", 8080, "warning")
    assert server.root_path == "/llm" and server.response_role == "assistant"
    assert server.allowed_origins == ("https://a.example",) and server.allowed_methods == ("GET", "POST")
    assert server.allowed_headers == ("Authorization",) and server.allow_credentials is True
    assert (server.ssl_keyfile, server.ssl_certfile, server.scheme) == (str(key), str(cert), "https")
    assert server.chat_template == template.read_text() and server.disable_fastapi_docs is True
    assert observability.enable_log_requests is False and observability.log_stats_interval == 0.0


@pytest.mark.parametrize("value, tokens", [("4096", 4096), ("4k", 4000), ("4K", 4096), ("25.6k", 25600),
                                           ("1m", 1_000_000), ("1M", 1_048_576), ("2g", 2 * 10**9)])
def test_max_model_len_suffixes_as_vllm(tiny_llama, value, tokens):
    engine, _, _ = configs(f"vllm serve MODEL --max-model-len {value}", tiny_llama)
    assert engine.model.max_model_len == tokens


@pytest.mark.parametrize("command, flag, words", [
    ("vllm serve MODEL --pipeline-parallel-size 2", "--pipeline-parallel-size/-pp",
     "'2' is not supported: kvserve runs tensor parallelism (-tp, its experts split whole with --enable-expert-parallel)"),
    ("vllm serve MODEL -pp 2", "--pipeline-parallel-size/-pp", "(accepted: 1)"),
    ("vllm serve MODEL --quantization bitsandbytes", "--quantization/-q",
     "'bitsandbytes' is not supported: kvserve quantizes a float checkpoint at load"),
    ("vllm serve MODEL -q fp8", "--quantization/-q", "(accepted: int8, int4, gptq, awq, mxfp4)"),
    ("vllm serve MODEL --kv-cache-dtype fp8_inc", "--kv-cache-dtype", "other dtypes are not implemented"),
    ("vllm serve MODEL --enable-lora --fully-sharded-loras", "--fully-sharded-loras", "no pipeline"),
    ("vllm serve MODEL --enable-lora --lora-extra-vocab-size 256", "--lora-extra-vocab-size", "cannot add tokens"),
    ("vllm serve MODEL --enable-auto-tool-choice --tool-call-parser hermes_xml", "--tool-call-parser",
     "unknown tool call parser 'hermes_xml'; allowed: hermes, llama3_json, mistral, openai, pythonic"),
    ("vllm serve MODEL --reasoning-parser deepseek_v3", "--reasoning-parser",
     "unknown reasoning parser 'deepseek_v3'; allowed: deepseek_r1, openai_gptoss, qwen3"),
    ("vllm serve MODEL --tool-parser-plugin my_parser.py", "--tool-parser-plugin", "parser plugins are not supported"),
    ("vllm serve MODEL --revision main", "--revision", "a local folder has no revisions"),
    ("vllm serve MODEL --max-model-len 1.5K", "--max-model-len", "did you mean 1.5k?"),
    ("vllm serve MODEL --swap-space 16", "--swap-space", "recomputation"),
    ("vllm serve MODEL --load-format pt", "--load-format", "safetensors weights only"),
    ("vllm serve MODEL --limit-mm-per-prompt '{\"image\": 2}'", "--limit-mm-per-prompt", "text-only"),
    ("vllm serve MODEL --compilation-config '{\"level\": 3}'", "--compilation-config/-O", "runs eagerly"),
    ("vllm serve MODEL --data-parallel-size-local 2", "--data-parallel-size-local/-dpl",
     "no multi-node data parallelism"),
])
def test_unimplemented_flags_are_refused_by_name(tiny_llama, capsys, command, flag, words):
    err = refusal(command, tiny_llama, capsys)
    assert err.startswith(f"kvserve serve: error: argument {flag}: "), err
    assert words in err


def test_config_level_refusals_are_one_line(tiny_llama, capsys, monkeypatch):
    for command, message in [
        ("vllm serve MODEL --api-key ''", "--api-key is empty"),
        ("vllm serve MODEL --ssl-keyfile key.pem", "--ssl-keyfile and --ssl-certfile go together"),
        ("vllm serve MODEL --model other", "the model is given twice"),
        ("vllm serve MODEL --override-generation-config '{\"temp\": 1}'", "unknown key(s) temp"),
        ("vllm serve MODEL --enable-auto-tool-choice", "--enable-auto-tool-choice requires --tool-call-parser"),
        ("vllm serve MODEL --speculative-config '{\"method\": \"eagle\", \"model\": \"yuhuili/EAGLE-LLaMA3-Instruct-8B\", "
         "\"num_speculative_tokens\": 5}'", "method 'eagle' is not implemented; kvserve speculates with ngram or draft_model"),
        ("vllm serve MODEL --speculative-config '{\"model\": \"ngram\", \"num_speculative_tokens\": 5, "
         "\"draft_tensor_parallel_size\": 2}'", "draft_tensor_parallel_size is not supported"),
        ("vllm serve MODEL --speculative-config '{\"method\": \"ngram\"}'", "num_speculative_tokens is required"),
    ]:
        with pytest.raises(ValueError) as info:
            configs(command, tiny_llama)
        assert message in str(info.value)


def test_speculative_config_as_in_vllms_docs(tiny_llama):
    # docs.vllm.ai "Speculative Decoding", n-gram: --speculative-config '{"method": "ngram",
    # "num_speculative_tokens": 5, "prompt_lookup_max": 4}'; the older form names the model "ngram".
    engine, _, _ = configs("vllm serve MODEL --speculative-config '{\"method\": \"ngram\", "
                           "\"num_speculative_tokens\": 5, \"prompt_lookup_max\": 4}'", tiny_llama)
    spec = engine.speculative
    assert (spec.method, spec.num_speculative_tokens, spec.prompt_lookup_max, spec.prompt_lookup_min) == ("ngram", 5, 4, 4)
    older, _, _ = configs("vllm serve MODEL --speculative-config '{\"model\": \"ngram\", "
                          "\"num_speculative_tokens\": 3}'", tiny_llama)
    assert (older.speculative.method, older.speculative.prompt_lookup_max, older.speculative.prompt_lookup_min) == (
        "ngram", 5, 5)
    draft, _, _ = configs(f"vllm serve MODEL --speculative-config '{{\"model\": \"{tiny_llama}\", "
                          "\"num_speculative_tokens\": 2}'", tiny_llama)
    assert (draft.speculative.method, draft.speculative.model) == ("draft_model", str(tiny_llama))
    assert configs("vllm serve MODEL", tiny_llama)[0].speculative is None


def test_tool_and_reasoning_flags(tiny_llama):
    # vLLM's tool-calling docs: vllm serve MODEL --enable-auto-tool-choice --tool-call-parser hermes;
    # its reasoning docs: --reasoning-parser deepseek_r1.
    _, server, _ = configs("vllm serve MODEL --enable-auto-tool-choice --tool-call-parser hermes "
                           "--reasoning-parser deepseek_r1 --exclude-tools-when-tool-choice-none "
                           "--default-chat-template-kwargs '{\"enable_thinking\": false}'", tiny_llama)
    assert (server.enable_auto_tool_choice, server.tool_call_parser, server.reasoning_parser) == (
        True, "hermes", "deepseek_r1")
    assert server.exclude_tools_when_tool_choice_none and server.default_chat_template_kwargs == {
        "enable_thinking": False}
    _, plain, _ = configs("vllm serve MODEL --tool-call-parser pythonic --reasoning-parser ''", tiny_llama)
    assert (plain.enable_auto_tool_choice, plain.tool_call_parser, plain.reasoning_parser) == (False, "pythonic", None)
    with pytest.raises(ValueError, match="reasoning_parser applies to the OpenAI server"):
        engine_config_from_kwargs(str(tiny_llama), reasoning_parser="qwen3")


def test_api_keys_from_flags_and_both_environment_variables(tiny_llama, monkeypatch):
    _, server, _ = configs("vllm serve MODEL --api-key k1 k2,k3", tiny_llama)
    assert server.api_keys == ("k1", "k2", "k3")
    monkeypatch.setenv("VLLM_API_KEY", "from-vllm")
    _, server, _ = configs("vllm serve MODEL", tiny_llama)
    assert server.api_keys == ("from-vllm",) and server.api_key_env == "VLLM_API_KEY"
    monkeypatch.setenv("KVSERVE_API_KEY", "from-kvserve")
    _, server, _ = configs("vllm serve MODEL --api-key k1", tiny_llama)
    assert server.api_keys == ("k1", "from-kvserve", "from-vllm") and server.api_key_env == "KVSERVE_API_KEY"


def test_no_op_flags_and_accepted_values_change_nothing(tiny_llama):
    plain = configs("vllm serve MODEL", tiny_llama)
    same = configs("vllm serve MODEL --trust-remote-code --disable-custom-all-reduce "
                   "--disable-cascade-attn --disable-frontend-multiprocessing --enable-request-id-headers "
                   "-tp 1 -pp 1 -dp 1 --kv-cache-dtype auto --quantization None --tokenizer-mode auto "
                   "--no-enable-lora --no-enable-expert-parallel --api-server-count 1", tiny_llama)
    assert same == plain
    eager = configs("vllm serve MODEL --enforce-eager", tiny_llama)[0]
    assert eager.model.enforce_eager and not plain[0].model.enforce_eager  # the modules, not the C++ layer loop


def test_quantization_int8_int4_are_accepted(tiny_llama):
    engine, _, _ = configs("vllm serve MODEL --quantization int8", tiny_llama)
    assert engine.model.quantization == QuantizationConfig("int8", 32, False)
    engine, _, _ = configs("vllm serve MODEL -q int4 --quantization-group-size 128 --quantize-lm-head", tiny_llama)
    assert engine.model.quantization == QuantizationConfig("int4", 128, True)
    assert engine.model.quantization.label == "int4-g128+lm_head"
    assert configs("vllm serve MODEL", tiny_llama)[0].model.quantization.label is None
    with pytest.raises(ValueError, match="--quantize-lm-head needs --quantization int8 or int4"):
        configs("vllm serve MODEL --quantize-lm-head", tiny_llama)


def test_offline_llm_keywords_are_refused_the_same_way(tiny_llama):
    assert engine_config_from_kwargs(str(tiny_llama), tensor_parallel_size=1, quantization=None,
                                     enforce_eager=True).model.model == str(tiny_llama)
    with pytest.raises(ValueError, match="quantization='fp8': 'fp8' is not supported: kvserve quantizes"):
        engine_config_from_kwargs(str(tiny_llama), quantization="fp8")
    with pytest.raises(ValueError, match="--quantization awq: .* has no quantization_config in config.json"):
        engine_config_from_kwargs(str(tiny_llama), quantization="awq")
    with pytest.raises(ValueError, match="fully_sharded_loras=True: not supported: kvserve runs tensor parallelism"):
        engine_config_from_kwargs(str(tiny_llama), enable_lora=True, fully_sharded_loras=True)
    lora = engine_config_from_kwargs(str(tiny_llama), enable_lora=True, max_loras=4, max_cpu_loras=8).lora
    assert (lora.max_loras, lora.max_lora_rank, lora.max_cpu_loras, lora.lora_dtype) == (4, 16, 8, "auto")
    config = engine_config_from_kwargs(str(tiny_llama), quantization="int4", quantization_group_size=64)
    assert config.model.quantization == QuantizationConfig("int4", 64, False)
    config = engine_config_from_kwargs(str(tiny_llama), override_generation_config={"temperature": 0.3})
    assert config.model.sampling_defaults.temperature == 0.3


def test_refused_table_has_unique_flags_and_reasons():
    flags = [flag for refused in (*REFUSED_FLAGS, *FRONTEND_REFUSED_FLAGS) for flag in refused.flags]
    assert len(flags) == len(set(flags))
    parser_flags = {opt for action in build_parser()._subparsers._group_actions[0].choices["serve"]._actions
                    for opt in action.option_strings}
    assert set(flags) <= parser_flags
    assert all(refused.reason for refused in (*REFUSED_FLAGS, *FRONTEND_REFUSED_FLAGS))


def test_help_groups_flags_as_vllm(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    out = capsys.readouterr().out
    positions = [out.index(f"\n{title}:\n") for title in
                 ("ModelConfig", "LoadConfig", "ParallelConfig", "CacheConfig", "SchedulerConfig", "Frontend")]
    assert positions == sorted(positions)
    assert "--swap-space" not in out  # refused flags without an accepted value stay out of --help
    assert "--quantization" in out and "accepted: int8, int4" in out
    assert "--tensor-parallel-size" in out and "--pipeline-parallel-size" in out and "accepted: 1" in out


def test_server_settings_default_is_loopback_for_embedders():
    assert ServerSettings().host == "127.0.0.1"


def test_docs_table_lists_every_refused_flag():
    from pathlib import Path

    doc = (Path(__file__).parents[1] / "docs" / "vllm_compat.md").read_text()
    for refused in (*REFUSED_FLAGS, *FRONTEND_REFUSED_FLAGS):
        row = "| " + " / ".join(f"`{flag}`" for flag in refused.flags) + " |"
        assert row in doc and refused.reason in doc, refused.flags


def test_the_model_argument_as_given_is_also_a_served_name():
    """vLLM serves ``--model /models/qwen`` as ``/models/qwen``; kvserve reports ``qwen`` and
    accepts the path too, unless ``--served-model-name`` chose the names."""
    from kvserve.api.settings import ServerSettings, with_model_argument_name

    plain = with_model_argument_name(ServerSettings(), "/models/qwen", "qwen")
    assert plain.served_model_name is None and plain.served_model_aliases == ("/models/qwen",)
    assert with_model_argument_name(ServerSettings(), "qwen", "qwen").served_model_aliases == ()
    assert with_model_argument_name(ServerSettings(), None, "kvserve-builtin").served_model_aliases == ()
    named = ServerSettings(served_model_name="mine", served_model_aliases=("other",))
    assert with_model_argument_name(named, "/models/qwen", "qwen") == named


def test_serve_help_imports_neither_torch_nor_the_server():
    """``kvserve serve --help`` answers in well under a second because it imports no heavy module
    (torch takes seconds to import on a 2-core machine)."""
    import subprocess
    import sys

    code = ("import sys\nfrom kvserve.cli import main\ntry:\n    main(['serve', '--help'])\nexcept SystemExit:\n    pass\n"
            "heavy = sorted(m for m in ('torch', 'transformers', 'fastapi', 'uvicorn') if m in sys.modules)\n"
            "print('HEAVY', heavy)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "--max-model-len" in result.stdout and "HEAVY []" in result.stdout, result.stdout[-500:] + result.stderr
