"""``kvserve bench compare``: every engine x load level, one engine at a time, then its probes.

    for engine in spec.engines:                     (only_if failing -> skipped, recorded)
        start it (start command; cold start = start to first token) or wait until it answers
        record its provenance (/version, /v1/models, commands, machine)
        each load level not already stored: kvserve.bench.runner.run_serve -> cells/ENGINE/LEVEL.json
        each probe not already stored                                    -> probes/ENGINE/PROBE.json
        stop it (only what this tool started)
    the report from the stored files (kvserve.bench.compare.analysis)

A failure inside one engine (it does not start, a command fails) is recorded in its
``engines/NAME.json`` and the run goes on with the next engine. A rich progress bar counts cells
and probes; one line per finished cell gives its headline numbers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import shlex
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kvserve.bench.client import RequestFuncInput, get_json
from kvserve.bench.compare import probes as probe_mod
from kvserve.bench.compare.engine_process import EngineProcess
from kvserve.bench.compare.probe_client import read_gauges, wait_first_token
from kvserve.bench.compare.spec import CompareSpec, EngineSpec
from kvserve.bench.compare.store import Store, level_label, level_slug
from kvserve.bench.compare.workload import build_requests
from kvserve.bench.metrics import calculate_metrics
from kvserve.bench.prompts import load_tokenizer
from kvserve.bench.provenance import collect_provenance, cpu_model, server_info
from kvserve.bench.report import _jsonable, serve_run_to_dict
from kvserve.bench.runner import ServeConfig, ServeRun, run_serve
from kvserve.errors import InvalidRequestError
from kvserve.net import nodelay_transport

LEVEL_SEED_STRIDE = 100  # level i draws its prompts with seed + 100 * i; warmups with that + 1
PERCENTILES = (50.0, 90.0, 99.0)


@dataclass
class EngineRun:
    """One engine while it is measured."""

    spec: CompareSpec
    engine: EngineSpec
    store: Store
    client: httpx.AsyncClient
    headers: dict[str, str]
    model: str
    tokenizer: Any
    max_model_len: int | None
    roofline: bool = True  # False: --no-roofline
    peaks: Any = None  # the machine probe (kvserve.bench.machine_probe), taken after this engine's first cell


def tool_repo() -> str:
    """The folder of this kvserve's source checkout (the git state a compare result records),
    whatever the cwd: a spec's folder need not be a repository."""
    import kvserve

    return str(Path(kvserve.__file__).resolve().parents[2])


def engine_headers(engine: EngineSpec, environ: Mapping[str, str]) -> dict[str, str]:
    """``Authorization: Bearer`` from ``api_key`` or the variable ``api_key_env`` names.

    Raises:
        InvalidRequestError: ``api_key_env`` names an unset variable.
    """
    key = engine.api_key
    if engine.api_key_env is not None:
        key = environ.get(engine.api_key_env)
        if not key:
            raise InvalidRequestError(f"engine {engine.name}: api_key_env {engine.api_key_env} is not set", "spec")
    return {"Authorization": f"Bearer {key}"} if key else {}


def resolve_tokenizer(spec: CompareSpec, served_model: str | None, cache: dict[str, Any],
                      served_root: str | None = None) -> Any:
    """The spec's tokenizer folder, else the server's model folder (``served_root``: the ``root``
    of its ``/v1/models`` card, when that folder is on this machine), else the built-in model's
    when the built-in model is served.

    Raises:
        InvalidRequestError: no local tokenizer for this model.
    """
    path = spec.model.tokenizer
    if path is None and served_root is not None and Path(served_root).is_dir():
        path = served_root
    if path is None:
        from kvserve.builtin import BUILTIN_MODEL_NAME, builtin_model_path

        if BUILTIN_MODEL_NAME not in (served_model, spec.model.name):
            raise InvalidRequestError(f"model.tokenizer is required: {served_model!r} is not the built-in model and "
                                      "the server names no folder on this machine for it; give the local folder "
                                      "of its tokenizer", "spec")
        path = str(builtin_model_path())
    if path not in cache:
        tokenizer = load_tokenizer(path)
        tokenizer.model_max_length = 1 << 60  # over-long prompts are built on purpose: no warning
        cache[path] = tokenizer
    return cache[path]


