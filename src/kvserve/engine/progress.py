"""The offline API's progress bar (vLLM's ``use_tqdm``): one tick per finished request, with the
input and output token rates so far, as vLLM's ``LLM._run_engine`` shows them::

    Processed prompts: 100%|██████████| 64/64 [00:05<00:00, est. speed input: 1630.21 toks/s, output: 815.10 toks/s]

``use_tqdm`` is ``True`` (tqdm's bar), ``False`` (none) or a callable that makes a tqdm-like bar
(e.g. ``functools.partial(tqdm, leave=False)``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tqdm.auto import tqdm

from kvserve.outputs import RequestOutput

UseTqdm = bool | Callable[..., Any]


class Progress:
    """Counts finished requests of one offline call on a tqdm bar (nothing with ``use_tqdm``
    false). ``total``: how many requests the call runs."""

    def __init__(self, use_tqdm: UseTqdm, total: int, desc: str = "Processed prompts"):
        self._bar = None
        self._input_tokens = self._output_tokens = 0
        if use_tqdm:
            make = use_tqdm if callable(use_tqdm) else tqdm
            self._bar = make(total=total, desc=desc, dynamic_ncols=True, postfix=_rates(0.0, 0.0))

    def finished(self, output: RequestOutput) -> None:
        """Tick once for a finished request; its prompt counts once per choice, as vLLM's."""
        if self._bar is None:
            return
        choices = max(1, len(output.outputs))
        self._input_tokens += len(output.prompt_token_ids or ()) * choices
        self._output_tokens += sum(len(choice.token_ids) for choice in output.outputs)
        elapsed = self._bar.format_dict["elapsed"] or 1e-9
        self._bar.postfix = _rates(self._input_tokens / elapsed, self._output_tokens / elapsed)
        self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _rates(input_rate: float, output_rate: float) -> str:
    return f"est. speed input: {input_rate:.2f} toks/s, output: {output_rate:.2f} toks/s"
