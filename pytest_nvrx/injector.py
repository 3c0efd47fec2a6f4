"""Once-only fault injector that wraps the training entry point inside every worker.

ft_launcher is given the absolute path of this file as its training script::

    injector.py --checkpoint-dir D --fault-marker F --fault kill --fault-rank 1 \
        --script /meg/pretrain_gpt.py -- <workload args>

Every rank runs the workload unmodified, in-process, through :mod:`runpy`. On the selected rank
(``RANK == --fault-rank`` and ``--fault`` is not ``none``) a daemon thread polls Megatron's
checkpoint tracker. Once the tracker moves past the iteration seen at start, the thread claims the
marker file exclusively (shared storage makes the claim visible to replacement workers, which then
never inject again), makes it durable, and only then signals its own process: SIGKILL for
``kill``, SIGSTOP for ``hang``, SIGTERM for ``term``, SIGSEGV for ``segv`` (with core dumps
switched off first: the crash is ours, its core file would only fill the disk).

This file must stay stdlib-only and runnable as a plain script (ft_launcher runs it with
``python -u``), so it imports nothing from pytest_nvrx and repeats the one file name it needs
(the tracker; the marker path comes from the command line).

Exit codes of the wrapper itself (the workload's own status passes through otherwise):

* 2 -- bad command line or environment, unusable tracker, or a non-regular file (symlink,
  directory, ...) at the marker path; reported before the workload starts.
* 3 -- the workload finished normally on the selected rank but the requested fault never happened.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import errno
import json
import os
import re
import resource
import runpy
import signal
import socket
import stat
import sys
import threading
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

# Megatron's checkpoint tracker, repeated from pytest_nvrx.layout (stdlib-only module).
TRACKER_NAME: Final = "latest_checkpointed_iteration.txt"

LOG_PREFIX: Final = "[pytest-nvrx injector]"
MARKER_SCHEMA_VERSION: Final = 1
DEFAULT_POLL_INTERVAL_S: Final = 0.05
# An advance is acted on only when a second read this much later agrees, so a marker never records
# the prefix of a tracker caught mid-write (Megatron writes it with a plain open/write).
CONFIRM_DELAY_S: Final = 0.01
# GIL switch interval while the watcher reads the tracker or injects (Python's default is 5 ms).
WATCHER_SWITCH_INTERVAL_S: Final = 0.0001
# The tracker holds a few digits; never read more than this from whatever sits at its path.
TRACKER_MAX_BYTES: Final = 4096

EXIT_USAGE: Final = 2
EXIT_FAULT_NOT_INJECTED: Final = 3

FAULTS: Final = ("none", "kill", "hang", "term", "segv")
# Every fault is a signal to the selected rank's own pid. SIGTERM's default action ends the
# process (a workload that handles it decides itself); SIGSEGV's ends it as a native crash would,
# and a faulthandler the workload enabled dumps the stacks and re-raises it.
FAULT_SIGNALS: Final[Mapping[str, signal.Signals]] = {
    "kill": signal.SIGKILL,
    "hang": signal.SIGSTOP,
    "term": signal.SIGTERM,
    "segv": signal.SIGSEGV,
}
# Signals whose default action writes a core file; the injector switches that off before sending.
CORE_DUMPING_SIGNALS: Final = frozenset({signal.SIGSEGV})

_ITERATION_RE: Final = re.compile(r"[0-9]+")


class TrackerState(enum.Enum):
    OK = "ok"
    ABSENT = "absent"
    EMPTY = "empty"
    INVALID = "invalid"
    UNREADABLE = "unreadable"


@dataclass(frozen=True)
class TrackerRead:
    """One read of the tracker; ``iteration`` is set only when ``state`` is OK."""

    state: TrackerState
    iteration: int | None = None
    detail: str = ""

    def describe(self) -> str:
        if self.state is TrackerState.OK:
            return f"iteration {self.iteration}"
        return f"{self.state.value}{': ' + self.detail if self.detail else ''}"


class MarkerPathError(Exception):
    """The marker path holds something we must not write through (symlink, directory, ...)."""


@dataclass(frozen=True)
class Options:
    checkpoint_dir: str
    fault_marker: str
    fault: str
    fault_rank: int
    script: str | None
    module: str | None
    poll_interval: float
    workload_args: tuple[str, ...]

    @property
    def tracker(self) -> str:
        return os.path.join(self.checkpoint_dir, TRACKER_NAME)

    @property
    def workload_argv(self) -> list[str]:
        """The workload's sys.argv (a module's argv[0] is its name until runpy resolves it)."""
        entry = self.script if self.script is not None else self.module
        assert entry is not None
        return [entry, *self.workload_args]


def read_tracker(path: str) -> TrackerRead:
    """Read the tracker without raising: absent, empty, invalid and unreadable are states.

    Only plain non-negative decimal integers count; Megatron's ``release`` or a negative value is
    INVALID for our purpose (there is no iteration to compare with).
    """
    # Raw os calls: each gives up the GIL once and must win it back from the training thread,
    # so fewer calls make a faster poll. O_NONBLOCK keeps a FIFO at the path from blocking us.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            data = os.read(fd, TRACKER_MAX_BYTES + 1)
        finally:
            os.close(fd)
    except FileNotFoundError:
        return TrackerRead(TrackerState.ABSENT)
    except OSError as exc:
        return TrackerRead(TrackerState.UNREADABLE, detail=f"{type(exc).__name__}: {exc}")
    if len(data) > TRACKER_MAX_BYTES:
        return TrackerRead(TrackerState.INVALID, detail=f"longer than {TRACKER_MAX_BYTES} bytes")
    text = data.decode("ascii", errors="replace").strip()
    if not text:
        return TrackerRead(TrackerState.EMPTY, detail="no content")
    if _ITERATION_RE.fullmatch(text) is None:
        return TrackerRead(TrackerState.INVALID, detail=f"not an integer: {text[:40]!r}")
    return TrackerRead(TrackerState.OK, iteration=int(text))


class AdvanceDetector:
    """Turns a stream of tracker reads into one confirmed advance past the baseline.

    A read that is no advance (empty, partial, unreadable, at or below the baseline) only drops
    the pending candidate; the baseline itself never changes.
    """

    def __init__(self, baseline: int) -> None:
        self.baseline = baseline
        self.candidate: int | None = None

    def observe(self, read: TrackerRead) -> int | None:
        """Return the iteration to inject at, or None to keep polling."""
        if read.iteration is None or read.iteration <= self.baseline:
            self.candidate = None
            return None
        if read.iteration == self.candidate:
            return read.iteration
        self.candidate = read.iteration
        return None


def build_marker_record(
    *,
    fault: str,
    rank: int,
    tracker_iteration: int,
    baseline_iteration: int,
    tracker: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    pid: int,
    host: str,
    now: datetime,
) -> dict[str, Any]:
    """The marker's JSON content; every input is explicit so tests need no process state."""
    return {
        "schema_version": MARKER_SCHEMA_VERSION,
        "fault": fault,
        "signal": FAULT_SIGNALS[fault].name,
        "rank": rank,
        "local_rank": _env_int(env, "LOCAL_RANK"),
        "world_size": _env_int(env, "WORLD_SIZE"),
        "restart_count": _env_int(env, "TORCHELASTIC_RESTART_COUNT"),
        "run_id": env.get("NVRX_RUN_ID") or None,
        "pid": pid,
        "host": host,
        "tracker": tracker,
        "tracker_iteration": tracker_iteration,
        "baseline_iteration": baseline_iteration,
        "time": now.isoformat(),
        "argv": list(argv),
    }