def _flags(command: str | None) -> list[str]:
    if not command:
        return []
    words = shlex.split(command)
    first = next((i for i, w in enumerate(words) if w.startswith("--")), len(words))  # past `python -m x`
    return words[first:]


def _machine(engine: EngineSpec) -> str:
    if engine.machine:
        return engine.machine
    host = urlparse(engine.base_url).hostname or ""
    if host in ("127.0.0.1", "localhost", "::1") or host.startswith("127."):
        import os
        import platform

        return f"this machine: {platform.node()}, {cpu_model()}, {os.cpu_count()} CPUs"
    return "not recorded (set machine: in the spec)"


async def engine_provenance(run: EngineRun, models: Any) -> dict[str, Any]:
    server = await server_info(run.client)
    version = server.version if isinstance(server.version, dict) else {}
    gauges, gauge_error = await read_gauges(run.client, run.engine.metrics_url)
    e = run.engine
    return {"name": e.name, "base_url": e.base_url, "model": run.model, "served_models": models,
            "max_model_len": run.max_model_len, "version": server.version, "version_error": server.version_error,
            "commit": version.get("commit") or e.commit, "dirty": version.get("dirty"),
            "start": e.start, "stop": e.stop, "restart": e.restart, "flags": _flags(e.start),
            "metrics_url": e.metrics_url, "metrics_readable": not gauge_error, "metrics_error": gauge_error,
            "extra_body": e.extra_body, "count_output_tokens": e.count_output_tokens, "machine": _machine(e),
            "notes": e.notes}


def _count_requested(run: ServeRun, samples: list) -> ServeRun:
    """``count_output_tokens: max_tokens``: outputs without server usage count their max_tokens."""
    for i, out in enumerate(run.outputs):
        if out.success and out.output_tokens_source == "tokenizer":
            out.output_tokens, out.output_tokens_source = samples[i % len(samples)].expected_output_len, "max_tokens"
    metrics = calculate_metrics(run.outputs, run.metrics.duration_s, run.config.percentiles,
                                run.config.goodput_slos_ms)
    return dataclasses.replace(run, metrics=metrics)


def serve_config(run: EngineRun, index: int, load: float) -> ServeConfig:
    spec, engine = run.spec, run.engine
    closed = spec.load.axis == "concurrency"
    sampling = {"temperature": spec.requests.temperature} if spec.requests.temperature is not None else {}
    return ServeConfig(
        base_url=engine.base_url, model=run.model, headers=run.headers,
        request_rate=math.inf if closed else load, burstiness=spec.load.arrival.shape,
        max_concurrency=int(load) if closed else spec.load.max_concurrency, num_warmups=spec.load.warmup_requests,
        seed=spec.requests.seed + LEVEL_SEED_STRIDE * index, duration_s=spec.load.duration_s,
        ignore_eos=spec.requests.ignore_eos, extra_body={**sampling, **engine.extra_body},
        request_id_prefix=f"compare-{engine.name}-{level_slug(spec.load.axis, load)}-", percentiles=PERCENTILES,
        goodput_slos_ms={m: s.limit_ms for m, s in spec.slos.items().items() if m != "itl"},
        request_timeout_s=spec.load.request_timeout_s, disable_tqdm=True)


