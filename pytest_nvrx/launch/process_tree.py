"""The process tree of one run: every process it started, found and stopped.

ft_launcher starts its workers in sessions of their own and, when the harness dies, they are
reparented to init: parent links alone do not find them. Every process of a run therefore
carries the run's tag in its environment (:data:`TAG_VAR`), and :func:`kill_tree` stops what
the parent links find below the launcher and what carries the tag, wherever it lives now.
psutil reads the links, the environments, the states and the groups, and waits; the tag sweep
stays ours: no parent link leads to a reparented worker (tests/launch/test_harness_death.py, where
the harness is SIGKILLed and its workers are found by the tag alone). Used by
:mod:`pytest_nvrx.launch.launcher` and by the run's watchdog (:mod:`pytest_nvrx.launch.watchdog`).
No pytest.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import psutil

#: the environment variable that tags every process of one launch
TAG_VAR = "PYTEST_NVRX_RUN_TAG"

#: what a process that vanished or is not ours to read raises; it is then not in the tree
_GONE = (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess)


def descendants(root: int) -> set[int]:
    """PIDs below ``root`` (by parent links) at this instant."""
    try:
        return {child.pid for child in psutil.Process(root).children(recursive=True)}
    except _GONE:
        return set()


def tagged(tag: str) -> set[int]:
    """Live processes whose environment carries this run's tag (orphans included)."""
    me = os.getpid()
    found = set()
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        with contextlib.suppress(*_GONE):
            if proc.environ().get(TAG_VAR) == tag:
                found.add(proc.pid)
    return found


def _alive(pid: int) -> bool:
    """Running, sleeping or stopped: anything but gone or a zombie waiting for its parent."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except _GONE:
        return False


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
            if psutil.pid_exists(root):
                pids.add(root)
        return {p for p in pids if _alive(p)}

    def send(sig: signal.Signals, pids: set[int]) -> None:
        # each group too: a worker's own children (torch's, a checkpoint writer) live there
        groups = set()
        for pid in pids:
            with contextlib.suppress(OSError):
                pgid = os.getpgid(pid)
                if pgid > 1 and pgid != os.getpgrp():
                    groups.add(pgid)
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
        # psutil waits for these (a child of ours is reaped; others are polled), new ones are
        # found on the next pass
        procs = []
        for pid in pids:
            with contextlib.suppress(*_GONE):
                procs.append(psutil.Process(pid))
        psutil.wait_procs(procs, timeout=min(poll_s, max(deadline - time.monotonic(), 0)))
    for _ in range(50):
        pids = targets()
        if not pids:
            break
        signalled |= pids
        send(signal.SIGKILL, pids)
        time.sleep(poll_s)
    return signalled