def claim_marker(path: str, record: Mapping[str, Any]) -> bool:
    """Create the marker exclusively and make it durable; False when someone else holds it.

    O_EXCL refuses any existing path, a symlink included (dangling or not), and O_NOFOLLOW makes
    sure no link is ever followed: not at the path, and not at its directory, which is opened
    with O_NOFOLLOW first and the marker created relative to it (a symlinked run dir would send
    the marker into someone else's directory). A symlink or other non-regular file at the path,
    or a directory that is a symlink, raises MarkerPathError: nothing was written through it. An
    OSError while writing leaves the claimed (possibly partial) file behind and propagates.
    """
    parent = os.path.dirname(path) or "."
    try:
        dir_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(parent):
            raise MarkerPathError(
                f"the marker's directory {parent} is a symbolic link; not following it"
            ) from exc
        raise
    try:
        try:
            fd = os.open(
                os.path.basename(path),
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                0o644,
                dir_fd=dir_fd,
            )
        except FileExistsError:
            marker_exists(path)  # raises unless a regular file is there
            return False
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise MarkerPathError(
                    f"marker path {path} is a symbolic link; not following it"
                ) from exc
            raise
        try:
            data = (json.dumps(dict(record), indent=2, sort_keys=True) + "\n").encode()
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.fsync(dir_fd)  # the directory entry, durable too
        except OSError as exc:
            # Some file systems refuse fsync on directories (EINVAL); the file itself is durable.
            _log(None, f"warning: fsync of directory {parent} failed: {exc}")
    finally:
        os.close(dir_fd)
    return True