async def run_cell(run: EngineRun, index: int, load: float, key: str) -> dict[str, Any]:
    """One engine at one load level; the stored cell."""
    spec = run.spec
    seed = spec.requests.seed + LEVEL_SEED_STRIDE * index
    samples = await asyncio.to_thread(build_requests, spec.requests, run.tokenizer, spec.load.requests_per_level, seed)
    warmups = None
    if spec.load.warmup_requests:
        warmups = await asyncio.to_thread(build_requests, spec.requests, run.tokenizer, spec.load.warmup_requests,
                                          seed + 1)
    result = await run_serve(serve_config(run, index, load), samples, run.tokenizer, warmups)
    if run.engine.count_output_tokens == "max_tokens":
        result = _count_requested(result, samples)
    roofline = await cell_roofline(run, result)
    peaks = None if roofline.peaks is None else roofline.peaks.to_dict()
    return _jsonable({"key": key, "engine": run.engine.name, "axis": spec.load.axis, "load": load,
                      "label": level_label(spec.load.axis, load), "seed": seed, **serve_run_to_dict(result),
                      "roofline": roofline.to_dict(),
                      "provenance": collect_provenance(result.server, tool_repo(), machine_peaks=peaks).to_dict()})


async def cell_roofline(run: EngineRun, result: ServeRun):
    """The cell against its roofline bound (``kvserve.bench.roofline_report``); the machine is
    probed once per engine, after its first cell (the engine idle), in a worker thread."""
    from kvserve.bench.roofline_report import RunEngine, completed_lengths, online_roofline, probe_for, server_engine

    engine = None
    if run.roofline:
        engine = server_engine(run.engine.base_url, result.server.version, run.model)
        if isinstance(engine, str) and run.spec.model.tokenizer:  # the tokenizer folder may hold the config
            engine = server_engine(run.engine.base_url, result.server.version, run.spec.model.tokenizer)
    if isinstance(engine, RunEngine) and run.peaks is None:
        run.peaks = await asyncio.to_thread(probe_for, engine)
    return online_roofline(engine, run.peaks, completed_lengths(result.outputs), result.metrics.duration_s,
                           result.config.max_concurrency)


def cell_line(cell: dict[str, Any]) -> str:
    m = cell["metrics"]
    fraction = (cell.get("roofline") or {}).get("fraction")
    roofline = f" ({fraction:.2f} of the roofline)" if isinstance(fraction, float) else ""
    return (f"{cell['engine']} {cell['label']}: {m['completed']}/{cell['num_requests']} ok, "
            f"{m['output_throughput']:.1f} out tok/s{roofline}, TTFT p99 {m['ttft_ms']['percentiles'].get('99.0', 0):.0f} ms, "
            f"TPOT p99 {m['tpot_ms']['percentiles'].get('99.0', 0):.1f} ms")


def _probe_context(run: EngineRun) -> probe_mod.ProbeContext:
    sampling = {"temperature": run.spec.requests.temperature} if run.spec.requests.temperature is not None else {}
    template = RequestFuncInput(prompt="", prompt_len=0, output_len=1, model=run.model, ignore_eos=True,
                                extra_body={**sampling, **run.engine.extra_body})
    return probe_mod.ProbeContext(run.client, template, run.tokenizer, run.max_model_len, run.spec.probes,
                                  run.engine.metrics_url, run.spec.requests.seed + 7919)


async def run_probe(run: EngineRun, name: str, process: EngineProcess) -> dict[str, Any]:
    ctx = _probe_context(run)
    if name == "restart":
        if run.engine.restart is None:
            return probe_mod.skipped("no restart command in the spec")
        return await probe_mod.restart(ctx, process, run.engine.ready_timeout_s)
    return await getattr(probe_mod, name)(ctx)


