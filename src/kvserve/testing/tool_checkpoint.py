"""A tiny checkpoint that speaks the Qwen2.5 / Qwen3 tool-calling and thinking format, for tests
and for trying ``--enable-auto-tool-choice --tool-call-parser hermes --reasoning-parser qwen3``.

:func:`build_tool_checkpoint` writes a ``Qwen2ForCausalLM`` with random weights and the ``bpe``
tokenizer plus four added tokens, ``<tool_call>``, ``</tool_call>``, ``<think>``, ``</think>``
(non-special, as in the Qwen2.5/Qwen3 tokenizers; ``special_tags=True`` marks them special, as
Hermes-2-Pro's ``<tool_call>`` is), and :data:`TOOL_CHAT_TEMPLATE`, written from the format
the Qwen2.5/Qwen3 chat templates document:

* tools go into the system turn as one JSON object per line between ``<tools>`` tags, with the
  instruction to answer ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``;
* an assistant turn's ``tool_calls`` are written in that form (``arguments`` as a JSON object);
* ``tool`` turns go into a ``user`` turn between ``<tool_response>`` tags (consecutive tool
  results share one turn);
* an assistant turn's ``reasoning_content`` is written as ``<think>\\n...\\n</think>\\n\\n``
  before its content; ``enable_thinking: false`` closes an empty think block after the
  generation prompt (Qwen3), so the reply is all answer.
"""

from __future__ import annotations

from pathlib import Path

from kvserve.testing.checkpoints import build_checkpoint
from kvserve.testing.tokenizer_kinds import tokenizer_spec

TAGS = ("<tool_call>", "</tool_call>", "<think>", "</think>")

TOOL_CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n'"
    "   'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and '"
    "   'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n'"
    "   '{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' or (message['role'] == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if message.get('reasoning_content') %}"
    "{{- '<think>\\n' + message['reasoning_content'] + '\\n</think>\\n\\n' }}{%- endif %}"
    "{{- message['content'] }}"
    "{%- for call in message.get('tool_calls') or [] %}"
    "{%- set function = call['function'] %}"
    "{%- if loop.first and message['content'] %}{{- '\\n' }}{%- elif not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + function['name'] + '\", \"arguments\": ' + (function['arguments'] | tojson)"
    "   + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- elif message['role'] != 'system' %}"
    "{{- raise_exception('Unknown role ' + message['role']) }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)


def build_tool_tokenizer(*, special_tags: bool = False):
    """The ``bpe`` tokenizer with the four tags added (ids 960-963) and :data:`TOOL_CHAT_TEMPLATE`
    (a new object on every call)."""
    from tokenizers import AddedToken, Tokenizer
    from transformers import PreTrainedTokenizerFast

    from kvserve.testing.tokenizer_kinds import build_tokenizer

    base = build_tokenizer("bpe")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(base.backend_tokenizer.to_str()), bos_token=base.bos_token,
        eos_token=base.eos_token, pad_token=base.pad_token, unk_token=base.unk_token,
        chat_template=TOOL_CHAT_TEMPLATE)
    tokenizer.add_tokens([AddedToken(tag, special=special_tags, normalized=False) for tag in TAGS],
                         special_tokens=special_tags)
    return tokenizer


def build_tool_checkpoint(path: str | Path, *, special_tags: bool = False, seed: int = 0,
                          architecture: str = "Qwen2ForCausalLM") -> Path:
    """Write the checkpoint described in the module docstring to ``path`` and return it.

    Args:
        path: output folder (created if missing).
        special_tags: add the four tags as special tokens (``skip_special_tokens`` drops them).
        seed: seed of the random weights.
        architecture: the network under the tokenizer (a Qwen-family one; ``Qwen3MoeForCausalLM``
            for tool calls on a mixture of experts).
    """
    base_vocab = tokenizer_spec("bpe").vocab_size
    path = build_checkpoint(path, architecture, "bpe", seed=seed, vocab_size=base_vocab + 2 * len(TAGS))
    build_tool_tokenizer(special_tags=special_tags).save_pretrained(path)
    return path
