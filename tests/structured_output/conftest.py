"""Grammar backends on the real test tokenizers, built once per session.

``backend_for(kind, name)`` returns the ``name`` backend (``xgrammar``/``guidance``/``auto``) for
the ``kind`` tokenizer (``bpe``/``sentencepiece``/``tekken``) with the generation EOS ids of the
checkpoints built from it.
"""

from __future__ import annotations

import pytest

from kvserve.structured_output import StructuredOutputsConfig, create_backend
from kvserve.testing import build_tokenizer
from kvserve.testing.tokenizer_kinds import tokenizer_spec


@pytest.fixture(scope="session")
def backend_for():
    built = {}

    def get(kind: str, name: str, **config):
        key = (kind, name, tuple(sorted(config.items())))
        if key not in built:
            spec = tokenizer_spec(kind)
            built[key] = create_backend(
                build_tokenizer(kind), spec.vocab_size, spec.generation_eos_token_ids,
                StructuredOutputsConfig(backend=name, **config),
            )
        return built[key]

    return get
