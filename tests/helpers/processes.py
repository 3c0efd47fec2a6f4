"""Test support for signal tests: start a child the way a shell would, find what it left behind.

Every process a test starts carries ``NVRX_TEST_MARK=<uuid>`` in its environment; the launcher
copies its environment to all it starts, so the mark finds the whole run (the launcher, its log
server, rank monitors and workers in their own sessions, orphans included) without knowing the
run's own tag.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def stop(
    proc: subprocess.Popen[bytes], sig: signal.Signals, mark: str, *, repeat: bool, within: float
) -> tuple[int | None, dict[int, str]]:
    """Send ``sig`` (again every 0.1 s while it runs when ``repeat``: more of the same during
    the cleanup, as CI runners and impatient users do), wait up to ``within`` seconds for it to
    exit; return its exit status (None: still running) and the marked processes left."""
    proc.send_signal(sig)
    deadline = time.monotonic() + within
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
        if repeat:
            proc.send_signal(sig)
    return proc.poll(), wait_none_marked(mark, timeout=5.0)


def stopped_run(run_dir: Path, returncode: int | None, left: dict[int, str]) -> dict[str, Any]:
    """What a stopped run left behind, as one comparable record."""
    result = run_dir / "result.json"
    tmpdir = Path(json.loads((run_dir / "run.json").read_text())["env"]["TMPDIR"])
    return {
        "exit": returncode,
        "processes left": len(left),
        "interrupted": json.loads(result.read_text())["interrupted"]
        if result.is_file()
        else "(no result.json)",
        "TMPDIR left": tmpdir.exists(),
    }
