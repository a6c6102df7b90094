"""The output folder of ``bench compare``, and what makes a run resumable.

    OUT/
      spec.yaml                      the spec as run (copied at every start)
      engines/<engine>.json          provenance: /version, /v1/models, commands, machine; or why skipped
      cells/<engine>/<level>.json    one load level's result (kvserve bench serve's data + provenance)
      probes/<engine>/<probe>.json   one failure-mode probe
      logs/<engine>.log              the output of the engine's start/stop/restart commands
      compare.json  report.md  report.html   written from the files above at the end

A cell or probe file records the key (a SHA-256 of every spec field that changes its
measurement); a later run keeps a file whose key matches and measures again otherwise. SLOs and
capacity are not in the keys: the report recomputes them from the stored per-request numbers.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from kvserve.bench.compare.spec import CompareSpec, EngineSpec

_PROVENANCE_ONLY = {"commit", "machine", "notes", "only_if", "ready_timeout_s"}


def _digest(parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def level_slug(axis: str, load: float) -> str:
    """``c8`` for concurrency 8, ``r2.5`` for 2.5 requests/s."""
    return f"c{int(load)}" if axis == "concurrency" else f"r{load:g}"


def level_label(axis: str, load: float) -> str:
    return f"c={int(load)}" if axis == "concurrency" else f"{load:g} req/s"


class Store:
    """Reads and writes the files of one output folder."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def cell_path(self, engine: str, slug: str) -> Path:
        return self.root / "cells" / engine / f"{slug}.json"

    def probe_path(self, engine: str, probe: str) -> Path:
        return self.root / "probes" / engine / f"{probe}.json"

    def engine_path(self, engine: str) -> Path:
        return self.root / "engines" / f"{engine}.json"

    def log_path(self, engine: str) -> Path:
        return self.root / "logs" / f"{engine}.log"

    @staticmethod
    def cell_key(spec: CompareSpec, engine: EngineSpec, index: int) -> str:
        return _digest([engine.model_dump(exclude=_PROVENANCE_ONLY), spec.model.model_dump(),
                        spec.requests.model_dump(), spec.load.model_dump(), index])

    @staticmethod
    def probe_key(spec: CompareSpec, engine: EngineSpec, probe: str) -> str:
        return _digest([engine.model_dump(exclude=_PROVENANCE_ONLY), spec.model.model_dump(),
                        getattr(spec.probes, probe).model_dump(), spec.probes.canary.model_dump()])

    def read(self, path: Path) -> dict[str, Any] | None:
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def done(self, path: Path, key: str) -> bool:
        """Whether ``path`` holds a finished result of this key."""
        data = self.read(path)
        return data is not None and data.get("key") == key

    def write(self, path: Path, data: dict[str, Any]) -> Path:
        """Write JSON atomically (a half-written file never counts as a finished cell)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
        tmp.replace(path)
        return path
