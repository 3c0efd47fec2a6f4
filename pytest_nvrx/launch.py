"""Start a recipe as a process tree, follow its progress, and always stop the whole tree.

ft_launcher starts its workers in new sessions and a gRPC log server beside them, so neither the
launcher's PID nor its process group covers everything it started. Every process of a run
inherits a unique tag in its environment; cleanup signals the launcher's group, the groups of
all descendants, and every process still carrying the tag (orphans included).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from pytest_nvrx.layout import RESULT_NAME as RESULT_NAME  # re-exported: launch.RESULT_NAME
from pytest_nvrx.layout import RunLayout
from pytest_nvrx.recipe import Recipe, manifest, utc_now, write_json_atomic

TAG_VAR = "PYTEST_NVRX_RUN_TAG"
CONSOLE_LOG_NAME = "launcher.console.log"
_ITERATION = re.compile(rb"iteration\s+(\d+)\s*/\s*(\d+)")


class RunTimeout(RuntimeError):
    """The run outlived its deadline; the tree was killed. The message carries a hint."""


@dataclass(frozen=True)
class Progress:
    """What can be seen of a live run from its run directory."""

    elapsed_s: float
    cycles: int
    iteration: int | None
    total: int | None
    fault_injected: bool

    def describe(self) -> str:
        it = f"iteration {self.iteration}/{self.total}" if self.iteration is not None else "setup"
        fault = ", fault injected" if self.fault_injected else ""
        return f"[{self.elapsed_s:6.1f}s] cycle {max(self.cycles - 1, 0)}, {it}{fault}"


@dataclass(frozen=True)
class RunResult:
    exit_code: int | None
    wall_s: float
    timed_out: bool
    interrupted: bool
    start_time: str
    end_time: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "exit_code": self.exit_code,
            "wall_s": round(self.wall_s, 3),
            "timed_out": self.timed_out,
            "interrupted": self.interrupted,
            "start_time": self.start_time,
            "end_time": self.end_time,
        }


# ---------------------------------------------------------------------------------------------
# process tree


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


# ---------------------------------------------------------------------------------------------
# progress


def _tail(path: Path, size: int = 65536) -> bytes:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            end = fh.tell()
            fh.seek(max(0, end - size))
            return fh.read()
    except OSError:
        return b""


def read_progress(layout: RunLayout, elapsed_s: float) -> Progress:
    logs = sorted(layout.logs.glob("train_cycle*.log"), key=_cycle_number)
    iteration = total = None
    for log in reversed(logs):
        matches = _ITERATION.findall(_tail(log))
        if matches:
            iteration, total = int(matches[-1][0]), int(matches[-1][1])
            break
    return Progress(
        elapsed_s=elapsed_s,
        cycles=len(logs),
        iteration=iteration,
        total=total,
        fault_injected=layout.marker.exists(),
    )


def _cycle_number(path: Path) -> int:
    m = re.search(r"cycle(\d+)", path.name)
    return int(m.group(1)) if m else -1


def tail_text(path: Path, lines: int = 40) -> str:
    data = _tail(path, 256 * 1024).decode("utf-8", errors="replace").splitlines()
    return "\n".join(data[-lines:])


# ---------------------------------------------------------------------------------------------
# a running launch


class Launch:
    """A launched recipe. Use as a context manager: leaving it always kills the whole tree."""

    def __init__(self, recipe: Recipe, *, stack: Mapping[str, Any] | None = None) -> None:
        self.recipe = recipe
        self.layout = recipe.layout
        self.tag = uuid.uuid4().hex
        self.console = self.layout.logs / CONSOLE_LOG_NAME
        self._stack = stack
        self._popen: subprocess.Popen[bytes] | None = None
        self._console_fh: IO[bytes] | None = None
        self._t0 = 0.0
        self._start_time = ""

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen is not None else None

    def start(self) -> Launch:
        man = manifest(self.recipe, stack=self._stack)
        target = self.layout.manifest
        if self.recipe.config.nnodes > 1 and target.exists():
            # another node of this run wrote run.json first: keep ours beside it
            target = target.with_name(f"run.{man['host']}.json")
        write_json_atomic(target, man)
        env = dict(os.environ)
        env.update(self.recipe.env)
        env[TAG_VAR] = self.tag
        self.layout.tmp.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._console_fh = self.console.open("ab")
        self._start_time = utc_now()
        self._t0 = time.monotonic()
        try:
            self._popen = subprocess.Popen(
                self.recipe.argv,
                stdin=subprocess.DEVNULL,
                stdout=self._console_fh,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=str(self.layout.run_dir),
                start_new_session=True,
            )
        except OSError as exc:
            self._console_fh.close()
            raise RuntimeError(f"cannot start {self.recipe.argv[0]!r}: {exc}") from exc
        return self

    def __enter__(self) -> Launch:
        return self.start() if self._popen is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self, grace_s: float = 5.0) -> None:
        kill_tree(self.pid, self.tag, grace_s=grace_s)
        if self._popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._popen.wait(timeout=grace_s)
        if self._console_fh is not None:
            self._console_fh.close()
            self._console_fh = None
        if self._popen is not None:
            # the per-run TMPDIR holds only the launcher's sockets and scratch files
            shutil.rmtree(self.layout.tmp, ignore_errors=True)

    def progress(self) -> Progress:
        return read_progress(self.layout, time.monotonic() - self._t0)

    def wait(
        self,
        timeout_s: float,
        *,
        on_progress: Callable[[Progress], None] | None = None,
        poll_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> RunResult:
        """Wait for the launcher to exit; on timeout or Ctrl-C kill the tree and say so."""
        assert self._popen is not None, "start() first"
        deadline = clock() + timeout_s
        last: tuple[int, int | None, bool] | None = None
        timed_out = interrupted = False
        try:
            while self._popen.poll() is None:
                if clock() >= deadline:
                    timed_out = True
                    break
                if on_progress is not None:
                    prog = self.progress()
                    key = (prog.cycles, prog.iteration, prog.fault_injected)
                    if key != last:
                        last = key
                        on_progress(prog)
                sleep(poll_s)
        except KeyboardInterrupt:
            interrupted = True
            raise
        finally:
            if timed_out or interrupted or self._popen.poll() is None:
                self.stop()
            result = RunResult(
                exit_code=self._popen.poll(),
                wall_s=time.monotonic() - self._t0,
                timed_out=timed_out,
                interrupted=interrupted,
                start_time=self._start_time,
                end_time=utc_now(),
            )
            write_json_atomic(self.layout.run_dir / RESULT_NAME, result.as_dict())
        # The launcher exited: its workers, monitors and log server must be gone too.
        self.stop(grace_s=2.0)
        if timed_out:
            raise RunTimeout(
                f"run {self.recipe.config.run_id} did not finish within {timeout_s:.0f}s; "
                f"its process tree was killed. Last progress: {self.progress().describe()}\n"
                f"--- tail of {self.console} ---\n{tail_text(self.console)}\n"
                "Hint: raise the run timeout, or look at logs/launcher.log and the newest "
                "logs/train_cycle<N>.log in the run directory."
            )
        return result


@contextlib.contextmanager
def launched(recipe: Recipe, *, stack: Mapping[str, Any] | None = None) -> Iterator[Launch]:
    with Launch(recipe, stack=stack) as launch:
        yield launch
