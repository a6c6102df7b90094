"""The built-in (trained) model behind the real server: readable text, and a CJK + emoji prompt
whose streamed chunks join to exactly the non-streamed text with no U+FFFD anywhere."""

from __future__ import annotations

import pytest

from kvserve.builtin import BUILTIN_MODEL_NAME, builtin_model_path
from kvserve.testing.live_server import start_live_server


@pytest.fixture(scope="module")
def builtin_server():
    server = start_live_server(str(builtin_model_path()), served_model_name=BUILTIN_MODEL_NAME, api_key="builtin-key",
                               num_gpu_blocks_override=128)
    yield server
    server.stop()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cjk_emoji_prompt_stream_equals_text_without_replacement_chars(builtin_server, seed):
    client = builtin_server.make_client()
    prompt = "“你好，世界！” said Elizabeth 🙂, “Café au lait in 東京 🚀?”"
    kwargs = dict(model=BUILTIN_MODEL_NAME, prompt=prompt, max_tokens=40, temperature=0.9, seed=seed)
    full = client.completions.create(**kwargs).choices[0].text
    chunks = [c.choices[0].text for c in client.completions.create(stream=True, **kwargs)]
    assert "".join(chunks).encode("utf-8") == full.encode("utf-8")
    assert all("\ufffd" not in chunk for chunk in chunks) and "\ufffd" not in full
    chat = dict(model=BUILTIN_MODEL_NAME, messages=[{"role": "user", "content": prompt}], max_tokens=40,
                temperature=0.9, seed=seed)
    message = client.chat.completions.create(**chat).choices[0].message.content
    pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **chat)
              if c.choices]
    assert "".join(pieces) == message and all("\ufffd" not in p for p in pieces)


def test_models_lists_builtin_name(builtin_server):
    models = builtin_server.make_client().models.list().data
    assert [m.id for m in models] == [BUILTIN_MODEL_NAME]
