"""Test support for signal tests: start a child the way a shell would, find what it left behind.

Every process a test starts carries ``NVRX_TEST_MARK=<uuid>`` in its environment; the launcher
copies its environment to all it starts, so the mark finds the whole run (the launcher, its log
server, rank monitors and workers in their own sessions, orphans included) without knowing the
run's own tag.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path

MARK_VAR = "NVRX_TEST_MARK"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def new_mark() -> str:
    return uuid.uuid4().hex


def marked_env(mark: str) -> dict[str, str]:
    return {**os.environ, MARK_VAR: mark}


def dispositions(sigint: str) -> Callable[[], None]:
    """A ``preexec_fn`` that gives the child default dispositions for the stop signals, as a
    login shell would, except SIGINT ``"ignored"`` (how ``cmd &`` in a script, nohup setups and
    some CI runners start jobs). Without it a child inherits whatever ignores this test process
    was started with."""

    def preexec() -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        if sigint == "ignored":
            signal.signal(signal.SIGINT, signal.SIG_IGN)

    return preexec


def marked(mark: str) -> dict[int, str]:
    """Live (non-zombie) processes carrying the mark: pid -> command line."""
    needle = f"{MARK_VAR}={mark}".encode()
    found: dict[int, str] = {}
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit() or int(pid_dir.name) == os.getpid():
            continue
        try:
            env = (pid_dir / "environ").read_bytes().split(b"\0")
            stat = (pid_dir / "stat").read_bytes()
            cmd = (pid_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in env and stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] != b"Z":
            found[int(pid_dir.name)] = cmd[:160]
    return found


def wait_none_marked(mark: str, timeout: float = 15.0) -> dict[int, str]:
    """Wait until no process carries the mark; return the survivors (empty when none)."""
    deadline = time.monotonic() + timeout
    left = marked(mark)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = marked(mark)
    return left


def kill_marked(mark: str) -> None:
    """SIGKILL every marked process and its group (cleanup after a failed test)."""
    for _ in range(20):
        pids = marked(mark)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
