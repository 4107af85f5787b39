"""Child processes of the harness: start, wait for readiness, stop (and wait for the PID), keep logs.

Every wait is bounded. Children get PR_SET_PDEATHSIG so that even a pytest killed with SIGKILL does
not leave an apiserver holding ports behind; normal teardown stops them explicitly and waits.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, TypeVar

T = TypeVar("T")

_PR_SET_PDEATHSIG = 1


def run_build_script(script: Path, args: Sequence[str] = (), *, cwd: Path, error: type[Exception],
                     timeout: float = 3600.0) -> Path:
    """Run one of scripts/build-*.sh (a no-op when its output is cached) and return the executable it
    names on its last line of output; any failure is raised as ``error`` with the log's tail."""
    try:
        res = subprocess.run(["bash", str(script), *args], capture_output=True, text=True, timeout=timeout,
                             cwd=cwd)
    except subprocess.TimeoutExpired as exc:
        raise error(f"{script} did not finish within {timeout:.0f}s") from exc
    if res.returncode != 0:
        tail = "\n".join((res.stdout + res.stderr).strip().splitlines()[-40:])
        raise error(f"{script} failed ({res.returncode}):\n{tail}")
    lines = res.stdout.strip().splitlines()
    path = Path(lines[-1]) if lines else Path()
    if not lines or not os.access(path, os.X_OK):
        raise error(f"{script} reported {path}, which is not an executable file")
    return path


class ComponentError(RuntimeError):
    """A component failed to start, died, or did not become ready in time."""


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    # Linux only; elsewhere the harness still stops children in teardown, just not on a hard kill.
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now.

    The OS picks it (bind to port 0). Between closing this probe socket and the component binding
    the port another process could take it; on a test machine that window is negligible, and a
    component that fails to bind fails its readiness wait with its log attached.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_is_free(port: int) -> bool:
    """True if a server could listen on 127.0.0.1:``port`` now.

    SO_REUSEADDR as every server here sets it (Go, uvicorn): connections of a killed process linger
    in TIME_WAIT and would otherwise make a free port look taken.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def tail(path: Path, lines: int = 60, max_bytes: int = 64_000) -> str:
    """The last ``lines`` lines of a log file (reads at most ``max_bytes`` from its end)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(data.splitlines()[-lines:])


class Component:
    """One long-running child process whose stdout+stderr go to a log file (appended across restarts)."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = env
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.stopped = False  # stopped on purpose by the harness: not a crash
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        if self.alive():
            raise ComponentError(f"{self.name} is already running (pid {self.pid})")
        self.starts += 1
        self.stopped = False
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self._log.write(f"\n===== harness: start #{self.starts}: {' '.join(self.argv)}\n".encode())
        self._log.flush()
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=self.cwd,
            # preexec_fn is unsafe only with threads forking concurrently; the harness starts
            # children from the main thread. PDEATHSIG fires when that thread exits.
            preexec_fn=_die_with_parent,
        )

    def stop(self, timeout: float = 30.0, sig: signal.Signals = signal.SIGTERM) -> None:
        """Signal the process and wait for the PID to exit (SIGKILL after ``timeout``).

        Waiting matters: an apiserver restarted before the old PID exits fails with
        "address already in use" (docs/control-plane.md, section 1).
        """
        proc = self.proc
        if proc is None:
            return
        self.stopped = True
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait(timeout=30)
        self._note(f"stopped with {sig.name}, exit code {proc.returncode}")
        if self._log is not None:
            self._log.close()
            self._log = None

    def kill(self) -> None:
        """Crash the process (SIGKILL) and wait for it to be gone."""
        self.stop(timeout=10.0, sig=signal.SIGKILL)

    def _note(self, text: str) -> None:
        if self._log is not None and not self._log.closed:
            self._log.write(f"===== harness: {text}\n".encode())
            self._log.flush()

    def check_alive(self) -> None:
        """Raise, with the log's tail, if the process died without the harness stopping it."""
        if self.proc is not None and not self.stopped and self.proc.poll() is not None:
            raise ComponentError(
                f"{self.name} exited with code {self.proc.returncode}; log {self.log_path}:\n"
                + tail(self.log_path, 40)
            )

    def tail(self, lines: int = 60) -> str:
        return tail(self.log_path, lines)


def wait_until(
    check: Callable[[], T | None],
    timeout: float,
    what: str,
    interval: float = 0.1,
    watch: Sequence[Component] = (),
) -> T:
    """Poll ``check`` until it returns something other than None/False; bounded by ``timeout``.

    Exceptions from ``check`` count as "not yet" (a port not listening yet), but the last one is
    reported. A component in ``watch`` that dies ends the wait at once, with its log in the error.
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        for c in watch:
            c.check_alive()
        try:
            value = check()
        except Exception as exc:
            last_exc = exc
            value = None
        if value is not None and value is not False:
            return value
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_exc!r})" if last_exc else ""
            logs = "".join(f"\n--- last lines of {c.name} log {c.log_path}:\n{c.tail(30)}" for c in watch)
            raise ComponentError(f"timed out after {timeout:.0f}s waiting for {what}{detail}{logs}")
        time.sleep(interval)
