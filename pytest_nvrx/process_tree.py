"""The process tree of one run: every process it started, found and stopped.

ft_launcher starts its workers in sessions of their own and, when the harness dies, they are
reparented to init: parent links alone do not find them. Every process of a run therefore
carries the run's tag in its environment (:data:`TAG_VAR`), and :func:`kill_tree` stops what
the parent links find below the launcher and what carries the tag, wherever it lives now. Used
by :mod:`pytest_nvrx.launch` and by the run's watchdog (:mod:`pytest_nvrx.watchdog`). No pytest.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

#: the environment variable that tags every process of one launch
TAG_VAR = "PYTEST_NVRX_RUN_TAG"


def _proc_ppid_pgid(pid: int) -> tuple[int, int] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # the command name may hold spaces and parentheses: split after the last ')'
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[1]), int(fields[2])


def _all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def descendants(root: int) -> set[int]:
    """PIDs below ``root`` (by parent links) at this instant."""
    children: dict[int, list[int]] = {}
    for pid in _all_pids():
        info = _proc_ppid_pgid(pid)
        if info is not None:
            children.setdefault(info[0], []).append(pid)
    found: set[int] = set()
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def tagged(tag: str) -> set[int]:
    """Live processes whose environment carries this run's tag (orphans included)."""
    needle = f"{TAG_VAR}={tag}".encode()
    me = os.getpid()
    found = set()
    for pid in _all_pids():
        if pid == me:
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            found.add(pid)
    return found


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return True
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] == b"Z"


def kill_tree(root: int | None, tag: str, *, grace_s: float = 5.0, poll_s: float = 0.1) -> set[int]:
    """SIGTERM the run's groups and processes, wait ``grace_s``, then SIGKILL what is left.

    Stopped processes (a SIGSTOPped rank) also get SIGCONT so that SIGTERM can act. Returns the
    PIDs that were signalled.
    """
    signalled: set[int] = set()

    def targets() -> set[int]:
        pids = tagged(tag)
        if root is not None:
            pids |= descendants(root)
            if _proc_ppid_pgid(root) is not None:
                pids.add(root)
        return {p for p in pids if not _is_zombie(p)}

    def send(sig: signal.Signals, pids: set[int]) -> None:
        groups = set()
        for pid in pids:
            info = _proc_ppid_pgid(pid)
            if info is not None and info[1] > 1 and info[1] != os.getpgrp():
                groups.add(info[1])
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    pids = targets()
    if not pids:
        return signalled
    signalled |= pids
    send(signal.SIGTERM, pids)
    send(signal.SIGCONT, pids)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        pids = targets()
        if not pids:
            return signalled
        signalled |= pids
        time.sleep(poll_s)
    for _ in range(50):
        pids = targets()
        if not pids:
            break
        signalled |= pids
        send(signal.SIGKILL, pids)
        time.sleep(poll_s)
    return signalled
