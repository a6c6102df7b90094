"""`kvserve serve` start-up mistakes end with one actionable `kvserve: error:` line and status 2,
before anything is served; "serving ..." is printed only once the model is loaded and the port
listens, with a curl hint whose key header expands in a shell."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time

import httpx
import pytest
import torch
from safetensors.torch import load_file

from kvserve.api.launcher import ready_message
from kvserve.api.settings import ServerSettings
from kvserve.cli import main
from loopback import free_port

SUPPORTED = ("BertForSequenceClassification, BertModel, DeepseekV2ForCausalLM, DeepseekV3ForCausalLM, "
             "Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3ForConditionalGeneration, GptOssForCausalLM, "
             "GraniteForCausalLM, LlamaForCausalLM, LlamaForSequenceClassification, MistralForCausalLM, "
             "MistralForSequenceClassification, MixtralForCausalLM, ModernBertModel, "
             "Olmo2ForCausalLM, Phi3ForCausalLM, Qwen2ForCausalLM, Qwen2ForSequenceClassification, Qwen2MoeForCausalLM, "
             "Qwen3ForCausalLM, Qwen3ForSequenceClassification, Qwen3MoeForCausalLM, RobertaForSequenceClassification, "
             "RobertaModel, SmolLM3ForCausalLM, XLMRobertaForSequenceClassification, XLMRobertaModel")


@pytest.fixture(autouse=True)
def no_key_env(monkeypatch):
    monkeypatch.delenv("KVSERVE_API_KEY", raising=False)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)


def serve_error(capsys, *argv: str) -> str:
    """Run ``kvserve serve ARGV`` in this process; it must fail with one stderr line, serving nothing."""
    status = main(["serve", "--host", "127.0.0.1", "--port", str(free_port()), "--log-level", "warning", *argv])
    out, err = capsys.readouterr()
    assert status == 2 and "serving" not in out, (out, err)
    lines = [line for line in err.splitlines() if line.startswith("kvserve: error: ")]
    assert len(lines) == 1, err
    return lines[0].removeprefix("kvserve: error: ")


def hf_folder(tmp_path, name: str, config) -> str:
    folder = tmp_path / name
    config.save_pretrained(folder)
    return str(folder)


def test_unsupported_architectures_are_named_with_the_supported_list(tmp_path, capsys):
    from transformers import GPT2Config, GPTNeoXConfig

    gpt2 = hf_folder(tmp_path, "gpt2", GPT2Config(n_layer=1, n_embd=32, n_head=2, architectures=["GPT2LMHeadModel"]))
    assert serve_error(capsys, gpt2) == (
        f"{gpt2}: architecture GPT2LMHeadModel (model_type gpt2) is not supported; kvserve runs {SUPPORTED}")
    neox = hf_folder(tmp_path, "neox", GPTNeoXConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                                                     intermediate_size=64, architectures=["GPTNeoXForCausalLM"]))
    assert serve_error(capsys, "--model", neox) == (
        f"{neox}: architecture GPTNeoXForCausalLM (model_type gpt_neox) is not supported; kvserve runs {SUPPORTED}")


def test_bin_only_weights_say_how_to_convert(tiny_llama, tmp_path, capsys):
    folder = tmp_path / "bin-only"
    shutil.copytree(tiny_llama, folder)
    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    assert serve_error(capsys, str(folder)) == (
        f"{folder} holds pytorch_model.bin and no safetensors weights; kvserve reads safetensors only. Convert "
        f"once with transformers: python -c \"from transformers import AutoModelForCausalLM as M; "
        f"M.from_pretrained('{folder}').save_pretrained('{folder}')\"")


def test_too_small_kv_budget_names_the_minimum(tiny_llama, capsys):
    # tiny_llama: 2 layers x 2 KV heads x head_dim 16, float32: a 16-token block holds
    # 2 (K and V) * 2 * 16 * 2 * 16 * 4 bytes = 8 KiB; 256 tokens need 16 blocks = 128 KiB.
    message = serve_error(capsys, str(tiny_llama), "--dtype", "float32", "--max-model-len", "256",
                          "--kv-cache-memory-bytes", "20KiB")
    assert message == ("--kv-cache-memory-bytes 20480B holds 2 blocks of 16 tokens; one request of "
                       "max_model_len=256 needs 16 blocks (0.1 MiB): give --kv-cache-memory-bytes 1MiB or more, "
                       "or lower --max-model-len")
    assert main(["serve", str(tiny_llama), "--dtype", "float32", "--max-model-len", "256",
                 "--kv-cache-memory-bytes", "1MiB", "--port", "0", "--host", "256.0.0.1"]) == 2  # passes the check
    assert "cannot listen on 256.0.0.1:0" in capsys.readouterr().err


def test_port_already_taken_fails_before_loading(tiny_llama, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        status = main(["serve", str(tiny_llama), "--host", "127.0.0.1", "--port", str(port)])
        out, err = capsys.readouterr()
    assert status == 2 and "serving" not in out and "loading" not in err
    assert err.strip().splitlines()[-1] == (f"kvserve: error: port {port} is already in use on 127.0.0.1 (another "
                                           "server listens there); stop it or choose another --port")


def test_hub_id_says_kvserve_loads_folders_and_how_to_download(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert serve_error(capsys, "Qwen/Qwen2.5-0.5B") == (
        "'Qwen/Qwen2.5-0.5B' is not a folder here; kvserve loads local model folders and downloads nothing. If it "
        "is a Hugging Face Hub id, download it first: hf download Qwen/Qwen2.5-0.5B --local-dir ./Qwen2.5-0.5B "
        "(pip install huggingface_hub), then: kvserve serve ./Qwen2.5-0.5B")


def test_empty_api_key_is_refused(tiny_llama, capsys):
    assert serve_error(capsys, str(tiny_llama), "--api-key", "") == (
        "--api-key is empty; give a key, or leave the flag out to serve without authentication")


def test_try_hint_expands_the_key_in_a_shell():
    settings = ServerSettings(host="0.0.0.0", port=8123, api_keys=("s3cret",), api_key_env="KVSERVE_API_KEY")
    message = ready_message("tiny", settings, 1.25)
    first, hint, chat = message.splitlines()
    assert first == "kvserve: serving 'tiny' at http://0.0.0.0:8123/v1 (all interfaces) (ready in 1.2 s)"
    assert chat == "  chat: kvserve chat --base-url http://localhost:8123/v1"
    command = hint.removeprefix("  try:  ")
    words = subprocess.run(["bash", "-c", f"printf '%s\\n' {command.removeprefix('curl ')}"],
                           env={**os.environ, "KVSERVE_API_KEY": "s3cret"}, capture_output=True, text=True,
                           check=True).stdout.splitlines()
    assert "Authorization: Bearer s3cret" in words and words[0] == "http://localhost:8123/v1/completions"
    vllm_env = ready_message("tiny", ServerSettings(api_keys=("k",), api_key_env="VLLM_API_KEY"), 1.0)
    assert '-H "Authorization: Bearer $VLLM_API_KEY"' in vllm_env


def test_a_loading_server_prints_progress_until_it_is_ready(capsys):
    """From the command's start, a line every PROGRESS_INTERVAL_S (here 10 ms) naming the stage,
    then the ready message once; no line after it."""
    import io

    from kvserve.api.launcher import _Announcer, _LoadFailure
    from kvserve.start_progress import PROGRESS_INTERVAL_S, StartProgress

    lines = io.StringIO()
    progress = StartProgress("starting the server", interval=0.01, out=lines)

    class Loading:  # loaded once three loading lines were printed
        def wait_until_loaded(self, timeout=None):
            time.sleep(min(timeout or 0, 0.01))
            return not self.loading

        @property
        def loading(self):
            return lines.getvalue().count("kvserve: loading tiny: ") < 3

    _Announcer("tiny", ServerSettings(), progress, Loading(), _LoadFailure())._wait_and_print()
    printed = lines.getvalue().splitlines()
    assert all(line.startswith("kvserve: ") and " s, " in line and "GiB in memory" in line for line in printed)
    assert sum(line.startswith("kvserve: loading tiny: ") for line in printed) >= 3
    assert capsys.readouterr().out.startswith("kvserve: serving 'tiny'")
    time.sleep(0.05)
    assert lines.getvalue().splitlines() == printed and PROGRESS_INTERVAL_S <= 2.0  # stopped at ready


@pytest.mark.slow
def test_serving_is_printed_once_loaded_and_listening(tiny_llama):
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "kvserve.cli", "serve", "--model", str(tiny_llama), "--host", "127.0.0.1",
         "--port", str(port), "--max-model-len", "256", "--num-gpu-blocks-override", "64", "--log-level", "warning",
         "--served-model-name", "first", "second", "--cpu-threads", "1"],
        env={**os.environ, "VLLM_API_KEY": "vk"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()  # blocks until the ready message
        assert line.startswith(f"kvserve: serving 'first' at http://127.0.0.1:{port}/v1 (ready in "), line
        health = httpx.get(f"http://127.0.0.1:{port}/health")
        assert health.status_code == 200  # listening and loaded when announced
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": "Bearer vk"}).json()
        assert [card["id"] for card in models["data"]] == ["first", "second"]
        assert '-H "Authorization: Bearer $VLLM_API_KEY"' in process.stdout.readline()
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert process.returncode == 0, process.stderr.read()[-3000:]
