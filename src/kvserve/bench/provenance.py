"""Where a benchmark result came from. Every result file carries one :class:`Provenance`; the
writer in ``kvserve.bench.report`` refuses to write a result without it.

Nothing here raises for a missing piece of information: an unreachable ``/version`` or a cwd that
is not a git repository is recorded as an error string, so the gap is visible in the file.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib.metadata
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import httpx

from kvserve.bench.client import get_json


@dataclass(frozen=True)
class ServerInfo:
    """What the server says about itself. ``version`` is the JSON of ``GET /version``;
    ``model`` the first id of ``GET /v1/models``; the ``*_error`` fields say why one is missing."""

    base_url: str
    version: Any
    version_error: str
    model: str | None
    models_error: str


@dataclass(frozen=True)
class Provenance:
    """Command line, code, software and machine of one result.

    Attributes:
        command: ``sys.argv`` as run, ``--header`` values redacted.
        timestamp: UTC, ISO 8601.
        git_commit: ``git rev-parse HEAD`` of the cwd's repository (None with ``git_error``).
        git_dirty: whether tracked files differ from ``HEAD`` (``git status --porcelain
            --untracked-files=no`` lists anything; None if unknown).
        kvserve_version, python_version, torch_version: software versions ('' if not installed).
        cpu_model: ``model name`` from /proc/cpuinfo (else ``platform.processor()``).
        cpu_count: logical CPUs (``os.cpu_count()``).
        hostname, platform: ``platform.node()`` and ``platform.platform()``.
        server: the server's self-description, None for offline runs.
        machine_peaks: the roofline probe's figures (``kvserve.bench.machine_probe.MachinePeaks``:
            bandwidth GB/s, matmul TFLOP/s, threads), None when it did not run.
    """

    command: list[str]
    timestamp: str
    git_commit: str | None
    git_dirty: bool | None
    git_error: str
    kvserve_version: str
    python_version: str
    torch_version: str
    cpu_model: str
    cpu_count: int
    hostname: str
    platform: str
    server: ServerInfo | None
    machine_peaks: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _git(*args: str, cwd: str | None = None) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True, timeout=10,
                          cwd=cwd).stdout.strip()


def git_state(cwd: str | None = None) -> tuple[str | None, bool | None, str]:
    """``(commit, dirty, error)`` of the repository containing ``cwd`` (default: the cwd)."""
    try:
        commit = _git("rev-parse", "HEAD", cwd=cwd)
        dirty = bool(_git("status", "--porcelain", "--untracked-files=no", cwd=cwd))
    except (OSError, subprocess.SubprocessError) as exc:
        stderr = getattr(exc, "stderr", "") or ""
        return None, None, f"{type(exc).__name__}: {stderr.strip() or exc}"
    return commit, dirty, ""


def cpu_model() -> str:
    """The CPU's marketing name."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return ""


async def server_info(client: httpx.AsyncClient) -> ServerInfo:
    """Ask the server for ``/version`` and ``/v1/models`` (never raises)."""
    version, version_error = await get_json(client, "/version")
    models, models_error = await get_json(client, "/v1/models")
    model = None
    if models is not None:
        try:
            model = models["data"][0]["id"]
        except (KeyError, IndexError, TypeError):
            models_error = f"unexpected /v1/models body: {str(models)[:300]}"
    return ServerInfo(str(client.base_url), version, version_error, model, models_error)


def redact_command(argv: list[str]) -> list[str]:
    """``argv`` with the values of ``--header KEY=VALUE`` items replaced (they may hold API keys;
    vLLM redacts ``header`` too)."""
    out, in_header = [], False
    for arg in argv:
        if arg.startswith("-"):
            in_header = arg == "--header"
            out.append(arg)
        elif in_header and "=" in arg:
            out.append(arg.split("=", 1)[0] + "=<redacted>")
        else:
            out.append(arg)
    return out


def collect_provenance(server: ServerInfo | None, repo: str | None = None,
                       machine_peaks: dict[str, Any] | None = None) -> Provenance:
    """Provenance of a run started now by this process; the git state is that of ``repo``
    (default: the cwd's repository); ``machine_peaks``: the roofline probe's figures."""
    import kvserve

    commit, dirty, git_error = git_state(repo)
    return Provenance(
        command=redact_command(list(sys.argv)),
        timestamp=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        git_commit=commit,
        git_dirty=dirty,
        git_error=git_error,
        kvserve_version=kvserve.__version__,
        python_version=platform.python_version(),
        torch_version=_package_version("torch"),
        cpu_model=cpu_model(),
        cpu_count=os.cpu_count() or 0,
        hostname=platform.node(),
        platform=platform.platform(),
        server=server,
        machine_peaks=machine_peaks,
    )