class Compare:
    """One ``bench compare`` invocation (see the module docstring)."""

    def __init__(self, spec: CompareSpec, spec_path: Path, out: Path, environ: Mapping[str, str],
                 engines: list[str] | None = None, fresh: bool = False, probes: bool = True,
                 console: Console | None = None, roofline: bool = True):
        self.spec, self.spec_path, self.store = spec, spec_path, Store(out)
        self.environ, self.fresh, self.with_probes, self.roofline = environ, fresh, probes, roofline
        self.console = console or Console()
        self.engines = [e for e in spec.engines if engines is None or e.name in engines]
        self.tokenizers: dict[str, Any] = {}
        unknown = sorted(set(engines or []) - {e.name for e in spec.engines})
        if unknown:
            raise InvalidRequestError(f"--engines names no engine of the spec: {', '.join(unknown)}", "engines")

    def _probe_names(self, engine: EngineSpec) -> list[str]:
        if not self.with_probes:
            return []
        names = [p for p in probe_mod.PROBES if getattr(self.spec.probes, p).enabled and p != "cold_start"]
        if self.spec.probes.cold_start.enabled and engine.start is not None:
            names.append("cold_start")
        return names

    def todo(self, engine: EngineSpec) -> tuple[list[tuple[int, float, str]], list[tuple[str, str]]]:
        """Cells ``(index, load, key)`` and probes ``(name, key)`` still to measure."""
        cells, probes = [], []
        for i, load in enumerate(self.spec.load.levels):
            key = Store.cell_key(self.spec, engine, i)
            if self.fresh or not self.store.done(self.store.cell_path(engine.name, level_slug(self.spec.load.axis,
                                                                                                load)), key):
                cells.append((i, load, key))
        for name in self._probe_names(engine):
            key = Store.probe_key(self.spec, engine, name)
            if self.fresh or not self.store.done(self.store.probe_path(engine.name, name), key):
                probes.append((name, key))
        return cells, probes

    def _only_if(self, engine: EngineSpec) -> str:
        if engine.only_if is None:
            return ""
        result = subprocess.run(engine.only_if, shell=True, cwd=self.spec_path.parent, capture_output=True,
                                text=True, timeout=60)
        return "" if result.returncode == 0 else f"only_if failed ({engine.only_if!r} exited {result.returncode})"

    async def run(self) -> int:
        """Measure what is missing, then write the report; returns the exit code (0: every engine
        measured or skipped by only_if, 1: some engine failed)."""
        self.store.root.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.spec_path, self.store.root / "spec.yaml")
        plans = {e.name: self.todo(e) for e in self.engines}
        total = sum(len(c) + len(p) for c, p in plans.values())
        failed = False
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=self.console, transient=False) as progress:
            task = progress.add_task("bench compare", total=total)
            for engine in self.engines:
                cells, probes = plans[engine.name]
                skip = self._only_if(engine)
                if skip:
                    self.store.write(self.store.engine_path(engine.name), {"name": engine.name, "skipped": skip})
                    progress.console.print(f"[yellow]{engine.name}: skipped, {skip}[/yellow]")
                    progress.advance(task, len(cells) + len(probes))
                    continue
                if not cells and not probes:
                    progress.console.print(f"{engine.name}: every cell and probe already stored")
                    continue
                ok = await self._engine(engine, cells, probes, progress, task)
                failed = failed or not ok
        from kvserve.bench.compare.analysis import write_reports

        paths = write_reports(self.spec, self.store, self.engines)
        self.console.print("report: " + ", ".join(str(p) for p in paths))
        return 1 if failed else 0

    async def _start(self, engine: EngineSpec, client: httpx.AsyncClient, process: EngineProcess,
                     model: str | None) -> tuple[float | None, str]:
        """Start the engine (if it has a start command) and wait for a first token:
        ``(cold start seconds or None, error)``."""
        started = process.start() if engine.start is not None else None
        alive = (lambda: process.exited() is None) if started is not None else None
        model = model or await self._served_model(client, engine.ready_timeout_s, alive)
        if model is None:
            return None, f"no model listed by /v1/models within {engine.ready_timeout_s:g} s"
        probe = RequestFuncInput(prompt="Hello", prompt_len=1, output_len=1, model=model, ignore_eos=True)
        first, error = await wait_first_token(client, probe, engine.ready_timeout_s, alive=alive)
        if first is None:
            return None, error + (f"; log tail:\n{process.log_tail()}" if started is not None else "")
        return (first - started if started is not None else None), ""

    async def _served_model(self, client: httpx.AsyncClient, timeout_s: float, alive: Any) -> str | None:
        deadline = time.perf_counter() + timeout_s
        while time.perf_counter() < deadline and (alive is None or alive()):
            models, _ = await get_json(client, "/v1/models")
            try:
                return models["data"][0]["id"]
            except (TypeError, KeyError, IndexError):
                await asyncio.sleep(0.25)
        return None

    async def _engine(self, engine: EngineSpec, cells: list, probes: list, progress: Progress, task: Any) -> bool:
        process = EngineProcess(engine, self.spec_path.parent, self.store.log_path(engine.name))
        headers = engine_headers(engine, self.environ)
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        model = engine.model or self.spec.model.name
        try:
            async with httpx.AsyncClient(base_url=engine.base_url, headers=headers, transport=nodelay_transport(limits),
                                         timeout=httpx.Timeout(self.spec.load.request_timeout_s)) as client:
                progress.update(task, description=f"{engine.name}: starting")
                cold_s, error = await self._start(engine, client, process, model)
                if error:
                    raise RuntimeError(f"engine did not answer: {error}")
                run = await self._engine_run(engine, client, headers, model)
                if any(name == "cold_start" for name, _ in probes):
                    key = dict(probes)["cold_start"]
                    self.store.write(self.store.probe_path(engine.name, "cold_start"),
                                     {"key": key, **probe_mod.cold_start_result(cold_s, error, engine.start)})
                    progress.advance(task)
                for index, load, key in cells:
                    progress.update(task, description=f"{engine.name}: {level_label(self.spec.load.axis, load)}")
                    cell = await run_cell(run, index, load, key)
                    self.store.write(self.store.cell_path(engine.name, level_slug(self.spec.load.axis, load)), cell)
                    progress.console.print(cell_line(cell), soft_wrap=True)
                    progress.advance(task)
                for name, key in probes:
                    if name == "cold_start":
                        continue
                    progress.update(task, description=f"{engine.name}: probe {name}")
                    result = await run_probe(run, name, process)
                    self.store.write(self.store.probe_path(engine.name, name), _jsonable({"key": key, **result}))
                    progress.console.print(f"{engine.name} {name}: {result['outcome']}: {result['summary']}", soft_wrap=True,
                                           markup=False)
                    progress.advance(task)
            return True
        except Exception as exc:  # noqa: BLE001 - one engine's failure is recorded, the others still run
            message = f"{type(exc).__name__}: {exc}"
            progress.console.print(f"[red]{engine.name}: {message}[/red]", markup=True, highlight=False)
            previous = self.store.read(self.store.engine_path(engine.name)) or {"name": engine.name}
            self.store.write(self.store.engine_path(engine.name), {**previous, "error": message})
            return False
        finally:
            if engine.start is not None:
                await asyncio.to_thread(process.stop)

    async def _engine_run(self, engine: EngineSpec, client: httpx.AsyncClient, headers: dict[str, str],
                          model: str | None) -> EngineRun:
        models, _ = await get_json(client, "/v1/models")
        cards = models.get("data", []) if isinstance(models, dict) else []
        served = [c.get("id") for c in cards if isinstance(c, dict)]
        model = model or (served[0] if served else None)
        if model is None:
            raise RuntimeError("no model: the spec names none and /v1/models lists none")
        card = next((c for c in cards if c.get("id") == model), cards[0] if cards else {})
        max_len = card.get("max_model_len") if isinstance(card, dict) else None
        root = card.get("root") if isinstance(card, dict) and isinstance(card.get("root"), str) else None
        tokenizer = await asyncio.to_thread(resolve_tokenizer, self.spec, model, self.tokenizers, root)
        run = EngineRun(self.spec, engine, self.store, client, headers, model, tokenizer,
                        max_len or self.spec.model.max_model_len, self.roofline)
        self.store.write(self.store.engine_path(engine.name), _jsonable(await engine_provenance(run, served)))
        return run
