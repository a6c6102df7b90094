"""The batched sampler: one token per logits row.

Pipeline (each stage skipped when no row needs it)::

    logits [N, V] ─► grammar ─► raw log_softmax ────────────────────► logprobs (if asked)
          │
          └─► logits processors (allowed_token_ids ─► bad_words ─► min_tokens ─► logit_bias)
              ─► penalties                                │
                                                          ├─► argmax ─► greedy rows
                                                          │
                                                          └─► / temperature ─► top-k ─► top-p
                                                              ─► min-p ─► softmax ─► cumsum
                                                              ─► searchsorted(u) ─► random rows

Random rows draw by inverse transform sampling: token ``i`` is the first whose cumulative
probability exceeds ``u * total`` for one uniform ``u`` in [0, 1) per row (what
``torch.multinomial`` does). On the CPU the C++ ``sample_rows`` kernel (``kernels/csrc/sample.cpp``)
does the division by the temperature, the softmax and the search in one pass per row over the
logits as they are (bfloat16 included), without the ``[N, V]`` float32 copies of the torch path
below (at 64 x 151,936 rows those, the zeroing of their fresh pages and the cumsum took 47 ms a
step); top-k/top-p/min-p only mark the tokens it must skip. Its sums run in its own fixed order,
so a draw can differ from the torch path's where ``u`` falls within float rounding of a CDF step;
every row is computed alone, so a seeded row's tokens still never depend on the batch. On CUDA the
Triton kernels of ``kernels/triton_sample.py`` take the same calls (argmax, top-p, the draw) with
the same rules, where Triton is installed; elsewhere the torch path runs.

One number per row keeps seeds cheap: the runner draws a seeded row's ``u`` from the request's
own generator, so its tokens do not depend on what else is in the batch; unseeded rows share one
batched draw (``SamplingMetadata.uniforms``). On CPU this was ~6x cheaper than the exponential race
(``argmax(p / q)``, ``q ~ Exp(1)``), which needs ``V`` random numbers per row (32 x 151,936
float32: cumsum 43 ms against exponential_ + divide + argmax 271 ms, same run). CPU ``cumsum``
accumulates float32 in double (measured error < 3e-8), so the CDF is exact to float32 rounding.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from kvserve.kernels.triton_sample import sample_ops_for
from kvserve.outputs import TokenLogprobs
from kvserve.sample.greedy import greedy_argmax
from kvserve.sample.logprobs import gather_logprobs
from kvserve.sample.metadata import SamplingMetadata
from kvserve.sample.penalties import apply_penalties
from kvserve.sample.top_k_top_p import apply_min_p, apply_top_k_top_p, apply_top_p_kernel


class SamplerOutput(NamedTuple):
    """Result of one sampling step.

    Attributes:
        sampled_token_ids: int64 ``[N]``, one token per row.
        logprobs: per row, the sampled token's logprobs (raw ``log_softmax`` of the logits) or
            None where the request did not ask for logprobs.
    """

    sampled_token_ids: torch.Tensor
    logprobs: list[TokenLogprobs | None]


class NoTokenAllowedError(RuntimeError):
    """The logits processors of some rows (``allowed_token_ids``, ``bad_words``, ``min_tokens``,
    a structured-output grammar) left no token to generate: those requests' own constraints
    exclude the whole vocabulary (e.g. a grammar that allows none of ``allowed_token_ids``). The
    runner finishes each such request with this error, as the client's, and goes on with the
    others (``kvserve.model.runner``).

    Attributes:
        batch_rows: the persistent batch's rows of those requests.
    """

    def __init__(self, batch_rows: list[int]):
        super().__init__("no token can be generated: the request's allowed_token_ids, bad_words, min_tokens and "
                         "structured-output constraint together exclude every token of the vocabulary here")
        self.batch_rows = batch_rows


def draw_uniforms(greedy: list[bool], generators: list[torch.Generator | None],
                  shared: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """float64 ``[N]``: one uniform in [0, 1) per random row (0.0 for greedy rows), from the
    row's own generator when it has one (a seeded request consumes exactly one number per step,
    whatever the batch), else from one batched draw of ``shared`` (torch's default when None)."""
    uniforms = torch.zeros(len(greedy), dtype=torch.float64, device=device)
    unseeded = [i for i, (g, gen) in enumerate(zip(greedy, generators)) if not g and gen is None]
    if unseeded:
        draws = torch.rand(len(unseeded), dtype=torch.float64, device=device, generator=shared)
        uniforms[torch.tensor(unseeded, dtype=torch.int64, device=device)] = draws
    for i, (g, gen) in enumerate(zip(greedy, generators)):
        if not g and gen is not None:
            uniforms[i] = torch.rand(1, dtype=torch.float64, device=device, generator=gen)[0]
    return uniforms


class Sampler:
    """Choose one token per row of the logits (see the module docstring for the order of stages).

    Args:
        generator: the random generator of rows without their own (unseeded requests), on the
            logits' device, used when the metadata carries no pre-drawn uniforms; None uses
            torch's default generator.
        device: the logits' device: the kernels that draw, take argmaxes and cut top-p
            (``sample_ops_for``): the C++ ones on the CPU, the Triton ones on CUDA, else torch.
    """

    def __init__(self, generator: torch.Generator | None = None, device: torch.device | str = "cpu"):
        self.generator = generator
        self.ops = sample_ops_for(device)

    def __call__(self, logits: torch.Tensor, metadata: SamplingMetadata) -> SamplerOutput:
        """Sample one token per row.

        Args:
            logits: ``[N, V]`` in float32 or the model dtype (the LM head's output), row ``i``
                for the i-th request of ``metadata``; not modified. Logprobs and every stage but
                greedy argmax run on a float32 copy.
            metadata: the batch's ``SamplingMetadata`` (``N`` rows, vocabulary ``V``).

        Returns:
            ``SamplerOutput`` with int64 ``[N]`` token ids and per-row logprobs.
        """
        if logits.dim() != 2 or logits.shape[0] != metadata.num_rows:
            raise ValueError(f"logits must be [{metadata.num_rows}, V], got {tuple(logits.shape)}")
        # Logprobs come from the raw logits (after the grammar's mask, as vLLM), so take them
        # before any other processing.
        owned = False
        early = [p for p in metadata.logits_processors if p.before_logprobs]
        if early:
            logits, owned = logits.to(torch.float32, copy=True), True
            for processor in early:
                processor.apply(logits, metadata.batch_rows)
        rows = [i for i, k in enumerate(metadata.num_logprobs) if k is not None]
        index = torch.tensor(rows, dtype=torch.int64, device=logits.device)
        raw_logprobs = None
        if rows:
            # Advanced indexing, not index_select: on CPU index_select of long rows measured
            # ~18x slower (32 x 151,936 float32: 448 ms against 25 ms).
            selected = logits if len(rows) == metadata.num_rows else logits[index]
            raw_logprobs = torch.log_softmax(selected.float(), dim=1)
        processed = self._process_logits(logits, metadata, owned)
        sampled = self._sample(processed, metadata, owned=owned or processed is not logits)
        result: list[TokenLogprobs | None] = [None] * metadata.num_rows
        if raw_logprobs is not None:
            num_logprobs = [metadata.num_logprobs[i] for i in rows]
            entries = gather_logprobs(raw_logprobs, sampled[index], num_logprobs)
            for row, entry in zip(rows, entries):
                result[row] = entry
        return SamplerOutput(sampled, result)

    @staticmethod
    def _process_logits(logits: torch.Tensor, metadata: SamplingMetadata, owned: bool = False) -> torch.Tensor:
        """The processors after the logprobs and the penalties, on a float32 copy (the input is
        left as is unless ``owned``, the sampler's own copy); without them the input is kept
        (argmax and the sampling kernel read it as it is)."""
        late = [p for p in metadata.logits_processors if not p.before_logprobs]
        if not late and metadata.penalties is None:
            return logits
        if not owned:
            logits = logits.to(torch.float32, copy=True)
        for processor in late:
            processor.apply(logits, metadata.batch_rows)
        if metadata.penalties is not None:
            apply_penalties(logits, metadata.penalties)
        return logits

    def _sample(self, logits: torch.Tensor, metadata: SamplingMetadata, owned: bool) -> torch.Tensor:
        """int64 ``[N]``; ``owned``: ``logits`` is the sampler's own float32 copy (may be modified).

        Raises:
            NoTokenAllowedError: rows whose logits processors left every token at ``-inf``.
        """
        # Only a logits processor can set a whole row to -inf (truncation keeps the largest).
        refuse = bool(metadata.logits_processors)
        greedy_ids = greedy_argmax(logits, self.ops) if metadata.all_greedy or not metadata.all_random else None  # empty: both
        empty = None
        if refuse and greedy_ids is not None:
            # Before the draw: the torch path truncates every row in place, greedy ones too, and
            # among tied maxima may keep another than the argmax.
            empty = torch.isneginf(logits.gather(1, greedy_ids.view(-1, 1)).view(-1)) & metadata.greedy_mask
        if metadata.all_greedy:
            if empty is not None:
                _raise_for_empty_rows(empty, metadata)
            return greedy_ids
        uniforms = metadata.uniforms
        if uniforms is None:
            uniforms = draw_uniforms(metadata.greedy_mask.tolist(), metadata.generators, self.generator, logits.device)
        sampled = self._draw(logits, metadata, uniforms, owned)
        vocab_size = logits.shape[1]
        # A row without a distribution (a +inf or NaN logit, or every token at -inf, refused
        # below) has NaN probabilities and its search returns V, past the vocabulary: it takes the
        # argmax of its logits as a greedy row would (the +inf token, or the first NaN).
        # Truncation only sets -inf and never drops the largest logit, so the argmax after it is
        # the argmax before, and a row is all -inf after it exactly when it was before.
        undefined = sampled >= vocab_size
        if bool(undefined.any()):
            if refuse:
                random_undefined = undefined & ~metadata.greedy_mask
                all_neginf = torch.zeros_like(undefined)
                all_neginf[random_undefined] = torch.isneginf(logits[random_undefined]).all(dim=1)
                empty = all_neginf if empty is None else empty | all_neginf
            sampled = torch.where(undefined, greedy_argmax(logits, self.ops) if greedy_ids is None else greedy_ids, sampled)
        if empty is not None:
            _raise_for_empty_rows(empty, metadata)
        if greedy_ids is not None:
            sampled = torch.where(metadata.greedy_mask, greedy_ids, sampled)
        return sampled

    def _draw(self, logits: torch.Tensor, metadata: SamplingMetadata, uniforms: torch.Tensor, owned: bool) -> torch.Tensor:
        """The random rows' tokens (int64 ``[N]``; greedy rows hold anything; ``V``: no
        distribution): the sampling kernel (C++ on the CPU, Triton on CUDA), else softmax +
        inverse CDF in torch."""
        kernels = self.ops if logits.dtype in (torch.float32, torch.bfloat16) else None
        if kernels is None:
            work = logits if owned else logits.to(torch.float32, copy=True)
            return _inverse_cdf_sample(self.processed_probs(work, metadata), uniforms)
        if metadata.top_p is not None and metadata.top_k is None and metadata.min_p is None:
            # top-p alone: the kernel (top_p.cpp or its twin) decides on logits / T itself and masks
            # the raw logits in place (the same kept set as on a scaled float32 copy, without the
            # two copies).
            rows = ((metadata.top_p < 1.0) & ~metadata.greedy_mask).nonzero().squeeze(1)
            if rows.numel():
                logits = logits.contiguous() if owned else logits.clone(memory_format=torch.contiguous_format)
                apply_top_p_kernel(kernels, logits, rows, metadata.top_p, metadata.temperature)
        elif metadata.top_k is not None or metadata.top_p is not None or metadata.min_p is not None:
            # Truncation decides on the scaled logits (torch); the kernel divides the raw values of
            # the kept tokens itself, so a row samples the same bits with or without truncating
            # rows beside it.
            scaled = logits.to(torch.float32, copy=True).div_(metadata.temperature.unsqueeze(1))
            self._truncate(scaled, metadata)
            logits = (logits if owned else logits.to(torch.float32, copy=True)).masked_fill_(scaled == -torch.inf, -torch.inf)
        rows = (torch.arange(logits.shape[0], device=logits.device) if metadata.all_random
                else (~metadata.greedy_mask).nonzero().squeeze(1))
        sampled = torch.zeros(logits.shape[0], dtype=torch.int64, device=logits.device)
        sampled[rows] = kernels.sample_rows(logits.contiguous(), rows, metadata.temperature[rows].contiguous(),
                                            uniforms[rows].contiguous())
        return sampled

    def _truncate(self, scaled: torch.Tensor, metadata: SamplingMetadata) -> None:
        """top-k, top-p and min-p on temperature-scaled float32 logits, in place (dropped: -inf)."""
        apply_top_k_top_p(scaled, metadata.top_k, metadata.top_p, self.ops)
        if metadata.min_p is not None:
            apply_min_p(scaled, metadata.min_p)

    def processed_probs(self, logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        """The distribution random rows are drawn from: softmax of the logits after temperature,
        top-k, top-p and min-p.

        Args:
            logits: float32 ``[N, V]`` after bias/min_tokens/penalties; modified in place.
            metadata: the batch's metadata.

        Returns:
            float32 ``[N, V]`` probabilities (rows sum to 1; greedy rows are not meaningful).
        """
        logits.div_(metadata.temperature.unsqueeze(1))
        self._truncate(logits, metadata)
        return logits.softmax(dim=1)


def _raise_for_empty_rows(empty: torch.Tensor, metadata: SamplingMetadata) -> None:
    """``NoTokenAllowedError`` for the rows where ``empty`` (bool ``[N]``) is set."""
    if bool(empty.any()):
        raise NoTokenAllowedError([metadata.batch_rows[i] for i in empty.nonzero().view(-1).tolist()])


def _inverse_cdf_sample(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Token per row: the first index whose cumulative probability exceeds ``u * total``.

    A zero-probability token never increases the CDF, so it is never the first index past the
    target; the clamp to the last positive token only matters when rounding puts the target at
    the total.

    Args:
        probs: float32 ``[N, V]``, non-negative rows.
        uniforms: float64 ``[N]`` in [0, 1).

    Returns:
        int64 ``[N]`` token ids.
    """
    cdf = probs.cumsum(dim=1)
    total = cdf[:, -1:].contiguous()
    targets = (uniforms.unsqueeze(1) * total.double()).to(cdf.dtype)
    chosen = torch.searchsorted(cdf, targets, right=True)
    last_positive = torch.searchsorted(cdf, total, right=False)
    return torch.minimum(chosen, last_positive).squeeze(1)