def marker_exists(path: str) -> bool:
    """Whether a marker (a regular file) is at ``path``; MarkerPathError for anything else."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode):
        raise MarkerPathError(
            f"marker path {path} is a {_file_kind(st.st_mode)}, not a regular file"
        )
    return True


def disable_core_dumps() -> str | None:
    """Lower this process's soft core-file limit to 0; the reason when that fails, else None.

    The kernel then writes no core file for the injected SIGSEGV (a core_pattern pipe helper
    receives the limit and is expected to honour it). The hard limit stays, so nothing the
    process could do before is taken away for good.
    """
    try:
        _, hard = resource.getrlimit(resource.RLIMIT_CORE)
        resource.setrlimit(resource.RLIMIT_CORE, (0, hard))
    except (OSError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def parse_args(argv: Sequence[str]) -> Options:
    """Parse the injector's options; everything after the first ``--`` belongs to the workload."""
    args = list(argv)
    if "--" in args:
        cut = args.index("--")
        own, workload = args[:cut], args[cut + 1 :]
    else:
        own, workload = args, []
    parser = argparse.ArgumentParser(
        prog="injector.py",
        description="Run a training entry point; inject one fault on one rank after the first "
        "checkpoint beyond the start-up tracker value. Workload arguments follow '--'.",
    )
    parser.add_argument("--checkpoint-dir", required=True, help="absolute checkpoint directory")
    parser.add_argument("--fault-marker", required=True, help="absolute path of the marker file")
    parser.add_argument("--fault", required=True, choices=FAULTS)
    parser.add_argument("--fault-rank", required=True, type=int, help="global rank to fault")
    entry = parser.add_mutually_exclusive_group(required=True)
    entry.add_argument("--script", help="training script, run as __main__")
    entry.add_argument("--module", help="training module, run like python -m")
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=DEFAULT_POLL_INTERVAL_S,
        help=f"seconds between tracker reads (default {DEFAULT_POLL_INTERVAL_S})",
    )
    ns = parser.parse_args(own)
    if not os.path.isabs(ns.checkpoint_dir):
        parser.error(f"--checkpoint-dir must be absolute, got {ns.checkpoint_dir!r}")
    if not os.path.isabs(ns.fault_marker):
        parser.error(f"--fault-marker must be absolute, got {ns.fault_marker!r}")
    if ns.fault_rank < 0:
        parser.error(f"--fault-rank must be >= 0, got {ns.fault_rank}")
    if not 0 < ns.poll_interval <= 60:
        parser.error(f"--poll-interval must be in (0, 60] seconds, got {ns.poll_interval}")
    if ns.script is not None and not os.path.isfile(ns.script):
        parser.error(f"--script {ns.script!r} is not a file")
    return Options(
        checkpoint_dir=ns.checkpoint_dir,
        fault_marker=ns.fault_marker,
        fault=ns.fault,
        fault_rank=ns.fault_rank,
        script=ns.script,
        module=ns.module,
        poll_interval=ns.poll_interval,
        workload_args=tuple(workload),
    )


