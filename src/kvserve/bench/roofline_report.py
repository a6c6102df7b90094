"""A benchmark run against its roofline bound: the line every ``kvserve bench`` mode prints and the
``roofline`` object its result file holds (the bound itself: ``kvserve.bench.roofline``; the probe:
``kvserve.bench.machine_probe``)::

    Roofline: bound 1026.1 output tok/s (7.98 s = prefill 2.41 s + 127 decode steps 5.57 s, batch <= 64,
      bfloat16; 25.0 GB/s, bfloat16 matmul 2.80 TFLOP/s (2 threads)); measured 408.2 output tok/s
      = 0.40 of the bound
    Roofline: not computed: the server at 10.0.0.5 is not on this machine (its bandwidth and matmul
      peak cannot be measured from here)

The fraction is ``bound_s / elapsed_s``: the same for the request, output and total token
throughputs of the run, which share its tokens and its time. A bound needs the model's shapes
(a local ``config.json``), the serving format (dtype, quantization, KV cache dtype) and the
machine's peaks, measured here in the same run; when one is missing the result says which,
instead of a number. Facts a server did not report (a non-kvserve server's dtype, its batch
limit) are assumed and listed under ``assumed``.
"""

from __future__ import annotations

import dataclasses
import socket
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvserve.bench.machine_probe import MachinePeaks, probe_machine
from kvserve.bench.roofline import ServingFormat, WorkloadBound, model_cost, quantization_from_label, workload_bound
from kvserve.errors import CheckpointError
from kvserve.model.arch_config import ModelArchConfig

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1", "0.0.0.0", "::")


@dataclass(frozen=True)
class RunEngine:
    """What the bound needs to know about the engine of a run.

    Attributes:
        model_dir: local folder with the model's ``config.json``.
        format: how the engine holds the model.
        max_num_seqs: most requests the engine runs at once (None = not known).
        device: where it runs (``cpu``, ``cuda:0``); the probe measures this device.
        assumed: the facts that were not reported by the engine but assumed (e.g. ``dtype``).
    """

    model_dir: str
    format: ServingFormat
    max_num_seqs: int | None
    device: str = "cpu"
    assumed: tuple[str, ...] = ()

    @property
    def arch(self) -> ModelArchConfig:
        return ModelArchConfig.from_file(Path(self.model_dir) / "config.json")


@dataclass(frozen=True)
class RooflineResult:
    """One run against its bound, or the reason there is none (``reason``)."""

    elapsed_s: float
    output_tokens: int
    bound: WorkloadBound | None = None
    engine: RunEngine | None = None
    cap: int | None = None
    peaks: MachinePeaks | None = None
    reason: str = ""

    @property
    def fraction(self) -> float | None:
        """``bound_s / elapsed_s`` (1.0 = at the roofline), None without a bound."""
        if self.bound is None or self.elapsed_s <= 0:
            return None
        return self.bound.bound_s / self.elapsed_s

    def to_dict(self) -> dict[str, Any]:
        """The ``roofline`` object of a result file (the probe's figures go to the provenance)."""
        measured = self.output_tokens / self.elapsed_s if self.elapsed_s > 0 else None
        out: dict[str, Any] = {"fraction": self.fraction, "measured_output_throughput": measured,
                               "elapsed_s": self.elapsed_s, "reason": self.reason or None}
        if self.bound is not None:
            out.update(bound_s=self.bound.bound_s, bound_output_throughput=self.bound.output_throughput,
                       **dataclasses.asdict(self.bound), cap=self.cap)
        if self.engine is not None:
            out.update(model=self.engine.model_dir, format=self.engine.format.label, device=self.engine.device,
                       assumed=list(self.engine.assumed))
        return out

    def line(self) -> str:
        """The printed line (module docstring)."""
        if self.bound is None:
            return f"Roofline: not computed: {self.reason}"
        b, fmt = self.bound, self.engine.format
        assumed = f", assumed {', '.join(self.engine.assumed)}" if self.engine.assumed else ""
        measured = self.output_tokens / self.elapsed_s
        return (f"Roofline: bound {b.output_throughput:.1f} output tok/s ({b.bound_s:.2f} s = prefill "
                f"{b.prefill_s:.2f} s + {b.decode_steps} decode steps {b.decode_s:.2f} s, batch <= {self.cap}, "
                f"{fmt.label}{assumed}; {self.peaks.describe(fmt.dtype)}); measured {measured:.1f} output tok/s "
                f"= {self.fraction:.2f} of the bound")


