"""An engine's life under ``bench compare``: its ``start``/``stop``/``restart`` shell commands.

    start  ──► Popen(shell, own process group, output to logs/<engine>.log)
    stop   ──► the ``stop`` command if given, then SIGTERM to the start command's process group,
               SIGKILL after ``STOP_GRACE_S`` (only the group this tool started)
    restart──► ``stop-start``: stop, then start; else the ``restart`` command (env ``ENGINE_PID`` =
               the start command's process id, also its group id), which must return once the
               old server is down or restarting

Commands run from the spec file's folder with the tool's environment. Readiness is not judged by
the process: the caller polls the API until a request gets its first token.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from kvserve.bench.compare.spec import STOP_START, EngineSpec

STOP_GRACE_S = 20.0
COMMAND_TIMEOUT_S = 300.0


class EngineProcess:
    """One engine's processes. ``started_at`` is the ``time.perf_counter()`` of the last start."""

    def __init__(self, spec: EngineSpec, cwd: Path, log_path: Path):
        self.spec, self.cwd, self.log_path = spec, cwd, log_path
        self.proc: subprocess.Popen | None = None
        self.started_at: float | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def exited(self) -> int | None:
        """The start command's exit code once it has exited (None while it runs or never ran)."""
        return self.proc.poll() if self.proc is not None else None

    def start(self) -> float:
        """Run the ``start`` command in its own process group; returns its start time.

        Raises:
            ValueError: the engine has no start command.
        """
        if self.spec.start is None:
            raise ValueError(f"engine {self.spec.name} has no start command")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("a", encoding="utf-8") as log:
            log.write(f"$ {self.spec.start}\n")
            log.flush()
            self.started_at = time.perf_counter()
            self.proc = subprocess.Popen(self.spec.start, shell=True, cwd=self.cwd, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        return self.started_at

    def _run(self, command: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "ENGINE_PID": str(self.pid or "")}
        with self.log_path.open("a", encoding="utf-8") as log:
            log.write(f"$ {command}\n")
            log.flush()
            return subprocess.run(command, shell=True, cwd=self.cwd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                  timeout=COMMAND_TIMEOUT_S)

    def stop(self) -> None:
        """The ``stop`` command (if any), then end the started process group if it still runs."""
        if self.spec.stop is not None:
            self._run(self.spec.stop)
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass

    def restart(self) -> None:
        """Restart as the spec says (``stop-start`` or the ``restart`` command).

        Raises:
            ValueError: the engine has no restart command.
            subprocess.CalledProcessError: the restart command failed.
        """
        if self.spec.restart is None:
            raise ValueError(f"engine {self.spec.name} has no restart command")
        if self.spec.restart == STOP_START:
            self.stop()
            self.start()
            return
        result = self._run(self.spec.restart)
        result.check_returncode()

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-chars:]
        except OSError:
            return ""
