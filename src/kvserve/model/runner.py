"""The model runner: owns the paged KV cache and one step end to end.

``execute_model(scheduler_output) -> ModelRunnerOutput``::

    _update_states   apply the scheduler's deltas to the persistent batch (new requests once,
                     new block ids and computed counts after; rows of unscheduled requests leave)
    _run_rows        flat batch (``model_inputs``) -> forward -> logits of the sampling rows
                     -> prompt logprobs -> logits processors + sampler (position by position
                     when requests verify draft tokens: ``sample.rejection_sampler``)
    _commit          append sampled tokens to the batch; fill the output

A pooling model's runner (``pooler``) pools, instead of sampling, each pooling request whose
prompt completes in the step (its whole prompt: pooling requests are never chunked,
``kvserve.pooling.engine_rules``): the final hidden states of its rows become one vector in
``ModelRunnerOutput.pooler_output`` (``kvserve.pooling.pooler``; a classifier's logits or scores). A
cross-encoder pair's segment ids reach the model as ``ModelInputs.token_type_ids`` (from each
request's ``token_type_start``).

The drafts for the next step are the engine core's to propose (``spec_decode.proposer``).

Failure isolation: if running a group of requests raises, the runner runs each half of the
group again (recursively) and finishes only a request that fails alone (``ModelRunnerOutput
.errors``); the others' results are exact because every kernel is batch-invariant (a row's
result does not depend on the other rows) and their random draws are taken once per step
(``_uniforms``). A failure of every request alone is reported as such (the engine treats it as
unattributable). A request whose own constraints leave no token to sample (``NoTokenAllowedError``)
is not a failure of the engine: it ends as the client's error (``ModelRunnerOutput.refused``)
and the group runs again without it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import time

import numpy as np
import torch

from kvserve.config import LoRAConfig
from kvserve.errors import ConfigError, EngineDeadError
from kvserve.faults import FaultInjector
from kvserve.model.cuda_graphs import Capturer, DecodeGraphs, capture_cuda_graph, capture_sizes, why_not_captured
from kvserve.model.fused_decoder import FusedDecoder, model_hidden
from kvserve.model.input_batch import CachedRequestState, InputBatch, request_generator
from kvserve.model.invariant_linear import use_invariant_linears
from kvserve.model.kv_cache_layout import allocate_kv_caches
from kvserve.model.loader import LoadedModel
from kvserve.model.model_inputs import make_flat_batch, to_model_inputs
from kvserve.outputs import ModelRunnerOutput, PromptLogprobsChunk, TokenLogprobs
from kvserve.pooling.pooler import Pooler
from kvserve.sample.logits_processor import build_logits_processors
from kvserve.sample.logprobs import batch_prompt_logprobs
from kvserve.sample.rejection_sampler import RejectionSampler, VerifiedTokens
from kvserve.sample.sampler import NoTokenAllowedError, Sampler, draw_uniforms
from kvserve.scheduler.output import NewRequestData, SchedulerOutput

logger = logging.getLogger(__name__)

# Requests failing alone, in one step and before any succeeded, after which the failure is
# taken as the batch's, not a request's (bisecting further would only repeat it).
MAX_ISOLATED_FAILURES = 4


class _RowsResult:
    """What running a group of rows produced, applied by ``_commit`` only if it all succeeded."""

    def __init__(self, rows: np.ndarray, sampling_rows: np.ndarray, token_ids: list[list[int]],
                 logprobs: list[list[TokenLogprobs | None]], prompt_logprobs: dict[str, PromptLogprobsChunk],
                 pooled: dict[str, torch.Tensor]):
        self.rows = rows
        self.sampling_rows = sampling_rows
        self.token_ids = token_ids
        self.logprobs = logprobs
        self.prompt_logprobs = prompt_logprobs
        self.pooled = pooled


class ModelRunner:
    """Runs a loaded model over paged KV blocks.

    ``kv_caches`` holds one tensor per layer (``kv_cache_shape``: latent attention caches one row
    per token), [2, num_blocks, block_size, num_kv_heads, head_dim] in the model dtype (a one-byte
    ``kv_cache_dtype``: int8 or float8 [..., head_dim + 4], each
    row's codes and float32 scale, ``kvserve.attention.kv_quant``), zero-initialised (the backends
    rely on padded slots being finite).

    Args:
        loaded: the model from ``kvserve.model.loader.load_model``.
        num_blocks: KV blocks to allocate (block ids 0 .. num_blocks - 1).
        block_size: tokens per block.
        device: device of the cache and of the batch tensors (the model's device).
        max_num_reqs: most requests in one step (rows of the persistent batch).
        max_model_len: most tokens of one request (default: the model's
            ``max_position_embeddings``).
        seed: seed of the generator shared by requests without their own ``seed``.
        prepack_linears: on the CPU, swap the model's float32/bf16 linears for kvserve's
            batch-invariant GEMM (``kvserve.model.invariant_linear.use_invariant_linears``).
        lora_config: LoRA serving (``--enable-lora``): the projections get adapter slots
            (``kvserve.lora.manager``); None = no adapters.
        kv_cache_dtype: ``auto`` (the model's dtype), ``int8``, ``fp8_e4m3`` or ``fp8_e5m2``
            (``--kv-cache-dtype``).
        enforce_eager: always run the model's modules (``--enforce-eager``), never the decoder
            layers' C++ loop (``kvserve.model.fused_decoder``, used where it applies) nor CUDA
            graphs (``kvserve.model.cuda_graphs``, captured on a GPU where they apply).
        pooler: a pooling model's pooler (``kvserve.pooling.pooler.Pooler``); None = generative.
        graph_capturer: records a decode forward (``kvserve.model.cuda_graphs.Capturer``); None:
            CUDA graphs on a CUDA device, none elsewhere. The tests pass an eager stand-in.

    Raises:
        ConfigError: capturing the CUDA graphs failed (named; ``--enforce-eager`` runs without).
    """

    def __init__(self, loaded: LoadedModel, num_blocks: int, block_size: int, device: str | torch.device = "cpu",
                 *, max_num_reqs: int = 256, max_model_len: int | None = None, seed: int = 0,
                 prepack_linears: bool = True,
                 lora_config: LoRAConfig | None = None, kv_cache_dtype: str = "auto", enforce_eager: bool = False,
                 pooler: Pooler | None = None, graph_capturer: Capturer | None = None):
        self.model = loaded.model
        self.pooler = pooler
        self.arch = loaded.arch
        self.dtype = loaded.dtype
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.device = torch.device(device)
        self.vocab_size = loaded.arch.vocab_size
        self.num_kv_heads = loaded.cached_kv_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.kv_caches = allocate_kv_caches(self.arch, num_blocks, block_size, self.kv_cache_dtype, self.dtype,
                                            self.device, self.num_kv_heads)
        # CPU: float32/bf16 linears through kvserve's batch-invariant GEMM (weights packed once).
        on_cpu = self.device.type == "cpu"
        self.num_prepacked_linears = use_invariant_linears(self.model) if on_cpu and prepack_linears else 0
        self.lora = None
        if lora_config is not None:
            from kvserve.lora.manager import LoRAManager

            self.lora = LoRAManager(self.model, self.arch, lora_config, self.device, self.dtype, shard=loaded.shard)
            if loaded.shard is not None:  # a TensorParallelModel: its forwards carry the adapters to every rank
                self.model.lora = self.lora
        use_fused = on_cpu and self.lora is None and not enforce_eager
        self.fused_decoder = FusedDecoder.build(self.model, self.kv_caches) if use_fused else None
        if self.fused_decoder is not None:
            logger.info("decoder layers: one C++ call per step (--enforce-eager runs the PyTorch modules)")
        max_model_len = max_model_len or loaded.arch.max_position_embeddings
        self.input_batch = InputBatch(max_num_reqs, max_model_len, math.ceil(max_model_len / block_size),
                                      self.vocab_size, self.device,
                                      build_logits_processors(self.vocab_size, self.device, max_num_reqs))
        # (a tensor-parallel model's forward crosses processes: never captured)
        self.decode_graphs = (None if enforce_eager or loaded.shard is not None
                              else self._capture_decode_graphs(graph_capturer, max_model_len))
        self.requests: dict[str, CachedRequestState] = {}
        # Seeded requests' generators, by request id: kept across preemption, dropped at finish.
        self.generators: dict[str, torch.Generator] = {}
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.sampler = Sampler(device=self.device)
        self.rejection_sampler = RejectionSampler(self.sampler)
        self.faults = FaultInjector()
        self._step_uniforms: dict[str, list[float]] = {}
        self._spec_tokens: dict[str, list[int]] = {}
        self._num_succeeded = 0

    def _capture_decode_graphs(self, capturer: Capturer | None, max_model_len: int) -> DecodeGraphs | None:
        if self.lora is not None or self.pooler is not None:
            return None
        if capturer is None:
            if self.device.type != "cuda":
                return None
            pool = torch.cuda.graph_pool_handle()
            capturer = functools.partial(capture_cuda_graph, pool=pool)
        why_not = why_not_captured(self.model, self.dtype, self.device)
        if why_not is not None:
            logger.info("decode steps run eagerly: %s", why_not)
            return None
        sizes = capture_sizes(self.input_batch.max_num_reqs)
        start = time.perf_counter()
        try:
            with torch.inference_mode():  # as the steps run: a graph replays the forward it recorded
                graphs = DecodeGraphs(self.model, self.kv_caches, sizes, max_model_len, self.block_size, self.device,
                                      capturer)
        except NotImplementedError as exc:  # the backend cannot serve this cache: it names the fix
            raise ConfigError(str(exc)) from exc
        except Exception as exc:  # noqa: BLE001 - a GPU-only failure, named in one line
            raise ConfigError(f"capturing CUDA graphs failed ({type(exc).__name__}: {exc}); "
                              "--enforce-eager runs without them") from exc
        logger.info("decode steps of 1-%d requests: %d CUDA graphs captured in %.1f s (--enforce-eager: none)",
                    sizes[-1], len(sizes), time.perf_counter() - start)
        return graphs

    # -- the step ----------------------------------------------------------------------------------

    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step (see the module docstring).

        Returns:
            sampled tokens and logprobs of the requests that reached the end of their known
            tokens, prompt logprobs, the requests whose processing failed (with why), and the
            drafts proposed for the next step.
        """
        output = ModelRunnerOutput()
        self._update_states(scheduler_output, output)
        if scheduler_output.is_empty or self.input_batch.num_reqs == 0:
            return output
        self._step_uniforms = {}
        self._spec_tokens = scheduler_output.scheduled_spec_decode_tokens
        self._num_succeeded = 0
        rows = np.arange(self.input_batch.num_reqs)
        num_scheduled = np.array([scheduler_output.num_scheduled_tokens[r] for r in self.input_batch.req_ids],
                                 dtype=np.int64)
        self._execute_rows(rows, num_scheduled, output)
        if len(rows) > 1 and all(self.input_batch.req_ids[row] in output.errors for row in rows.tolist()):
            raise EngineDeadError(f"every request of the step failed alone: {next(iter(output.errors.values()))}")
        return output

    def _execute_rows(self, rows: np.ndarray, num_scheduled: np.ndarray, output: ModelRunnerOutput) -> None:
        """Run ``rows``; on failure, run each half again (see the module docstring).

        Raises:
            EngineDeadError: ``MAX_ISOLATED_FAILURES`` requests failed alone in this step before
                any succeeded: the failure is the batch's, not a request's.
        """
        try:
            result = self._run_rows(rows, num_scheduled)
        except EngineDeadError:
            raise  # the engine's failure (e.g. a tensor-parallel peer died): bisecting cannot help
        except NoTokenAllowedError as exc:  # those requests' own constraints: they end, the rest runs again
            refused = np.isin(rows, exc.batch_rows)
            for row in rows[refused].tolist():
                output.refused[self.input_batch.req_ids[row]] = str(exc)
            if not refused.all():
                self._execute_rows(rows[~refused], num_scheduled[~refused], output)
            return
        except Exception as exc:  # noqa: BLE001 - isolated below
            if len(rows) > 1:
                mid = len(rows) // 2
                self._execute_rows(rows[:mid], num_scheduled[:mid], output)
                self._execute_rows(rows[mid:], num_scheduled[mid:], output)
                return
            req_id = self.input_batch.req_ids[int(rows[0])]
            logger.exception("request %s failed in the model runner; the others go on", req_id)
            output.errors[req_id] = f"{type(exc).__name__}: {exc}"
            if self._num_succeeded == 0 and len(output.errors) >= MAX_ISOLATED_FAILURES:
                raise EngineDeadError(f"{len(output.errors)} requests failed alone, none succeeded: "
                                      f"{output.errors[req_id]}") from exc
            return
        self._commit(result, output)

    def _run_rows(self, rows: np.ndarray, num_scheduled: np.ndarray) -> _RowsResult:
        """Forward, prompt logprobs and sampling for ``rows``; no side effect on the batch."""
        batch = self.input_batch
        req_ids = [batch.req_ids[row] for row in rows.tolist()]
        self.faults.check("prepare", req_ids)
        completes = batch.num_computed_tokens[rows] + num_scheduled >= batch.num_tokens[rows]
        samples = completes & (batch.max_tokens[rows] > 0)
        drafts = [self._spec_tokens.get(req_id, []) for req_id in req_ids]
        num_logits = np.array([1 + len(d) for d in drafts], dtype=np.int64)
        flat = self._flat_batch(rows, num_scheduled, samples, num_logits)
        inputs = self._with_token_types(to_model_inputs(flat, self.device), rows, num_scheduled, flat.positions)
        self.faults.check("forward", req_ids)
        with self._adapters(rows, num_scheduled):
            hidden = self._hidden(inputs)
        pooled = {} if self.pooler is None else self._pool(hidden, rows, completes, flat.query_start_loc)
        prompt_logprobs = batch_prompt_logprobs(self.model, batch, rows, req_ids, hidden, flat.query_start_loc)
        sampling_rows = rows[samples]
        if len(sampling_rows) == 0:
            return _RowsResult(rows, sampling_rows, [], [], prompt_logprobs, pooled)
        logits = self.model.compute_logits(hidden[inputs.logits_indices])
        self.faults.check("sample", [batch.req_ids[row] for row in sampling_rows.tolist()])
        verified = self._sample(logits, sampling_rows, [d for d, s in zip(drafts, samples) if s])
        return _RowsResult(rows, sampling_rows, verified.token_ids, verified.logprobs, prompt_logprobs, pooled)

    def _hidden(self, inputs) -> torch.Tensor:
        """The step's hidden states: a CUDA graph's replay where one applies, else the model."""
        if self.decode_graphs is not None and self.decode_graphs.handles(inputs):
            return self.decode_graphs(inputs)
        return model_hidden(self.model, self.fused_decoder, inputs, self.kv_caches)

    def _with_token_types(self, inputs, rows: np.ndarray, num_scheduled: np.ndarray, positions: np.ndarray):
        """``inputs`` with each token's segment type [T] when a row carries a pair's
        ``token_type_start`` (type 1 from that position on), else as they are."""
        if self.pooler is None or not self.pooler.config.token_types:
            return inputs
        specs = [self.input_batch.states[row].spec for row in rows.tolist()]
        starts = [spec.token_type_start for spec in specs]
        if all(start is None for start in starts):
            return inputs
        first_one = np.array([np.iinfo(np.int64).max if s is None else s for s in starts], dtype=np.int64)
        types = (positions >= np.repeat(first_one, num_scheduled)).astype(np.int64)
        return inputs._replace(token_type_ids=torch.from_numpy(types).to(self.device))

    def _pool(self, hidden: torch.Tensor, rows: np.ndarray, completes: np.ndarray,
              query_start_loc: np.ndarray) -> dict[str, torch.Tensor]:
        """The vectors of the pooling requests among ``rows`` whose prompt completes now
        (``Pooler.requests_to_pool``, then the pooler on their rows of ``hidden`` [T, H])."""
        batch = self.input_batch
        specs = [batch.states[row].spec for row in rows.tolist()]
        req_ids, spans, params = self.pooler.requests_to_pool(specs, completes, batch.num_computed_tokens[rows],
                                                              query_start_loc)
        if not req_ids:
            return {}
        self.faults.check("pool", req_ids)
        return dict(zip(req_ids, self.pooler(hidden, spans, params)))

    def _sample(self, logits: torch.Tensor, rows: np.ndarray, drafts: list[list[int]]) -> VerifiedTokens:
        """One token per row from the sampler, or, when a row verifies drafts, the rejection
        sampler's tokens for every row."""
        if any(drafts):
            return self.rejection_sampler(logits, rows, drafts, self.input_batch, self._uniforms)
        sampled = self.sampler(logits, self.input_batch.sampling_metadata(rows, self._uniforms(rows, 0)))
        return VerifiedTokens([[token_id] for token_id in sampled.sampled_token_ids.tolist()],
                              [[logprobs] for logprobs in sampled.logprobs])

    def _adapters(self, rows: np.ndarray, num_scheduled: np.ndarray):
        """The rows' adapters for the forward inside the ``with`` (nothing without LoRA)."""
        if self.lora is None:
            return contextlib.nullcontext()
        return self.lora.activate(self.input_batch.lora_key[rows], num_scheduled)

    def _flat_batch(self, rows: np.ndarray, num_scheduled: np.ndarray, samples: np.ndarray,
                    num_logits: np.ndarray | None = None):
        batch = self.input_batch
        seq_lens = batch.num_computed_tokens[rows] + num_scheduled
        short = batch.num_blocks[rows] * self.block_size < seq_lens
        if short.any():
            row = int(rows[short][0])
            raise ValueError(f"request {batch.req_ids[row]}: {batch.num_blocks[row]} blocks of {self.block_size} "
                             f"tokens cannot hold {seq_lens[short][0]} tokens (a scheduler bug)")
        width = max(1, -(-int(seq_lens.max()) // self.block_size))
        # Every row in order (the usual step): views, not copies of the [rows, max_model_len] tokens.
        rows = slice(0, len(rows)) if np.array_equal(rows, np.arange(len(rows))) else rows
        return make_flat_batch(batch.token_ids[rows], batch.num_computed_tokens[rows], num_scheduled,
                               batch.block_table[rows, :width], self.block_size, samples, num_logits)

    def _commit(self, result: _RowsResult, output: ModelRunnerOutput) -> None:
        """Append each request's last sampled token to the batch (accepted drafts are already
        there) and report its tokens."""
        batch = self.input_batch
        self._num_succeeded += len(result.rows)
        for row, token_ids, logprobs in zip(result.sampling_rows.tolist(), result.token_ids, result.logprobs):
            req_id = batch.req_ids[row]
            batch.append_token(row, token_ids[-1])
            output.sampled_token_ids[req_id] = token_ids
            if logprobs[0] is not None:
                output.logprobs[req_id] = logprobs
        output.prompt_logprobs.update(result.prompt_logprobs)
        output.pooler_output.update(result.pooled)

    # -- sampling inputs ---------------------------------------------------------------------------

    def _uniforms(self, sampling_rows: np.ndarray, position: int = 0) -> torch.Tensor | None:
        """float64 ``[S]`` draws for the random rows at draft position ``position``
        (``draw_uniforms``), taken once per step, request and position: a request run again after
        a failed group reuses its numbers, and a seeded request draws one number per token from its
        own generator, with or without drafts."""
        batch = self.input_batch
        greedy = batch.greedy[sampling_rows].tolist()
        if all(greedy):
            return None
        req_ids = [batch.req_ids[row] for row in sampling_rows.tolist()]
        drawn = self._step_uniforms
        missing = [i for i, (req_id, g) in enumerate(zip(req_ids, greedy))
                   if not g and len(drawn.get(req_id, ())) <= position]
        if missing:
            generators = [batch.states[int(sampling_rows[i])].generator for i in missing]
            draws = draw_uniforms([False] * len(missing), generators, self.generator, self.device).tolist()
            for i, u in zip(missing, draws):
                drawn.setdefault(req_ids[i], []).append(u)
        values = [0.0 if g else drawn[req_id][position] for req_id, g in zip(req_ids, greedy)]
        return torch.tensor(values, dtype=torch.float64, device=self.device)

    # -- persistent batch ----------------------------------------------------------------------------

    def _update_states(self, scheduler_output: SchedulerOutput, output: ModelRunnerOutput) -> None:
        """Apply the scheduler's news: drop finished and preempted requests, take in new ones,
        extend block tables, and give rows to exactly the requests scheduled now."""
        batch = self.input_batch
        for req_id in scheduler_output.finished_req_ids:
            self.generators.pop(req_id, None)
        for req_id in scheduler_output.finished_req_ids | scheduler_output.preempted_req_ids:
            self.requests.pop(req_id, None)
            if req_id in batch.req_id_to_index:
                batch.remove(req_id)
        for new in scheduler_output.scheduled_new_reqs:
            self.requests[new.req_id] = self._new_state(new)
        cached = scheduler_output.scheduled_cached_reqs
        requests, rows, computed = self.requests, batch.req_id_to_index, batch.num_computed_tokens
        for req_id, new_block_ids, num_computed in zip(cached.req_ids, cached.new_block_ids,
                                                       cached.num_computed_tokens):
            state = requests[req_id]
            state.num_computed_tokens = num_computed
            row = rows.get(req_id)
            if new_block_ids:
                state.block_ids.extend(new_block_ids)
                if row is not None:
                    batch.append_block_ids(row, new_block_ids)
            if row is not None:
                computed[row] = num_computed
        scheduled = scheduler_output.num_scheduled_tokens
        for req_id in [r for r in batch.req_id_to_index if r not in scheduled]:
            batch.remove(req_id)  # running but not scheduled now: keeps its state, not its row
        batch.condense()
        for req_id in scheduled:
            if req_id not in batch.req_id_to_index:
                self._add_row(req_id, output)
        batch.condense()
        for req_id, drafts in scheduler_output.scheduled_spec_decode_tokens.items():
            row = batch.req_id_to_index.get(req_id)
            if row is not None:
                batch.set_draft_tokens(row, drafts)

    def _new_state(self, new: NewRequestData) -> CachedRequestState:
        spec = new.spec
        params = spec.sampling_params
        generator = self.generators.get(spec.request_id)
        if generator is None and params.seed is not None and not params.is_greedy:
            generator = self.generators[spec.request_id] = request_generator(params.seed, self.device)
        return CachedRequestState(spec, list(new.output_token_ids), list(new.block_ids), new.num_computed_tokens,
                                  generator=generator)

    def _add_row(self, req_id: str, output: ModelRunnerOutput) -> None:
        """Give a scheduled request a row; a request whose row cannot be built fails alone."""
        batch = self.input_batch
        try:
            self.faults.check("prepare", [req_id])
            state = self.requests[req_id]
            if state.spec.lora_request is not None:
                if self.lora is None:
                    raise ValueError(f"request {req_id} asks for LoRA adapter {state.spec.lora_request.lora_name!r} "
                                     "but LoRA is not enabled")
                self.lora.ensure_loaded(state.spec.lora_request)  # a folder that cannot be read fails this request
                state.lora_key = self.lora.key_of(state.spec.lora_request)
            batch.add(state)
        except Exception as exc:  # noqa: BLE001 - this request's failure, not the step's
            logger.exception("request %s failed entering the batch; the others go on", req_id)
            output.errors[req_id] = f"{type(exc).__name__}: {exc}"
            if req_id in batch.req_id_to_index:
                batch.remove(req_id)

    # -- for tests and benchmarks ------------------------------------------------------------------

    @torch.inference_mode()
    def forward(self, token_ids: list[list[int]], block_tables: list[list[int]],
                num_computed: list[int] | None = None, lora_requests: list | None = None) -> list[torch.Tensor]:
        """Run requests' tokens through the model as one flat batch, outside the persistent batch
        (no sampling): returns each request's logits ``[num_new_tokens, V]`` (model dtype). With
        ``num_computed``, request ``i`` computes ``token_ids[i][num_computed[i]:]`` against the K/V
        of its first ``num_computed[i]`` tokens already in its blocks; with ``lora_requests``,
        request ``i`` runs with adapter ``lora_requests[i]`` (None: the base model)."""
        num_computed_arr = np.array(num_computed or [0] * len(token_ids), dtype=np.int64)
        lengths = np.array([len(t) for t in token_ids], dtype=np.int64)
        width_tokens = int(lengths.max())
        tokens = np.zeros((len(token_ids), width_tokens), dtype=np.int64)
        for i, ids in enumerate(token_ids):
            tokens[i, : len(ids)] = ids
        width_blocks = max(len(b) for b in block_tables)
        tables = np.zeros((len(block_tables), width_blocks), dtype=np.int64)
        for i, ids in enumerate(block_tables):
            tables[i, : len(ids)] = ids
        num_new = lengths - num_computed_arr
        flat = make_flat_batch(tokens, num_computed_arr, num_new, tables, self.block_size,
                               np.zeros(len(token_ids), dtype=bool))
        inputs = to_model_inputs(flat, self.device)
        adapters = contextlib.nullcontext()
        if lora_requests is not None:
            for lora in lora_requests:
                if lora is not None:
                    self.lora.ensure_loaded(lora)
            keys = np.array([self.lora.key_of(lora) for lora in lora_requests], dtype=np.int64)
            adapters = self.lora.activate(keys, num_new)
        with adapters:
            hidden = self._hidden(inputs)
        logits = self.model.compute_logits(hidden)
        starts = flat.query_start_loc.tolist()
        return [logits[starts[i] : starts[i + 1]] for i in range(len(token_ids))]