def probe_for(engine: RunEngine) -> MachinePeaks:
    """The machine probe on ``engine``'s device, with its model's MLP shape and its dtype."""
    arch = engine.arch
    return probe_machine(arch.hidden_size, arch.intermediate_size, (engine.format.dtype,), device=engine.device)


def roofline_of(engine: RunEngine, peaks: MachinePeaks, requests: Sequence[tuple[int, int]], cap: int,
                elapsed_s: float) -> RooflineResult:
    """The run of ``requests`` (``(prompt_len, output_len)`` each, as served) in ``elapsed_s``
    with at most ``cap`` requests at once, against its bound."""
    cost = model_cost(engine.arch, engine.format)
    bound = workload_bound(cost, peaks, engine.format.dtype, requests, cap)
    return RooflineResult(elapsed_s, bound.output_tokens, bound, engine, cap, peaks)


def not_computed(reason: str, elapsed_s: float, output_tokens: int) -> RooflineResult:
    return RooflineResult(elapsed_s, output_tokens, reason=reason)


def engine_from_facts(facts: dict[str, Any], model_dir: str, assumed: Sequence[str] = ()) -> RunEngine:
    """A :class:`RunEngine` from ``EngineCore.serving_facts``' dict (also the
    ``engine`` object of a kvserve server's ``/version``).

    Raises:
        ValueError: a dtype, quantization or KV cache dtype the bound does not know.
    """
    fmt = ServingFormat(facts["dtype"], quantization_from_label(facts.get("quantization"), model_dir),
                        facts.get("kv_cache_dtype") or "auto")
    return RunEngine(model_dir, fmt, facts.get("max_num_seqs"), facts.get("device") or "cpu", tuple(assumed))


def _model_folder(*candidates: str | None) -> str | None:
    for candidate in candidates:
        if candidate and (Path(candidate) / "config.json").is_file():
            return candidate
    return None


def is_local_url(url: str) -> bool:
    """Whether ``url``'s host is this machine (loopback, or this host's name)."""
    host = (urllib.parse.urlsplit(url).hostname or "").lower()
    return host in LOOPBACK_HOSTS or host.startswith("127.") or host in (socket.gethostname().lower(),
                                                                       socket.getfqdn().lower())


def server_engine(base_url: str, version: Any, model_id: str | None) -> RunEngine | str:
    """What is known of a server's engine, or why no bound can be computed (a string).

    The machine must be this one (the probe runs here), the model's ``config.json`` local
    (``model_id`` as a folder, else the folder the server's ``/version`` names). A kvserve
    server reports its dtype, quantization, KV cache dtype and ``max_num_seqs`` in ``/version``;
    for other servers the dtype kvserve would choose on this machine is assumed, float weights,
    a KV cache in that dtype and no batch limit besides the client's.
    """
    if not is_local_url(base_url):
        host = urllib.parse.urlsplit(base_url).hostname
        return (f"the server at {host} is not on this machine (its bandwidth and matmul peak cannot be measured "
                "from here)")
    facts = version.get("engine") if isinstance(version, dict) else None
    folder = _model_folder(model_id, (facts or {}).get("model"), _builtin_folder(model_id))
    if folder is None:
        return (f"the model's config.json is not local (give --model as the served model's folder; got "
                f"{model_id!r})")
    try:
        if facts:
            return engine_from_facts(facts, folder)
        return _assumed_engine(version, folder)
    except (ValueError, KeyError, CheckpointError) as exc:
        return f"the server's format is not one the bound knows: {exc}"


