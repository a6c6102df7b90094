"""vLLM's offline API surface: ``use_tqdm`` (on by default, a callable bar factory, off) on
``LLM.generate`` and ``LLM.chat``, ``LLM.chat`` with ``tools`` and ``chat_template_kwargs``
rendered by the template, ``priority`` as one int or one per prompt."""

from __future__ import annotations

import re

import pytest

from kvserve import LLM, SamplingParams
from kvserve.testing.tool_checkpoint import build_tool_checkpoint
from kvserve.tokenizer import apply_chat_template

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather forecast",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    model = build_tool_checkpoint(tmp_path_factory.mktemp("tool-qwen2"))
    return LLM(str(model), dtype="float32", max_model_len=512, num_gpu_blocks_override=64, scheduling_policy="priority")


class RecordingBar:
    """A tqdm-like bar that records what the engine told it."""

    made: list[RecordingBar] = []

    def __init__(self, **kwargs):
        self.kwargs, self.n, self.postfix, self.closed = kwargs, 0, kwargs["postfix"], False
        self.format_dict = {"elapsed": 0.5}
        RecordingBar.made.append(self)

    def update(self, n: int) -> None:
        self.n += n

    def close(self) -> None:
        self.closed = True


def test_a_bar_factory_counts_every_request_and_the_token_rates(llm):
    RecordingBar.made.clear()
    outputs = llm.generate(["a b c", "d e", [5, 6, 7, 8]], SamplingParams(n=2, max_tokens=3, ignore_eos=True, seed=1),
                           use_tqdm=RecordingBar)
    (bar,) = RecordingBar.made
    assert bar.kwargs["total"] == 3 and bar.kwargs["desc"] == "Processed prompts" and bar.n == 3 and bar.closed
    prompt_tokens = sum(len(o.prompt_token_ids) * 2 for o in outputs)  # once per choice, as vLLM
    assert bar.postfix == f"est. speed input: {prompt_tokens / 0.5:.2f} toks/s, output: {3 * 2 * 3 / 0.5:.2f} toks/s"


def test_the_default_bar_is_tqdm_on_stderr_and_false_shows_none(llm, capsys):
    llm.generate(["one", "two"], GREEDY)
    err = capsys.readouterr().err
    assert re.search(r"Processed prompts: 100%.*2/2.*est\. speed input: [\d.]+ toks/s, output: [\d.]+ toks/s", err)
    llm.generate(["one", "two"], GREEDY, use_tqdm=False)
    llm.chat(MESSAGES, GREEDY, use_tqdm=False)
    assert capsys.readouterr().err == ""


def test_chat_renders_tools_and_template_kwargs_and_equals_generate_on_that_prompt(llm):
    out = llm.chat(MESSAGES, GREEDY, use_tqdm=False, tools=TOOLS, chat_template_kwargs={"enable_thinking": False})[0]
    tokenizer = llm.get_tokenizer()
    expected = apply_chat_template(tokenizer, MESSAGES, tools=TOOLS, chat_template_kwargs={"enable_thinking": False})
    assert out.prompt_token_ids == expected
    assert "get_weather" in tokenizer.decode(expected) and "<think>\n\n</think>" in tokenizer.decode(expected)
    assert expected != apply_chat_template(tokenizer, MESSAGES)  # the tools changed the prompt
    again = llm.generate([{"prompt_token_ids": expected}], GREEDY, use_tqdm=False)[0]
    assert again.outputs[0].token_ids == out.outputs[0].token_ids


def test_priority_is_one_int_or_one_per_prompt(llm):
    assert len(llm.generate(["x", "y"], GREEDY, priority=1, use_tqdm=False)) == 2
    assert len(llm.generate(["x", "y"], GREEDY, priority=[0, 1], use_tqdm=False)) == 2
    with pytest.raises(ValueError, match="got 3 priorities for 2 prompts"):
        llm.generate(["x", "y"], GREEDY, priority=[0, 1, 2], use_tqdm=False)