class Watcher:
    """The polling thread of the selected rank, and what it did."""

    def __init__(self, opts: Options, rank: int, baseline: int) -> None:
        self.opts = opts
        self.rank = rank
        self.baseline = baseline
        self.stop = threading.Event()
        # Held from the claim to the signal: once main() holds it, no injection can start.
        self.lock = threading.Lock()
        self.injected = False
        self.error: str | None = None
        self.host = socket.gethostname()
        self.thread = threading.Thread(target=self._run, name="nvrx-fault-watcher", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def finish(self) -> None:
        """Stop polling; waits for an injection in progress (a resumed hang) to complete."""
        self.stop.set()
        with self.lock:
            pass

    def _run(self) -> None:
        try:
            self._poll()
        except BaseException:
            self.error = "watcher thread crashed:\n" + traceback.format_exc()
            _log(self.rank, self.error)

    def _poll(self) -> None:
        detector = AdvanceDetector(self.baseline)
        delay = self.opts.poll_interval
        # Waking up costs far more than the read (~5 us), so wait the cheapest way: time.sleep is
        # one clock_nanosleep where Event.wait builds a Condition. Stopping lags one interval.
        while True:
            time.sleep(delay)
            if self.stop.is_set():
                return
            with _prompt_gil_handoff():
                iteration = detector.observe(read_tracker(self.opts.tracker))
                if iteration is not None:
                    with self.lock:
                        if not self.stop.is_set():
                            self._claim_and_signal(iteration)
                    return
            pending = detector.candidate is not None
            delay = (
                min(CONFIRM_DELAY_S, self.opts.poll_interval)
                if pending
                else self.opts.poll_interval
            )

    def _claim_and_signal(self, iteration: int) -> None:
        opts = self.opts
        sig = FAULT_SIGNALS[opts.fault]
        record = build_marker_record(
            fault=opts.fault,
            rank=self.rank,
            tracker_iteration=iteration,
            baseline_iteration=self.baseline,
            tracker=opts.tracker,
            argv=opts.workload_argv,
            env=os.environ,
            pid=os.getpid(),
            host=self.host,
            now=datetime.now(UTC),
        )
        try:
            claimed = claim_marker(opts.fault_marker, record)
        except MarkerPathError as exc:
            self.error = f"{exc}; refusing to inject"
            _log(self.rank, f"ERROR: {self.error}")
            return
        except OSError as exc:
            self.error = f"could not write marker {opts.fault_marker}: {exc}; not injecting"
            _log(self.rank, f"ERROR: {self.error}")
            return
        if not claimed:
            _log(
                self.rank,
                f"marker {opts.fault_marker} appeared meanwhile; another process injected",
            )
            return
        self.injected = True
        if signal.getsignal(sig) == signal.SIG_IGN:
            _log(self.rank, f"warning: the workload ignores {sig.name}; it will have no effect")
        if sig in CORE_DUMPING_SIGNALS:
            problem = disable_core_dumps()
            if problem is not None:
                _log(self.rank, f"warning: core dumps stay enabled: {problem}")
        _log(
            self.rank,
            f"tracker {opts.tracker} advanced {self.baseline} -> {iteration}; "
            f"marker {opts.fault_marker} written; sending {sig.name} to pid {os.getpid()}",
        )
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            os.kill(os.getpid(), sig)  # act on the whole process at once, whichever thread
        else:
            # Directed at this thread, so a default action ends the process before the call
            # returns; sent to the pid, the kernel may pick a thread that runs on, and this
            # one would go on for a moment (and log that the process is still running).
            signal.pthread_kill(threading.get_ident(), sig)
        # Only a continued SIGSTOP, or a SIGTERM the workload handles, gets here.
        if sig is signal.SIGSTOP:
            _log(self.rank, f"resumed after {sig.name}")
        else:
            _log(self.rank, f"still running after {sig.name}: the workload handles or ignores it")


def main(argv: Sequence[str] | None = None) -> int:
    """Validate, start the watcher on the selected rank, run the workload in-process."""
    opts = parse_args(sys.argv[1:] if argv is None else argv)

    rank: int | None = None
    if opts.fault != "none":
        rank = _env_int(os.environ, "RANK")
        if rank is None:
            raw = os.environ.get("RANK")
            return _fail(
                None,
                f"RANK is unset or not an integer ({raw!r}); run under ft_launcher/torchrun",
                EXIT_USAGE,
            )
        world_size = _env_int(os.environ, "WORLD_SIZE")
        if world_size is not None and opts.fault_rank >= world_size:
            return _fail(
                rank,
                f"--fault-rank {opts.fault_rank} is not below WORLD_SIZE {world_size}: "
                "no rank would inject",
                EXIT_USAGE,
            )

    watcher: Watcher | None = None
    if rank is not None and rank == opts.fault_rank:
        try:
            watcher = _prepare_watcher(opts, rank)
        except _StartupError as exc:
            return _fail(rank, str(exc), EXIT_USAGE)
        if watcher is not None:
            watcher.start()

    try:
        _run_workload(opts)
    except SystemExit as exc:
        if exc.code is not None and exc.code != 0:
            raise
    finally:
        if watcher is not None:
            watcher.finish()

    if watcher is None or watcher.injected:
        return 0
    why = watcher.error
    if why is None:
        try:
            if marker_exists(opts.fault_marker):
                _log(rank, f"marker {opts.fault_marker} was written by another process")
                return 0
        except MarkerPathError as exc:
            why = str(exc)
    if why is None:
        why = f"tracker {opts.tracker} never advanced beyond {watcher.baseline} while training ran"
    return _fail(
        rank,
        f"the requested fault ({opts.fault} on rank {opts.fault_rank}) never happened: {why}",
        EXIT_FAULT_NOT_INJECTED,
    )


class _StartupError(Exception):
    pass


def _prepare_watcher(opts: Options, rank: int) -> Watcher | None:
    """The selected rank's start-up checks; None when a marker says the fault already happened.

    Only the selected rank validates the tracker: it alone needs the baseline, and a bad tracker
    stops Megatron's own checkpoint load on every rank anyway. A replacement worker (marker
    present) skips the check and runs exactly like the unwrapped workload.
    """
    try:
        if marker_exists(opts.fault_marker):
            _log(
                rank,
                f"marker {opts.fault_marker} exists: fault already injected; "
                "running the workload without injection",
            )
            return None
    except MarkerPathError as exc:
        raise _StartupError(f"{exc}; refusing to run (use a fresh run directory)") from exc
    sig = FAULT_SIGNALS[opts.fault]
    if signal.getsignal(sig) == signal.SIG_IGN:
        # Inherited as ignored (the workload has not run yet): sending it would change nothing.
        raise _StartupError(
            f"{sig.name} is ignored in this process (inherited from whoever started the "
            f"launcher), so the {opts.fault} fault could not end it; start the run with "
            f"{sig.name} at its default disposition"
        )
    marker_dir = os.path.dirname(opts.fault_marker)
    if not os.path.isdir(marker_dir):
        raise _StartupError(f"marker directory {marker_dir} does not exist")
    read = read_tracker(opts.tracker)
    if read.state is TrackerState.OK and read.iteration is not None:
        baseline = read.iteration
    elif read.state is TrackerState.ABSENT:
        baseline = 0
    else:
        raise _StartupError(
            f"checkpoint tracker {opts.tracker} is {read.describe()}; at start it must be "
            "absent or hold an integer iteration"
        )
    _log(
        rank,
        f"watching {opts.tracker} (baseline {baseline}) to inject {opts.fault} "
        f"({FAULT_SIGNALS[opts.fault].name}) once it advances",
    )
    return Watcher(opts, rank, baseline)


def _run_workload(opts: Options) -> None:
    """Run the workload as ``python script`` / ``python -m module`` would, in this process."""
    sys.argv = opts.workload_argv
    if opts.script is not None:
        path = opts.script
        _set_path0(os.path.dirname(os.path.abspath(path)))
        runpy.run_path(path, run_name="__main__")
    else:
        assert opts.module is not None
        _set_path0(os.getcwd())  # what python -m puts first
        runpy.run_module(opts.module, run_name="__main__", alter_sys=True)


@contextlib.contextmanager
def _prompt_gil_handoff() -> Iterator[None]:
    """Shorten the GIL switch interval while the watcher works (microseconds per poll).

    Every syscall here gives up the GIL, and winning it back from a Python-bound training thread
    takes up to a full switch interval (5 ms by default): four round trips per poll, eight more
    to write the marker. The training thread loses the GIL the same number of times either way;
    it just hands it over sooner. Restored afterwards (also when a hang is continued).
    """
    previous = sys.getswitchinterval()
    sys.setswitchinterval(WATCHER_SWITCH_INTERVAL_S)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


def _set_path0(entry: str) -> None:
    # Replace our own directory (sys.path[0] when run as a script) so the workload cannot import
    # our sibling modules by accident and sees the sys.path python would have given it.
    if sys.path:
        sys.path[0] = entry
    else:
        sys.path.append(entry)


def _file_kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "symbolic link"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "special file"


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name, "").strip()
    if re.fullmatch(r"-?[0-9]+", value) is None:
        return None
    return int(value)


def _log(rank: int | None, message: str) -> None:
    # One write(2) on fd 2: unbuffered, unaffected by the workload rebinding sys.stderr, and
    # complete before a signal that follows it.
    who = f"rank {rank} " if rank is not None else ""
    line = f"{LOG_PREFIX} {who}pid {os.getpid()}: {message}\n"
    with contextlib.suppress(OSError):
        os.write(2, line.encode(errors="replace"))


def _fail(rank: int | None, message: str, code: int) -> int:
    _log(rank, f"ERROR: {message}")
    return code


if __name__ == "__main__":
    sys.exit(main())
