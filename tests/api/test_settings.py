"""Server settings from flags and the environment; API-key parsing and checking."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
from starlette.requests import Request

from kvserve.api.auth import ANONYMOUS_KEY, authenticate
from kvserve.api.errors import APIError
from kvserve.api.server_args import add_server_args
from kvserve.api.settings import ServerSettings, parse_api_keys, settings_from_args


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_server_args(parser)
    return parser.parse_args(argv)


def test_api_keys_repeatable_comma_and_env():
    assert parse_api_keys(["a,b", " c ", "a"], "d, e,") == ("a", "b", "c", "d", "e")
    assert parse_api_keys([], None) == ()


def test_settings_from_args(monkeypatch, tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages[0]['content'] }}")
    monkeypatch.setenv("KVSERVE_API_KEY", "env-key")
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    settings = settings_from_args(parse([
        "--port", "9000", "--api-key", "k1", "--api-key", "k2,k3",
        "--chat-template", str(template), "--requests-per-minute", "30", "--tokens-per-minute", "1000",
        "--max-concurrent-requests", "4", "--shutdown-timeout", "5", "--max-request-body-bytes", "1024",
        "--header-read-timeout", "2", "--body-read-timeout", "3", "--timeout-keep-alive", "7",
        "--disable-uvicorn-access-log"]))
    assert settings == ServerSettings(
        host="0.0.0.0", port=9000, api_keys=("k1", "k2", "k3", "env-key"), api_key_env="KVSERVE_API_KEY",
        chat_template="{{ messages[0]['content'] }}", requests_per_minute=30, tokens_per_minute=1000,
        max_concurrent_requests=4, shutdown_timeout=5, log_level="info", access_log=False,
        max_request_body_bytes=1024, header_read_timeout=2, body_read_timeout=3, timeout_keep_alive=7)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.port = 1  # type: ignore[misc]


def test_inline_chat_template_and_defaults(monkeypatch):
    monkeypatch.delenv("KVSERVE_API_KEY", raising=False)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    settings = settings_from_args(parse(["--chat-template", "{{ 'x' }}"]))
    assert settings.chat_template == "{{ 'x' }}" and settings.api_keys == ()
    assert settings.requests_per_minute is None and settings.max_concurrent_requests is None
    assert settings.max_request_body_bytes == 32 * 2**20 and settings.h11_max_header_count == 256


def request_with(headers: dict[str, str]) -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "method": "POST", "path": "/v1/completions", "headers": raw})


def test_authenticate():
    keys = ("alpha-key-123", "beta")
    assert authenticate(request_with({}), ()) == ANONYMOUS_KEY
    assert authenticate(request_with({"Authorization": "Bearer beta"}), keys) == "beta"
    assert authenticate(request_with({"Authorization": "bearer  alpha-key-123 "}), keys) == "alpha-key-123"
    for headers in ({}, {"Authorization": "Basic beta"}, {"Authorization": "Bearer "},
                    {"Authorization": "Bearer alpha-key-1234"}):
        with pytest.raises(APIError) as info:
            authenticate(request_with(headers), keys)
        assert info.value.status_code == 401 and info.value.code == "invalid_api_key"
    with pytest.raises(APIError) as info:
        authenticate(request_with({"Authorization": "Bearer sk-secret-value-9876"}), keys)
    assert "secret-value" not in info.value.message and info.value.message.endswith("9876.")