def _assumed_engine(version: Any, folder: str) -> RunEngine:
    """A server that does not report its engine: what kvserve would run on this machine (the
    dtype ``--dtype auto`` picks here, a GPTQ/AWQ checkpoint's own quantization)."""
    from kvserve.model.loader import default_dtype_for_device  # noqa: PLC0415 - torch

    from kvserve.checkpoint_quantization import read_checkpoint_quantization  # noqa: PLC0415

    dtype = str(default_dtype_for_device(folder, "cpu")).removeprefix("torch.")
    reported = isinstance(version, dict) and "quantization" in version
    checkpoint = read_checkpoint_quantization(folder)  # a GPTQ/AWQ checkpoint runs as one
    quant = None if checkpoint is None else checkpoint.label + ("+lm_head" if checkpoint.lm_head else "")
    facts = {"dtype": dtype, "quantization": version["quantization"] if reported else quant,
             "kv_cache_dtype": "auto", "max_num_seqs": None}
    return engine_from_facts(facts, folder, ["dtype", "kv_cache_dtype", "max_num_seqs"]
                             + ([] if reported else ["quantization"]))


def _builtin_folder(model_id: str | None) -> str | None:
    from kvserve.builtin import BUILTIN_MODEL_NAME, builtin_model_path  # noqa: PLC0415

    if model_id and BUILTIN_MODEL_NAME in (model_id, Path(model_id).name):
        return str(builtin_model_path())
    return None


def offline_roofline(facts: dict[str, Any] | None, model: str, requests: Sequence[tuple[int, int]],
                     elapsed_s: float, enabled: bool = True) -> RooflineResult:
    """``bench throughput``: the in-process engine's run against its bound, the probe run now
    (after the run, in the engine's process and threads). ``facts``: ``serving_facts`` of the
    engine (None: a stand-in engine that reports none)."""
    output_tokens = sum(o for _, o in requests)
    if not enabled:
        return not_computed("--no-roofline", elapsed_s, output_tokens)
    if facts is None:
        return not_computed("the engine did not report how it holds the model", elapsed_s, output_tokens)
    folder = _model_folder(facts.get("model"), model)
    if folder is None:
        return not_computed(f"no config.json in {model}", elapsed_s, output_tokens)
    try:
        engine = engine_from_facts(facts, folder)
    except (ValueError, KeyError, CheckpointError) as exc:
        return not_computed(f"the engine's format is not one the bound knows: {exc}", elapsed_s, output_tokens)
    return roofline_of(engine, probe_for(engine), requests, engine.max_num_seqs or max(1, len(requests)), elapsed_s)


def online_roofline(engine: RunEngine | str | None, peaks: MachinePeaks | None, requests: Sequence[tuple[int, int]],
                    elapsed_s: float, max_concurrency: int | None) -> RooflineResult:
    """``bench serve`` / ``sweep``: a run of ``requests`` (the completed ones) against its bound.
    ``engine``: from :func:`server_engine`, the reason there is none, or None with
    ``--no-roofline``; ``peaks``: :func:`probe_for` it, once for the whole command. At most
    ``max_concurrency`` (the client's cap) and the server's ``max_num_seqs`` run at once."""
    output_tokens = sum(o for _, o in requests)
    if engine is None:
        return not_computed("--no-roofline", elapsed_s, output_tokens)
    if isinstance(engine, str) or peaks is None:
        return not_computed(engine or "the machine was not probed", elapsed_s, output_tokens)
    caps = [c for c in (max_concurrency, engine.max_num_seqs) if c]
    return roofline_of(engine, peaks, requests, min(caps) if caps else max(1, len(requests)), elapsed_s)


def completed_lengths(outputs: Sequence[Any]) -> list[tuple[int, int]]:
    """``(prompt_len, output_tokens)`` of the successful requests of an online run, in start order."""
    return [(o.prompt_len, o.output_tokens or 0) for o in sorted(outputs, key=lambda o: o.start_time) if o.success]
