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

``--schedule F@W[,F@W...]`` (instead of ``--fault``/``--window``) injects several faults, one
per training cycle, in order. At start the selected rank arms the first position k whose marker
does not exist yet: position 1's marker is ``--fault-marker`` itself, position k's the same name
with ``_k`` before its suffix (``fault_injected_2.json``). Every later position is then still
unclaimed (a later marker without an earlier one is an inconsistent history: exit 2); with every
marker present the rank runs the workload without injecting. From there on the armed fault
behaves exactly like a single ``--fault``, with its own marker, which also records the whole
schedule and the fault's position in it. A schedule's 2nd or later entry may use the window
``restore``: it fires on the training thread at the entry of the replacement's checkpoint load
(Megatron's ``dist_checkpointing.load``, torch DCP's ``load``) of an ``iter_N`` directory, before
the load runs, whatever the tracker says.

This file must stay stdlib-only and runnable as a plain script (ft_launcher runs it with
``python -u``), so it imports nothing from pytest_nvrx and repeats the one file name it needs
(the tracker; the marker path comes from the command line) and the self-test's plant variable
(``PYTEST_NVRX_PLANT``: the marker records the plant, null in every run without one).

Exit codes of the wrapper itself (the workload's own status passes through otherwise):

* 2 -- bad command line or environment, unusable tracker, a non-regular file (symlink,
  directory, ...) at a marker path, or a schedule's markers out of order; reported before the
  workload starts.
* 3 -- the workload finished normally on the selected rank but the requested fault never happened.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import enum
import errno
import faulthandler
import functools
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
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Final, NoReturn

# Rank 0's tracker observer says it reads the tracker with this line's head (the core's
# injector-log parser reads it: evidence/injector_log.py).
OBSERVER_ANNOUNCEMENT: Final = "reading checkpoint tracker"
# Megatron's checkpoint tracker, repeated from pytest_nvrx.layout (stdlib-only module).
TRACKER_NAME: Final = "latest_checkpointed_iteration.txt"
# The self-test's planted bug in the workers' environment, repeated from pytest_nvrx.settings.plants
# (a test holds the two equal): the marker names it, so that a planted run can never pass for a
# qualification run.
PLANT_ENV: Final = "PYTEST_NVRX_PLANT"

LOG_PREFIX: Final = "[pytest-nvrx injector]"
MARKER_SCHEMA_VERSION: Final = 2
DEFAULT_POLL_INTERVAL_S: Final = 0.05
# An advance is acted on only when a second read this much later agrees, so a marker never records
# the prefix of a tracker caught mid-write (Megatron writes it with a plain open/write).
CONFIRM_DELAY_S: Final = 0.01
# How many reads a changing tracker gets to settle on one value before a probe gives up.
CONFIRM_READS: Final = 4
# GIL switch interval while the watcher reads the tracker or injects (Python's default is 5 ms).
WATCHER_SWITCH_INTERVAL_S: Final = 0.0001
# The tracker holds a few digits; never read more than this from whatever sits at its path.
TRACKER_MAX_BYTES: Final = 4096

# After raising the ``exception`` fault: dump every thread's stack if the process still runs.
EXCEPTION_STACKS_AFTER_S: Final = 10.0
# After killing the checkpoint worker (``ckpt-worker``): the rank's stacks, if it still runs.
CKPT_WORKER_STACKS_AFTER_S: Final = 20.0

EXIT_USAGE: Final = 2
EXIT_FAULT_NOT_INJECTED: Final = 3

FAULTS: Final = ("none", "kill", "hang", "term", "segv", "exception", "ckpt-worker")
# Where in the training loop the selected rank fires (pytest_nvrx.layout.FAULT_WINDOWS).
WINDOWS: Final = ("step", "save", "finalize")
# Windows only a schedule's 2nd or later fault may use: ``restore`` fires in a replacement while it
# loads the checkpoint an earlier fault made it resume from.
SCHEDULE_WINDOWS: Final = ("restore",)
# Faults that only make sense in some windows: the persistent checkpoint worker is busy only
# while a save is in flight.
FAULT_WINDOWS_ONLY: Final[Mapping[str, tuple[str, ...]]] = {"ckpt-worker": ("finalize",)}
# The signal of each signal fault. kill/hang/term/segv go to the selected rank's own pid:
# SIGTERM's default action ends the process (a workload that handles it decides itself);
# SIGSEGV's ends it as a native crash would, and a faulthandler the workload enabled dumps the
# stacks and re-raises it. ckpt-worker's SIGKILL goes to the rank's persistent checkpoint worker.
# ``exception`` is no signal: the probe raises InjectedFault on the training thread.
FAULT_SIGNALS: Final[Mapping[str, signal.Signals]] = {
    "kill": signal.SIGKILL,
    "hang": signal.SIGSTOP,
    "term": signal.SIGTERM,
    "segv": signal.SIGSEGV,
    "ckpt-worker": signal.SIGKILL,
}
# Signals whose default action writes a core file; the injector switches that off before sending.
CORE_DUMPING_SIGNALS: Final = frozenset({signal.SIGSEGV})

# at most 20 digits, as the core reads a tracker (evidence/refs.py MAX_DIGITS): no iteration
# is longer, and the two readers must agree (tests/worker/test_tracker_readers_agree.py)
_ITERATION_RE: Final = re.compile(r"[0-9]{1,20}")


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
    window: str
    script: str | None
    module: str | None
    poll_interval: float
    workload_args: tuple[str, ...]
    # --schedule: its (fault, window) entries in order, empty for --fault; ``fault``, ``window``
    # and ``fault_marker`` are the armed entry's once ``schedule_position`` (1-based) is set.
    schedule: tuple[tuple[str, str], ...] = ()
    schedule_position: int = 0

    @property
    def tracker(self) -> str:
        return os.path.join(self.checkpoint_dir, TRACKER_NAME)

    @property
    def schedule_names(self) -> list[str]:
        """The schedule as given, ``["kill@step", "kill@restore"]``."""
        return [f"{fault}@{window}" for fault, window in self.schedule]

    def describe_fault(self) -> str:
        """The fault asked for, as the exit-3 message names it."""
        if not self.schedule:
            return f"{self.fault} on rank {self.fault_rank}"
        return (
            f"scheduled fault {self.schedule_position} of {len(self.schedule)}, "
            f"{self.fault}@{self.window} on rank {self.fault_rank}"
        )

    def armed(self, position: int) -> Options:
        """This schedule (as parsed) with its entry ``position`` (1-based) armed: its fault, its
        window and its marker."""
        assert self.schedule and self.schedule_position == 0, "arm a parsed schedule once"
        fault, window = self.schedule[position - 1]
        return replace(
            self,
            fault=fault,
            window=window,
            fault_marker=scheduled_marker_path(self.fault_marker, position),
            schedule_position=position,
        )

    @property
    def workload_argv(self) -> list[str]:
        """The workload's sys.argv (a module's argv[0] is its name until runpy resolves it)."""
        entry = self.script if self.script is not None else self.module
        assert entry is not None
        return [entry, *self.workload_args]


def scheduled_marker_path(first: str, position: int) -> str:
    """The marker of a schedule's fault ``position`` (1-based): ``first`` itself for 1, else the
    same directory with ``_<position>`` after the stem of ``first`` (``fault_injected_2.json``)."""
    if position < 1:
        raise ValueError(f"schedule positions start at 1, got {position}")
    if position == 1:
        return first
    head, tail = os.path.split(first)
    stem, suffix = os.path.splitext(tail)
    return os.path.join(head, f"{stem}_{position}{suffix}")


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


@dataclass(frozen=True)
class Firing:
    """Where and when the selected rank fires: what the marker records about the window."""

    window: str
    trigger: str
    tracker_iteration: int
    in_flight_iteration: int | None = None
    section: str | None = None
    write_done: bool | None = None
    # restore: the iteration of the checkpoint whose load the fault interrupts
    load_iteration: int | None = None

    def describe(self) -> str:
        in_flight = "none" if self.in_flight_iteration is None else self.in_flight_iteration
        return (
            f"window {self.window} ({self.trigger}): in-flight iteration {in_flight}, "
            f"tracker {self.tracker_iteration}"
        )


def build_marker_record(
    *,
    fault: str,
    rank: int,
    firing: Firing,
    baseline_iteration: int,
    tracker: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    pid: int,
    rank_pid: int,
    host: str,
    now: datetime,
    schedule: Sequence[str] | None = None,
    schedule_position: int | None = None,
) -> dict[str, Any]:
    """The marker's JSON content; every input is explicit so tests need no process state.

    ``pid`` is the process the fault is aimed at (the rank, or its checkpoint worker for
    ``ckpt-worker``); ``rank_pid`` is always the rank's own. A schedule's fault adds
    ``schedule`` (every entry, ``F@W``, in order) and ``schedule_position`` (1-based); a
    ``restore`` firing adds ``load_iteration``. A single ``--fault`` records neither.
    """
    sig = FAULT_SIGNALS.get(fault)
    record: dict[str, Any] = {
        "schema_version": MARKER_SCHEMA_VERSION,
        "fault": fault,
        "signal": sig.name if sig is not None else None,
        "rank": rank,
        "local_rank": _env_int(env, "LOCAL_RANK"),
        "world_size": _env_int(env, "WORLD_SIZE"),
        "restart_count": _env_int(env, "TORCHELASTIC_RESTART_COUNT"),
        "run_id": env.get("NVRX_RUN_ID") or None,
        "plant": env.get(PLANT_ENV) or None,
        "pid": pid,
        "rank_pid": rank_pid,
        "host": host,
        "tracker": tracker,
        "tracker_iteration": firing.tracker_iteration,
        "baseline_iteration": baseline_iteration,
        "window": firing.window,
        "trigger": firing.trigger,
        "in_flight_iteration": firing.in_flight_iteration,
        "section": firing.section,
        "write_done": firing.write_done,
        "time": now.isoformat(),
        "argv": list(argv),
    }
    if schedule is not None:
        record["schedule"] = list(schedule)
        record["schedule_position"] = schedule_position
    if firing.window == "restore":
        record["load_iteration"] = firing.load_iteration
    return record


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
        "checkpoint beyond the start-up tracker value (with --schedule: the schedule's next "
        "fault, one per training cycle). Workload arguments follow '--'.",
    )
    parser.add_argument("--checkpoint-dir", required=True, help="absolute checkpoint directory")
    parser.add_argument(
        "--fault-marker",
        required=True,
        help="absolute path of the marker file (a schedule's first; see --schedule)",
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--fault", choices=FAULTS)
    what.add_argument(
        "--schedule",
        metavar="F@W[,F@W...]",
        help="several faults, one per training cycle, in order: each FAULT@WINDOW (fault one of "
        f"{', '.join(f for f in FAULTS if f != 'none')}; window one of "
        f"{', '.join((*WINDOWS, *SCHEDULE_WINDOWS))}, restore only after the first entry); "
        "entry k's marker is --fault-marker with _k before its suffix (k >= 2)",
    )
    parser.add_argument("--fault-rank", required=True, type=int, help="global rank to fault")
    parser.add_argument(
        "--window",
        choices=(*WINDOWS, *SCHEDULE_WINDOWS),
        default=None,
        help="with --fault: where the fault lands: a training step after a checkpoint completed "
        "(step), the preparation of the next save (save), or after that save was submitted and "
        "before its finalization advanced the tracker (finalize); default step",
    )
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
    schedule: tuple[tuple[str, str], ...] = ()
    if ns.schedule is not None:
        if ns.window is not None:
            parser.error(
                "--window goes only with --fault; each --schedule entry names its own window "
                "(FAULT@WINDOW)"
            )
        try:
            schedule = parse_schedule(ns.schedule)
        except ValueError as exc:
            parser.error(f"--schedule {ns.schedule!r}: {exc}")
        fault, window = schedule[0]
    else:
        fault, window = ns.fault, ("step" if ns.window is None else ns.window)
        if window in SCHEDULE_WINDOWS:
            parser.error(
                f"--window {window} exists only in a --schedule, as its 2nd or later entry "
                "(a fault in the replacement while it loads the checkpoint)"
            )
        allowed = FAULT_WINDOWS_ONLY.get(fault)
        if allowed is not None and window not in allowed:
            parser.error(f"--fault {fault} needs --window {' or '.join(allowed)}, got {window!r}")
    if ns.script is not None and not os.path.isfile(ns.script):
        parser.error(f"--script {ns.script!r} is not a file")
    return Options(
        checkpoint_dir=ns.checkpoint_dir,
        fault_marker=ns.fault_marker,
        fault=fault,
        fault_rank=ns.fault_rank,
        window=window,
        script=ns.script,
        module=ns.module,
        poll_interval=ns.poll_interval,
        workload_args=tuple(workload),
        schedule=schedule,
    )


def parse_schedule(text: str) -> tuple[tuple[str, str], ...]:
    """``F@W[,F@W...]`` as (fault, window) pairs; ValueError saying what is wrong."""
    entries: list[tuple[str, str]] = []
    windows = (*WINDOWS, *SCHEDULE_WINDOWS)
    for position, entry in enumerate(text.split(","), start=1):
        where = f"entry {position}"
        if not entry:
            raise ValueError(f"{where} is empty (give FAULT@WINDOW[,FAULT@WINDOW...])")
        fault, at, window = entry.partition("@")
        if not at:
            raise ValueError(f"{where} {entry!r} is not FAULT@WINDOW")
        if fault not in FAULTS or fault == "none":
            choices = ", ".join(f for f in FAULTS if f != "none")
            raise ValueError(f"{where} {entry!r}: unknown fault {fault!r} (one of {choices})")
        if window not in windows:
            raise ValueError(
                f"{where} {entry!r}: unknown window {window!r} (one of {', '.join(windows)})"
            )
        if window in SCHEDULE_WINDOWS and position == 1:
            raise ValueError(
                f"{where} {entry!r}: window {window} needs an earlier fault (it fires in the "
                "replacement while it loads the checkpoint), so it cannot come first"
            )
        allowed = FAULT_WINDOWS_ONLY.get(fault)
        if allowed is not None and window not in allowed:
            raise ValueError(
                f"{where} {entry!r}: fault {fault} needs window {' or '.join(allowed)}"
            )
        entries.append((fault, window))
    return tuple(entries)


class InjectedFault(RuntimeError):
    """The ``exception`` fault: raised on the selected rank's training thread, never caught."""


class Injection:
    """The selected rank's once-only fault: claim the marker, then deliver the fault.

    Called from the probes (training thread) and from the tracker-poll watcher (its own thread);
    the lock and ``attempted`` make sure only the first caller ever claims.
    """

    def __init__(self, opts: Options, rank: int, baseline: int) -> None:
        self.opts = opts
        self.rank = rank
        self.baseline = baseline
        # Held from the claim to the fault: once main() holds it, no injection can start.
        self.lock = threading.Lock()
        self.stopped = False
        self.attempted = False
        self.injected = False
        self.error: str | None = None
        self.host = socket.gethostname()

    def stop(self) -> None:
        """No injection may start after this; waits for one in progress (a resumed hang)."""
        with self.lock:
            self.stopped = True

    def fire(self, firing: Firing) -> None:
        """Claim the marker and deliver the fault, once. ``exception`` raises InjectedFault."""
        with self.lock:
            if self.stopped or self.attempted:
                return
            self.attempted = True
            raise_now = self._claim_and_deliver(firing)
        if raise_now:
            raise InjectedFault(
                f"pytest-nvrx injected exception on rank {self.rank} in window {firing.window} "
                f"(in-flight iteration {_or_none(firing.in_flight_iteration)}, "
                f"tracker {firing.tracker_iteration})"
            )

    def _claim_and_deliver(self, firing: Firing) -> bool:
        opts = self.opts
        rank_pid = os.getpid()
        target = rank_pid
        if opts.fault == "ckpt-worker":
            found, why = find_checkpoint_worker(rank_pid)
            if found is None:
                self.error = f"no persistent checkpoint worker to kill: {why}; not injecting"
                _log(self.rank, f"ERROR: {self.error}")
                return False
            target = found
        record = build_marker_record(
            fault=opts.fault,
            rank=self.rank,
            firing=firing,
            baseline_iteration=self.baseline,
            tracker=opts.tracker,
            argv=opts.workload_argv,
            env=os.environ,
            pid=target,
            rank_pid=rank_pid,
            host=self.host,
            now=datetime.now(UTC),
            schedule=opts.schedule_names if opts.schedule else None,
            schedule_position=opts.schedule_position if opts.schedule else None,
        )
        try:
            claimed = claim_marker(opts.fault_marker, record)
        except MarkerPathError as exc:
            self.error = f"{exc}; refusing to inject"
            _log(self.rank, f"ERROR: {self.error}")
            return False
        except OSError as exc:
            self.error = f"could not write marker {opts.fault_marker}: {exc}; not injecting"
            _log(self.rank, f"ERROR: {self.error}")
            return False
        if not claimed:
            _log(
                self.rank,
                f"marker {opts.fault_marker} appeared meanwhile; another process injected",
            )
            return False
        self.injected = True
        head = f"{firing.describe()}; marker {opts.fault_marker} written"
        if opts.fault == "exception":
            # An uncaught exception should end the process at once; if it has not after a while
            # (atexit handlers, finalizers, peers), the stacks of every thread show where it is.
            with contextlib.suppress(Exception):
                faulthandler.dump_traceback_later(EXCEPTION_STACKS_AFTER_S, repeat=False)
            _log(
                self.rank,
                f"{head}; raising InjectedFault (thread stacks follow if this process is still "
                f"running {EXCEPTION_STACKS_AFTER_S:g} s from now)",
            )
            return True
        sig = FAULT_SIGNALS[opts.fault]
        if opts.fault == "ckpt-worker":
            _log(
                self.rank,
                f"{head}; sending {sig.name} to checkpoint worker pid {target} "
                f"(rank pid {rank_pid}); thread stacks follow if this rank is still running "
                f"{CKPT_WORKER_STACKS_AFTER_S:g} s from now",
            )
            try:
                os.kill(target, sig)
            except OSError as exc:
                _log(self.rank, f"ERROR: could not signal checkpoint worker {target}: {exc}")
                return False
            # The rank itself runs on; if it neither fails nor finishes, its stacks show where
            # it waits for the dead worker.
            with contextlib.suppress(Exception):
                faulthandler.dump_traceback_later(CKPT_WORKER_STACKS_AFTER_S, repeat=False)
            return False
        if signal.getsignal(sig) == signal.SIG_IGN:
            _log(self.rank, f"warning: the workload ignores {sig.name}; it will have no effect")
        if sig in CORE_DUMPING_SIGNALS:
            problem = disable_core_dumps()
            if problem is not None:
                _log(self.rank, f"warning: core dumps stay enabled: {problem}")
        _log(self.rank, f"{head}; sending {sig.name} to pid {rank_pid}")
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            os.kill(rank_pid, sig)  # act on the whole process at once, whichever thread
        else:
            # Directed at this thread, so a default action ends the process before the call
            # returns; sent to the pid, the kernel may pick a thread that runs on, and this
            # one would go on for a moment (and log that the process is still running).
            signal.pthread_kill(threading.get_ident(), sig)
        # Only a continued SIGSTOP, or a SIGTERM the workload handles, gets here.
        if sig is signal.SIGSTOP:
            stay_hung(self.rank, rank_pid)
        _log(self.rank, f"still running after {sig.name}: the workload handles or ignores it")
        return False


def stay_hung(rank: int, rank_pid: int) -> NoReturn:
    """Keep a continued hang hung until the process is killed; never returns.

    A hang is a rank that makes no progress until it is killed. NVRx's rank monitor sends
    SIGCONT right before its ``rank_termination_signal`` (so that a SIGTERM can act on a stopped
    process): a rank that simply went on after SIGSTOP would run for the moment between the two
    signals and could, under load, finish the very collective it hung in (measured: a stopped
    rank woken at the checkpointing timeout completed the finalization of the in-flight save, so
    the tracker advanced after the fault). So the hang persists: on the training thread, which
    fired it, it sleeps (signal handlers still run, and their exceptions end the wait as they
    would end a real hang's); on any other thread (the tracker watcher) it stops the process
    again at once, before giving up the GIL, so no Python code of the training thread runs.
    """
    if threading.current_thread() is threading.main_thread():
        _log(rank, "continued after SIGSTOP; the hang persists: this thread blocks until killed")
        while True:
            time.sleep(3600)
    while True:  # os.kill keeps the GIL: the training thread runs no Python code in between
        os.kill(rank_pid, signal.SIGSTOP)


class Watcher:
    """The tracker-poll thread: the ``step`` window of a workload without NVRx sections.

    It fires only when no probe has seen a section by the time the tracker advanced; with
    sections, the ``step`` probe fires at the start of the next step instead.
    """

    def __init__(self, injection: Injection, probes: WindowProbes) -> None:
        self.injection = injection
        self.probes = probes
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="nvrx-fault-watcher", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def finish(self) -> None:
        self.stop.set()

    def _run(self) -> None:
        try:
            self._poll()
        except BaseException:
            self.injection.error = "watcher thread crashed:\n" + traceback.format_exc()
            _log(self.injection.rank, self.injection.error)

    def _poll(self) -> None:
        opts = self.injection.opts
        detector = AdvanceDetector(self.injection.baseline)
        delay = opts.poll_interval
        # Waking up costs far more than the read (~5 us), so wait the cheapest way: time.sleep is
        # one clock_nanosleep where Event.wait builds a Condition. Stopping lags one interval.
        while True:
            time.sleep(delay)
            if self.stop.is_set():
                return
            with _prompt_gil_handoff():
                iteration = detector.observe(read_tracker(opts.tracker))
                if iteration is not None:
                    if not self.probes.sections_seen:
                        self.injection.fire(
                            Firing(
                                window="step", trigger="tracker poll", tracker_iteration=iteration
                            )
                        )
                    return
            pending = detector.candidate is not None
            delay = min(CONFIRM_DELAY_S, opts.poll_interval) if pending else opts.poll_interval


class WindowProbes:
    """The window logic, fed by the library probes on the selected rank's training thread.

    ``section_started``/``section_ended`` follow NVRx's RankMonitorClient (after the real call
    returned, so the rank monitor agrees on which section is open); ``submit_entry``/
    ``submit_return`` bracket the call that submits checkpoint N (Megatron's
    ``dist_checkpointing.save``, torch DCP's ``async_save``); ``load_entry`` is the entry of a
    checkpoint load (Megatron's ``dist_checkpointing.load``, torch DCP's ``load``), probed only
    for the ``restore`` window. A probe never changes the call it observes (``restore`` fires
    before it); an error in this logic disables injection (exit 3 at the end), never the workload.
    """

    def __init__(self, injection: Injection) -> None:
        self.injection = injection
        self.window = injection.opts.window
        self.baseline = injection.baseline
        self.sections_seen = False
        self.open_sections: list[str] = []
        self.in_flight: int | None = None
        self.in_flight_result: Any = None
        self.submitted_in_section = False  # submit(N) returned inside the open checkpointing
        self.submits: list[int] = []
        # finalize: the saves the tracker already named when a checkpointing section began after
        # their submit (published at submit, not at finalization: the window cannot open)
        self.named_before_finalize: list[int] = []
        self.checkpointing_since_submit = 0
        self.highest_tracker: int | None = None
        # restore: each checkpoint load seen, and why it did not fire
        self.loads: list[str] = []
        self.broken = False

    # -- probe entry points (each wraps its logic; InjectedFault passes through) --

    def section_started(self, name: str) -> None:
        self._guarded(self._section_started, name)

    def section_ended(self, name: str) -> None:
        self._guarded(self._section_ended, name)

    def submit_entry(self, path: Any) -> None:
        self._guarded(self._submit_entry, path)

    def submit_return(self, path: Any, result: Any) -> None:
        self._guarded(self._submit_return, path, result)

    def load_entry(self, path: Any) -> None:
        self._guarded(self._load_entry, path)

    def _guarded(self, fn: Any, *args: Any) -> None:
        if self.broken or self.injection.attempted:
            return
        try:
            fn(*args)
        except InjectedFault:
            raise
        except Exception:
            self.broken = True
            self.injection.error = "window probe failed:\n" + traceback.format_exc()
            _log(self.injection.rank, f"ERROR: {self.injection.error}")

    # -- the windows --

    def _section_started(self, name: str) -> None:
        self.sections_seen = True
        self.open_sections.append(name)
        if name == "checkpointing":
            self.submitted_in_section = False
            self.checkpointing_since_submit += 1
        if self.window == "step" and name == "step":
            tracker = self._armed_tracker(below=None)
            if tracker is not None:
                in_flight = self._pending(tracker)
                self._fire(
                    "start_section(step)",
                    tracker,
                    in_flight,
                    "step",
                    self._write_done() if in_flight is not None else None,
                )
        elif (
            self.window == "finalize"
            and name == "checkpointing"
            and self.injection.opts.fault != "ckpt-worker"
            and self.in_flight is not None
        ):
            in_flight = self.in_flight
            tracker = self._armed_tracker(below=in_flight)
            if tracker is None and self.in_flight is None and self.checkpointing_since_submit == 1:
                # the first checkpointing section after the submit is the one that finalizes it
                self.named_before_finalize.append(in_flight)
            if tracker is not None:
                self._fire(
                    "start_section(checkpointing)",
                    tracker,
                    in_flight,
                    "checkpointing",
                    self._write_done(),
                )

    def _section_ended(self, name: str) -> None:
        if name in self.open_sections:
            # remove the innermost occurrence
            del self.open_sections[
                len(self.open_sections) - 1 - self.open_sections[::-1].index(name)
            ]
        if (
            self.window == "finalize"
            and name == "checkpointing"
            and self.injection.opts.fault == "ckpt-worker"
            and self.submitted_in_section
            and self.in_flight is not None
        ):
            self.submitted_in_section = False
            in_flight = self.in_flight
            tracker = self._armed_tracker(below=in_flight)
            if tracker is not None:
                self._fire(
                    "end_section(checkpointing)",
                    tracker,
                    in_flight,
                    self._innermost_section(),
                    self._write_done(),
                )

    def _fire(
        self,
        trigger: str,
        tracker: int,
        in_flight: int | None,
        section: str | None,
        write_done: bool | None,
    ) -> None:
        """Fire in this probe's window, from ``trigger``, with what the marker records of it."""
        firing = Firing(self.window, trigger, tracker, in_flight, section, write_done)
        self.injection.fire(firing)

    def _innermost_section(self) -> str | None:
        return self.open_sections[-1] if self.open_sections else None

    def _submit_entry(self, path: Any) -> None:
        iteration = checkpoint_iteration(path)
        if iteration is None:
            return
        if self.window == "save":
            tracker = self._armed_tracker(below=iteration)
            if tracker is not None:
                self._fire("save submit", tracker, iteration, self._innermost_section(), None)

    def _submit_return(self, path: Any, result: Any) -> None:
        iteration = checkpoint_iteration(path)
        if iteration is None:
            return
        self.submits.append(iteration)
        self.checkpointing_since_submit = 0
        self.in_flight = iteration
        self.in_flight_result = result
        self.submitted_in_section = "checkpointing" in self.open_sections

    def _load_entry(self, path: Any) -> None:
        if self.window != "restore":
            return
        iteration = checkpoint_iteration(path)
        if iteration is None:
            self.loads.append(f"{_shorten(path)} (no iter_N directory)")
            return
        read = self._settled_tracker()
        if read.iteration is None:
            self.loads.append(f"iteration {iteration} (tracker {read.describe()})")
            return
        self.injection.fire(
            Firing(
                window="restore",
                trigger="checkpoint load",
                tracker_iteration=read.iteration,
                in_flight_iteration=None,
                section=self._innermost_section(),
                write_done=None,
                load_iteration=iteration,
            )
        )

    # -- helpers --

    def _settled_tracker(self) -> TrackerRead:
        """The tracker now, an integer only when a second read 10 ms later agrees (at most
        CONFIRM_READS reads); no baseline applies: a replacement loads the baseline's own."""
        path = self.injection.opts.tracker
        read = read_tracker(path)
        for _ in range(CONFIRM_READS):
            if read.state is TrackerState.EMPTY:  # caught between a truncate and its write
                time.sleep(CONFIRM_DELAY_S)
                read = read_tracker(path)
            if read.iteration is None:
                return read
            if self.highest_tracker is None or read.iteration > self.highest_tracker:
                self.highest_tracker = read.iteration
            time.sleep(CONFIRM_DELAY_S)
            again = read_tracker(path)
            if again.iteration == read.iteration:
                return read
            read = again
        return TrackerRead(TrackerState.INVALID, detail=f"did not settle in {CONFIRM_READS} reads")

    def _pending(self, tracker: int) -> int | None:
        """The submitted save not yet named by the tracker, if any."""
        if self.in_flight is not None and tracker < self.in_flight:
            return self.in_flight
        return None

    def _write_done(self) -> bool | None:
        """Whether the in-flight background write completed, where that is knowable without
        side effects (a concurrent.futures.Future, as torch DCP's async_save returns); else None.
        """
        result = self.in_flight_result
        if isinstance(result, concurrent.futures.Future):
            return result.done()
        return None

    def _armed_tracker(self, *, below: int | None) -> int | None:
        """The tracker value if a window may fire now, else None.

        Armed when the tracker names a completed checkpoint above the start-up baseline (and
        below ``below``, the in-flight iteration, when given). The value is confirmed by a second
        read 10 ms later (a plain open/write may be caught half-way); only at firing time. Rank 0
        writes the tracker just after the finalization all-reduce that this rank has also
        passed, so a read here may catch it empty or still naming the previous checkpoint, and
        its confirmation the new value: the new value is then judged and confirmed in its turn
        (at most CONFIRM_READS reads), instead of letting this window pass (under load that
        race was lost at every save, measured: "window save never opened").
        """
        path = self.injection.opts.tracker
        read = read_tracker(path)
        if read.state is TrackerState.EMPTY:  # caught between rank 0's truncate and its write
            time.sleep(CONFIRM_DELAY_S)
            read = read_tracker(path)
        value = read.iteration
        for _ in range(CONFIRM_READS):
            if value is None:
                return None
            if self.highest_tracker is None or value > self.highest_tracker:
                self.highest_tracker = value
            if self.in_flight is not None and value >= self.in_flight:
                self.in_flight = None  # finalized: nothing in flight any more
                self.in_flight_result = None
            if value <= self.baseline or (below is not None and value >= below):
                return None
            time.sleep(CONFIRM_DELAY_S)
            again = read_tracker(path)
            if again.state is TrackerState.EMPTY:
                time.sleep(CONFIRM_DELAY_S)
                again = read_tracker(path)
            if again.iteration == value:
                return value
            value = again.iteration
        return None

    def never_fired(self) -> str:
        """Why the window never opened, for the exit-3 message."""
        if self.window == "restore":
            if not self.loads:
                return "window restore never opened: no checkpoint load started while training ran"
            loads = "; ".join(self.loads[:8])
            return f"window restore never opened: no checkpoint load could fire it (loads: {loads})"
        seen = "NVRx sections seen" if self.sections_seen else "no NVRx section ever started"
        submits = ", ".join(map(str, self.submits[:8])) or "none"
        early = ""
        if self.named_before_finalize:
            named = ", ".join(map(str, self.named_before_finalize[:8]))
            early = (
                f"; the tracker already named the save in flight when its finalization began: "
                f"{named}"
            )
        return (
            f"window {self.window} never opened while training ran (baseline {self.baseline}, "
            f"highest tracker read {_or_none(self.highest_tracker)}, saves submitted: {submits}"
            f"{early}; {seen})"
        )


_ITER_DIR_RE: Final = re.compile(r"iter_([0-9]+)$")


def checkpoint_iteration(path: Any) -> int | None:
    """The iteration of a checkpoint path ``.../iter_0000010`` (Megatron's naming), else None."""
    if path is None:
        return None
    try:
        text = os.fspath(path)
    except TypeError:
        return None
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    match = _ITER_DIR_RE.search(text.rstrip("/"))
    return int(match.group(1)) if match else None


def find_checkpoint_worker(rank_pid: int) -> tuple[int | None, str]:
    """The pid of this rank's persistent checkpoint worker, or None and why not.

    Looked up where the libraries keep it (torch DCP's process executor, NVRx's persistent
    async caller), each checked to be a live child of the rank; otherwise the rank's only child
    started by multiprocessing's ``spawn`` (its command line runs ``spawn_main``).
    """
    known: list[int] = []
    executor = sys.modules.get("torch.distributed.checkpoint._async_process_executor")
    process = getattr(getattr(executor, "_CHECKPOINT_PROCESS", None), "_save_process", None)
    pid = getattr(process, "pid", None)
    if isinstance(pid, int):
        known.append(pid)
    core = sys.modules.get("nvidia_resiliency_ext.checkpointing.async_ckpt.core")
    queues = getattr(getattr(core, "AsyncCallsQueue", None), "get_instances", None)
    if callable(queues):
        for queue in queues():
            worker = getattr(getattr(queue, "persistent_caller", None), "process", None)
            pid = getattr(worker, "pid", None)
            if isinstance(pid, int):
                known.append(pid)
    children = _child_pids(rank_pid)
    live = sorted({pid for pid in known if pid in children})
    if len(live) == 1:
        return live[0], ""
    if len(live) > 1:
        return None, f"several checkpoint workers {live}"
    spawned = [pid for pid in sorted(children) if b"spawn_main" in _cmdline(pid)]
    if len(spawned) == 1:
        return spawned[0], ""
    if spawned:
        return None, f"several spawn children {spawned} and none known to a checkpoint library"
    return None, (
        f"rank pid {rank_pid} has no checkpoint worker child (children: {sorted(children)}); "
        "the workload must save through a persistent worker process"
    )


def _child_pids(pid: int) -> set[int]:
    children: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return children
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                children.update(int(x) for x in f.read().split())
        except (OSError, ValueError):
            continue
    return children


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read(65536)
    except OSError:
        return b""


# --- probes: wrap a few library entry points at import -------------------------------------------


class TrackerObserver:
    """Rank 0, in every run (baselines and replacements included): each value of the tracker it
    reads at its own section and submit probes, once, with the time of the read and the probe.

    Rank 0 writes the tracker and prints the finalization lines on its training thread, where
    these probes run too: a value read here before that checkpoint's finalization line was
    published ahead of durability (pytest_nvrx.criteria.durability judges it). A new value is
    confirmed by a second read (a plain open/write may be caught half-way); reads never raise.
    """

    def __init__(self, tracker: str, rank: int) -> None:
        self.tracker = tracker
        self.rank = rank
        self.last: int | None = None
        self.broken = False

    def announce(self) -> None:
        """Say, before the first read, that this rank logs its readings: a run whose every
        reading is gone must not read as a run of an injector that never made any (the core
        requires the readings of every cycle that announced them, and the announcement of every
        cycle where rank 0 ran)."""
        _log(self.rank, f"{OBSERVER_ANNOUNCEMENT} {self.tracker}; each new value read is logged")

    def observe(self, where: str) -> None:
        if self.broken:
            return
        try:
            read = read_tracker(self.tracker)
            if read.state is not TrackerState.OK or read.iteration == self.last:
                return
            seen = datetime.now(UTC)
            time.sleep(CONFIRM_DELAY_S)
            if read_tracker(self.tracker).iteration != read.iteration:
                return  # caught mid-write: the next probe reads it again
            self.last = read.iteration
            _log(
                self.rank,
                f"checkpoint tracker reads {read.iteration} at"
                f" {seen.isoformat(timespec='microseconds')} ({where})",
            )
        except Exception:
            self.broken = True
            _log(self.rank, f"warning: tracker observer disabled:\n{traceback.format_exc()}")


class Probes:
    """What the patched library calls feed: the tracker observer (rank 0) first, so a read is
    logged before a window fires on it, then the window logic (the selected rank)."""

    def __init__(self, window: WindowProbes | None, observer: TrackerObserver | None) -> None:
        self.window = window
        self.observer = observer

    def section_started(self, name: str) -> None:
        if self.observer is not None:
            self.observer.observe(f"start_section({name})")
        if self.window is not None:
            self.window.section_started(name)

    def section_ended(self, name: str) -> None:
        if self.observer is not None:
            self.observer.observe(f"end_section({name})")
        if self.window is not None:
            self.window.section_ended(name)

    def submit_entry(self, path: Any) -> None:
        if self.window is not None:
            self.window.submit_entry(path)

    def submit_return(self, path: Any, result: Any) -> None:
        if self.observer is not None:
            iteration = checkpoint_iteration(path)
            self.observer.observe(f"submit({_or_none(iteration)}) returned")
        if self.window is not None:
            self.window.submit_return(path, result)

    def load_entry(self, path: Any) -> None:
        if self.window is not None:
            self.window.load_entry(path)

    @property
    def watches_loads(self) -> bool:
        """Whether the checkpoint loads need probes: only for the ``restore`` window."""
        return self.window is not None and self.window.window == "restore"


# module -> the function that patches it right after it executed
RANK_MONITOR_MODULE: Final = "nvidia_resiliency_ext.fault_tolerance.rank_monitor_client"
MEGATRON_SAVE_MODULE: Final = "megatron.core.dist_checkpointing"
DCP_SAVER_MODULE: Final = "torch.distributed.checkpoint.state_dict_saver"
DCP_LOADER_MODULE: Final = "torch.distributed.checkpoint.state_dict_loader"
# The package re-exports the loader's ``load`` (``from .state_dict_loader import load``).
DCP_PACKAGE: Final = "torch.distributed.checkpoint"


def _patch_rank_monitor(module: Any, probes: Probes) -> None:
    cls = module.RankMonitorClient
    start, end = cls.start_section, cls.end_section

    @functools.wraps(start)
    def start_section(self: Any, section: str, *args: Any, **kwargs: Any) -> Any:
        result = start(self, section, *args, **kwargs)
        probes.section_started(section)
        return result

    @functools.wraps(end)
    def end_section(self: Any, section: str, *args: Any, **kwargs: Any) -> Any:
        result = end(self, section, *args, **kwargs)
        probes.section_ended(section)
        return result

    cls.start_section = start_section
    cls.end_section = end_section


def _patch_submit(module: Any, name: str, path_of: Any, probes: Probes) -> None:
    original = getattr(module, name)

    @functools.wraps(original)
    def submit(*args: Any, **kwargs: Any) -> Any:
        path = path_of(args, kwargs)
        probes.submit_entry(path)
        result = original(*args, **kwargs)
        probes.submit_return(path, result)
        return result

    setattr(module, name, submit)


def _patch_load(module: Any, name: str, path_of: Any, probes: Probes) -> None:
    """Wrap a checkpoint load: the probe runs at its entry, before the original (``restore``
    fires there, so the load never starts)."""
    original = getattr(module, name)

    @functools.wraps(original)
    def load(*args: Any, **kwargs: Any) -> Any:
        probes.load_entry(path_of(args, kwargs))
        return original(*args, **kwargs)

    setattr(module, name, load)


def _patch_megatron(module: Any, probes: Probes) -> None:
    _patch_submit(module, "save", _megatron_save_path, probes)
    if probes.watches_loads:
        _patch_load(module, "load", _megatron_load_path, probes)


def _patch_dcp_loader(module: Any, probes: Probes) -> None:
    """Wrap state_dict_loader.load, and the package's re-export of it where that was bound
    already (the package imported before the probes were installed) to the same original."""
    original = module.load
    _patch_load(module, "load", _dcp_load_path, probes)
    package: Any = sys.modules.get(DCP_PACKAGE)
    if package is not None and getattr(package, "load", None) is original:
        package.load = module.load


def _megatron_save_path(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # dist_checkpointing.save(sharded_state_dict, checkpoint_dir, ...)
    return args[1] if len(args) > 1 else kwargs.get("checkpoint_dir")


def _dcp_save_path(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # async_save(state_dict, *, checkpoint_id=None, storage_writer=None, ...)
    path = kwargs.get("checkpoint_id")
    if path is None:
        path = getattr(kwargs.get("storage_writer"), "path", None)
    return path


def _megatron_load_path(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # dist_checkpointing.load(sharded_state_dict, checkpoint_dir, ...)
    return args[1] if len(args) > 1 else kwargs.get("checkpoint_dir")


def _dcp_load_path(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # load(state_dict, *, checkpoint_id=None, storage_reader=None, ...); torch's _api_bc_check
    # still takes the old load(state_dict, storage_reader) too
    path = kwargs.get("checkpoint_id")
    if path is None:
        reader = kwargs.get("storage_reader")
        if reader is None and len(args) == 2:
            reader = args[1]
        path = getattr(reader, "path", None)
    return path


class ProbeFinder:
    """A ``sys.meta_path`` finder that patches a few modules right after they executed.

    It finds nothing itself: it asks the other finders for the spec and wraps the loader's
    ``exec_module``, so the module is loaded exactly as it would be and patched before anyone
    can bind its names.
    """

    def __init__(self, patches: Mapping[str, Any]) -> None:
        self.patches = dict(patches)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        patch = self.patches.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec

        def exec_and_patch(module: Any) -> None:
            exec_module(module)
            self._apply(fullname, module)

        try:
            loader.exec_module = exec_and_patch
        except (AttributeError, TypeError):
            return spec
        return spec

    def install(self) -> None:
        for name in list(self.patches):
            module = sys.modules.get(name)
            if module is not None:  # imported before us (sitecustomize, ...): patch it now
                self._apply(name, module)
        sys.meta_path.insert(0, self)

    def _apply(self, name: str, module: Any) -> None:
        patch = self.patches.pop(name, None)
        if patch is None:
            return
        try:
            patch(module)
        except Exception:
            _log(None, f"warning: could not install the probe on {name}:\n{traceback.format_exc()}")


def install_probes(probes: Probes) -> ProbeFinder:
    """Patch the library entry points the probes watch (the checkpoint loads only for the
    ``restore`` window), as they are imported, or now where they already were."""
    patches: dict[str, Any] = {
        RANK_MONITOR_MODULE: lambda m: _patch_rank_monitor(m, probes),
        MEGATRON_SAVE_MODULE: lambda m: _patch_megatron(m, probes),
        DCP_SAVER_MODULE: lambda m: _patch_submit(m, "async_save", _dcp_save_path, probes),
    }
    if probes.watches_loads:
        patches[DCP_LOADER_MODULE] = lambda m: _patch_dcp_loader(m, probes)
    finder = ProbeFinder(patches)
    finder.install()
    return finder


def main(argv: Sequence[str] | None = None) -> int:
    """Validate, arm the selected rank (probes, watcher), run the workload in-process."""
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

    injection: Injection | None = None
    probes: WindowProbes | None = None
    watcher: Watcher | None = None
    if rank is not None and rank == opts.fault_rank:
        try:
            injection = _prepare_injection(opts, rank)
        except _StartupError as exc:
            return _fail(rank, str(exc), EXIT_USAGE)
        if injection is not None:
            opts = injection.opts  # a schedule's armed entry; the options as given otherwise
            probes = WindowProbes(injection)
            if opts.window == "step" and opts.fault in ("kill", "hang", "term", "segv"):
                watcher = Watcher(injection, probes)
    observer: TrackerObserver | None = None
    observer_rank = rank if rank is not None else _env_int(os.environ, "RANK")
    if observer_rank == 0:
        observer = TrackerObserver(opts.tracker, 0)
        observer.announce()
        observer.observe("start")
    if probes is not None or observer is not None:
        install_probes(Probes(probes, observer))
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
        if injection is not None:
            injection.stop()

    if injection is None or injection.injected:
        return 0
    why = injection.error
    if why is None:
        try:
            if marker_exists(opts.fault_marker):
                _log(rank, f"marker {opts.fault_marker} was written by another process")
                return 0
        except MarkerPathError as exc:
            why = str(exc)
    if why is None and probes is not None:
        why = probes.never_fired()
    if why is None:
        why = (
            f"tracker {opts.tracker} never advanced beyond {injection.baseline} while training ran"
        )
    return _fail(
        rank,
        f"the requested fault ({opts.describe_fault()}) never happened: {why}",
        EXIT_FAULT_NOT_INJECTED,
    )


class _StartupError(Exception):
    pass


def _prepare_injection(opts: Options, rank: int) -> Injection | None:
    """The selected rank's start-up checks; None when a marker says the fault already happened.

    Only the selected rank validates the tracker: it alone needs the baseline, and a bad tracker
    stops Megatron's own checkpoint load on every rank anyway. A replacement worker (marker
    present) skips the check, installs no probe and runs exactly like the unwrapped workload.
    A schedule arms its first entry whose marker is absent (:func:`_arm_schedule`): the returned
    Injection's options are that entry's.
    """
    if opts.schedule:
        armed = _arm_schedule(opts, rank)
        if armed is None:
            return None
        opts = armed
    else:
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
    sig = FAULT_SIGNALS.get(opts.fault)
    if sig is not None and opts.fault != "ckpt-worker" and signal.getsignal(sig) == signal.SIG_IGN:
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
    how = sig.name if sig is not None else "InjectedFault"
    _log(
        rank,
        f"watching {opts.tracker} (baseline {baseline}) to inject {opts.fault} ({how}) "
        f"in window {opts.window}",
    )
    return Injection(opts, rank, baseline)


def _arm_schedule(opts: Options, rank: int) -> Options | None:
    """The schedule's first entry whose marker does not exist, armed; None when every marker
    exists. A marker present after an absent one is an inconsistent history (_StartupError)."""
    paths = [scheduled_marker_path(opts.fault_marker, k) for k in range(1, len(opts.schedule) + 1)]
    try:
        present = [marker_exists(path) for path in paths]
    except MarkerPathError as exc:
        raise _StartupError(f"{exc}; refusing to run (use a fresh run directory)") from exc
    if all(present):
        _log(
            rank,
            f"marker {paths[-1]} exists: fault already injected (all {len(paths)} scheduled "
            "faults); running the workload without injection",
        )
        return None
    position = present.index(False) + 1
    later = [
        path for path, there in zip(paths[position:], present[position:], strict=True) if there
    ]
    if later:
        raise _StartupError(
            f"schedule markers out of order: {later[0]} exists but {paths[position - 1]} does "
            "not (the schedule's history is inconsistent; use a fresh run directory)"
        )
    armed = opts.armed(position)
    _log(
        rank,
        f"schedule {','.join(opts.schedule_names)}: arming fault {position} of {len(paths)} "
        f"({armed.fault}@{armed.window}), marker {armed.fault_marker}",
    )
    return armed


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


def _or_none(value: int | None) -> str:
    return "none" if value is None else str(value)


def _shorten(value: Any, limit: int = 200) -> str:
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fail(rank: int | None, message: str, code: int) -> int:
    _log(rank, f"ERROR: {message}")
    return code


if __name__ == "__main__":
    sys.exit(main())
