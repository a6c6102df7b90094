"""A tokenizer that writes GPT-OSS's harmony markers, for tests of the ``openai_gptoss`` and
``openai`` parsers without the o200k_harmony vocabulary (which cannot be fetched offline).

:func:`build_harmony_tokenizer` is the ``tekken`` test tokenizer (Mistral's tiktoken-style BPE
shipped in ``mistral_common``, 131,072 tokens, the kind of vocabulary o200k is) with harmony's
seven markers added as special tokens, as gpt-oss's ``tokenizer.json`` declares them, and
:data:`HARMONY_CHAT_TEMPLATE`, a reduced harmony template (each message
``<|start|>ROLE<|message|>CONTENT<|end|>``, the generation prompt ``<|start|>assistant``).
``<|return|>`` and ``<|call|>`` are its EOS tokens (:data:`HARMONY_EOS`), as in gpt-oss's
``generation_config.json``.
"""

from __future__ import annotations

from kvserve.harmony import CALL, MARKERS, RETURN

HARMONY_EOS = (RETURN, CALL)

HARMONY_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|start|>' + message['role'] + '<|message|>' + (message['content'] or '') + '<|end|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start|>assistant' }}{%- endif %}"
)


def build_harmony_tokenizer():
    """The tokenizer of the module docstring (a new object on every call; markers get the ids
    131072-131078 in :data:`kvserve.harmony.MARKERS` order)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from kvserve.testing.tokenizer_kinds import build_tokenizer

    base = build_tokenizer("tekken")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(base.backend_tokenizer.to_str()), bos_token=base.bos_token,
        unk_token=base.unk_token, chat_template=HARMONY_CHAT_TEMPLATE)
    tokenizer.add_special_tokens({"additional_special_tokens": list(MARKERS)})
    tokenizer.eos_token = RETURN
    return tokenizer
