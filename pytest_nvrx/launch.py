"""Start a recipe as a process tree, follow its progress, and always stop the whole tree.

ft_launcher starts its workers in new sessions and a gRPC log server beside them, so neither the
launcher's PID nor its process group covers everything it started. Every process of a run
inherits a unique tag in its environment; cleanup signals the launcher's group, the groups of
all descendants, and every process still carrying the tag (orphans included).

With ``config.launcher == "slurm"`` the launch is one ``srun`` step of one task per node
(:mod:`pytest_nvrx.slurm_launch`). Stop signals stop a run like Ctrl-C, and a launch's cleanup
holds them back (:mod:`pytest_nvrx.stop_signals`). Both modules' names are re-exported here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from pytest_nvrx.layout import CONSOLE_LOG_NAME as CONSOLE_LOG_NAME  # re-exported
from pytest_nvrx.layout import (
    MANIFEST_NAME,
    RunLayout,
    cycle_log_name,
    node_console_log_name,
    node_file_name,
)
from pytest_nvrx.layout import RESULT_NAME as RESULT_NAME  # re-exported: launch.RESULT_NAME
from pytest_nvrx.outputs import is_disk_full
from pytest_nvrx.process_tree import TAG_VAR as TAG_VAR  # re-exported: launch.TAG_VAR
from pytest_nvrx.process_tree import descendants as descendants
from pytest_nvrx.process_tree import kill_tree as kill_tree
from pytest_nvrx.process_tree import tagged as tagged
from pytest_nvrx.recipe import MULTI_LAUNCHERS_VAR as MULTI_LAUNCHERS_VAR  # re-exported
from pytest_nvrx.recipe import (
    Recipe,
    manifest,
    utc_now,
    write_json_atomic,
)
from pytest_nvrx.run_dir import give_back_run_dir, make_run_tmpdir
from pytest_nvrx.settings import ConfigError
from pytest_nvrx.slurm_launch import IS_HOST_PLACEHOLDER as IS_HOST_PLACEHOLDER  # re-exported
from pytest_nvrx.slurm_launch import NODE_SHIM as NODE_SHIM
from pytest_nvrx.slurm_launch import SlurmError as SlurmError
from pytest_nvrx.slurm_launch import SlurmLaunch as SlurmLaunch
from pytest_nvrx.slurm_launch import node_launcher_argv as node_launcher_argv
from pytest_nvrx.slurm_launch import parse_job_id as parse_job_id
from pytest_nvrx.slurm_launch import parse_node_addr as parse_node_addr
from pytest_nvrx.slurm_launch import shared_hosts as shared_hosts
from pytest_nvrx.slurm_launch import slurm_preview as slurm_preview
from pytest_nvrx.slurm_launch import srun_argv as srun_argv
from pytest_nvrx.stop_signals import STOP_SIGNALS as STOP_SIGNALS  # re-exported
from pytest_nvrx.stop_signals import Interrupted as Interrupted
from pytest_nvrx.stop_signals import deferred_stop_signals as deferred_stop_signals
from pytest_nvrx.stop_signals import interrupt_on_stop_signals as interrupt_on_stop_signals
from pytest_nvrx.stop_signals import interrupt_signal as interrupt_signal
from pytest_nvrx.watchdog import DONE as WATCHDOG_DONE

_ITERATION = re.compile(rb"iteration\s+(\d+)\s*/\s*(\d+)")


class RunTimeout(RuntimeError):
    """The run outlived its deadline; the tree was killed. The message carries a hint."""


@dataclass(frozen=True)
class RunResult:
    exit_code: int | None
    wall_s: float
    timed_out: bool
    #: the stop signal's name (``"SIGTERM"``), None when the run was not interrupted
    interrupted: str | None
    start_time: str
    end_time: str
    #: the launcher's PID: NVRx names a node ``<host>_<launcher pid>_<n>`` in launcher.log
    #: ("has joined the rendezvous ... as rank R"), which ties ranks to nodes started by hand
    launcher_pid: int | None = None
    #: the runs of this session that held one of this run's GPUs while it ran (a pool with
    #: --nvrx-gpu-share > 1): its recovery timings include their memory and their load; None
    #: where nothing kept count (a CPU run, a launch outside a pool)
    gpu_shared_with: tuple[str, ...] | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "exit_code": self.exit_code,
            "launcher_pid": self.launcher_pid,
            "wall_s": round(self.wall_s, 3),
            "timed_out": self.timed_out,
            "interrupted": self.interrupted,
            "start_time": self.start_time,
            "end_time": self.end_time,
        }
        if self.gpu_shared_with is not None:
            out["gpu_shared_with"] = list(self.gpu_shared_with)
        return out


# ---------------------------------------------------------------------------------------------
# progress


@dataclass(frozen=True)
class InjectedFault:
    """The fault as the progress lines tell it, from the marker: who, what and when."""

    rank: int | None
    fault: str | None
    #: the cycle the fault hit, and the last iteration it had committed when the marker appeared
    cycle: int
    iteration: int | None
    #: a fault schedule's fault: its position (from 1) and the checkpoint a restore fault struck
    #: the load of (None: a run of one fault; not a restore)
    position: int | None = None
    loading: int | None = None

    def describe(self) -> str:
        kind = f" ({self.fault})" if self.fault else ""
        rank = f" into rank {self.rank}" if self.rank is not None else ""
        if self.loading is not None:
            at = f" while it loaded checkpoint {self.loading}"
        elif self.iteration is not None:
            at = f" at iteration {self.iteration}"
        else:
            at = " before the first iteration"
        which = f"fault {self.position}" if self.position is not None else "fault"
        return f"{which} injected{rank}{at}{kind}"


@dataclass(frozen=True)
class Progress:
    """What can be seen of a live run from its run directory.

    Every field describes the newest cycle only (a new cycle never shows its predecessor's
    iteration); ``fault`` is the injection, once its marker was read. ``news`` says what this
    reading saw for the first time, so that a line announces the fault and a restore once.
    """

    elapsed_s: float
    #: the newest cycle with a log (``train_cycle<N>.log``); None before the first one
    cycle: int | None
    iteration: int | None
    total: int | None
    #: the checkpoint iteration the newest cycle began loading (a workload that says so)
    restoring: int | None = None
    #: the checkpoint iteration the newest cycle reports loaded
    restored: int | None = None
    fault: InjectedFault | None = None
    news: frozenset[str] = frozenset()

    @property
    def fault_injected(self) -> bool:
        return self.fault is not None

    @property
    def state(self) -> tuple[object, ...]:
        """What a new progress line is printed for (elapsed time aside)."""
        return (self.cycle, self.iteration, self.restoring, self.restored, self.fault)

    def describe(self) -> str:
        if self.cycle is None:
            # no worker has written a line yet: rendezvous, or the launcher still importing
            return f"[{self.elapsed_s:6.1f}s] launcher starting"
        cycle = f"cycle {self.cycle}"
        if self.iteration is not None:
            now = f"{cycle}, iteration {self.iteration}/{self.total}"
            if "restored" in self.news:
                now = f"{cycle} restored checkpoint {self.restored}, iteration "
                now += f"{self.iteration}/{self.total}"
        elif self.restored is not None:
            now = f"{cycle} restored checkpoint {self.restored}"
        elif self.restoring is not None:
            now = f"{cycle} restoring checkpoint {self.restoring}"
        else:
            now = f"{cycle} starting"
        if self.fault is not None and "fault" in self.news:
            if self.fault.cycle == self.cycle and self.iteration == self.fault.iteration:
                # the cycle that was hit, not past the fault: the fault is all there is to say
                now = f"{cycle}: {self.fault.describe()}"
            else:
                now = f"cycle {self.fault.cycle}: {self.fault.describe()}; {now}"
        return f"[{self.elapsed_s:6.1f}s] {now}"


#: a line's NVRx rank prefix ("0: ", "12: "), as the cycle-log parser strips it
_RANK_PREFIX = re.compile(rb"^\s*\d+: ")
#: at most this much of a cycle log is read per poll; a log that grew more is read from its tail
_READ_LIMIT = 8 * 1024 * 1024
_TAIL_SIZE = 65536


class ProgressReader:
    """Follows a live run's newest cycle log and its marker, reading only what was added.

    Cheap on purpose (it runs every poll of a launch): each byte of the newest cycle log is read
    once (a burst above ``_READ_LIMIT`` is skipped to its tail), the marker once it is complete.
    Checkpoint loads are recognised by the workload's own log adapter
    (:mod:`pytest_nvrx.evidence.workload`), so the formats stay defined in one place.
    """

    def __init__(self, layout: RunLayout, workload: str | None = None) -> None:
        self.layout = layout
        self._workload = workload
        self._adapter: Any = None
        self._adapter_loaded = False
        self._cycle: int | None = None
        self._offset = 0
        self._partial = b""
        self._iteration: int | None = None
        self._total: int | None = None
        self._restoring: int | None = None
        self._restored: int | None = None
        self._fault: InjectedFault | None = None
        self._faults_read = 0

    def read(self, elapsed_s: float) -> Progress:
        news: set[str] = set()
        logs = self.layout.cycle_log_paths()
        if logs:
            newest = max(logs)
            if newest != self._cycle:
                self._start_cycle(newest)
            restored_before = self._restored
            self._follow(logs[newest])
            if self._restored is not None and restored_before is None:
                news.add("restored")
        # a schedule's faults come one per cycle: the next marker, once the last was read
        fault = self._read_fault(logs, self._faults_read + 1)
        if fault is not None:
            self._fault = fault
            self._faults_read += 1
            news.add("fault")
        return Progress(
            elapsed_s=elapsed_s,
            cycle=self._cycle,
            iteration=self._iteration,
            total=self._total,
            restoring=self._restoring,
            restored=self._restored,
            fault=self._fault,
            news=frozenset(news),
        )

    def _start_cycle(self, cycle: int) -> None:
        self._cycle = cycle
        self._offset = 0
        self._partial = b""
        self._iteration = self._total = self._restoring = self._restored = None

    def _follow(self, log: Path) -> None:
        try:
            with log.open("rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size < self._offset:  # replaced or truncated: start over
                    self._offset, self._partial = 0, b""
                if size - self._offset > _READ_LIMIT:
                    # a burst: its tail, from a line start
                    self._offset, self._partial = size - _TAIL_SIZE, b""
                    fh.seek(self._offset)
                    fh.readline()
                else:
                    fh.seek(self._offset)
                data = fh.read(_READ_LIMIT)
                self._offset = fh.tell()
        except OSError:
            return
        data = self._partial + data
        complete = data.rfind(b"\n") + 1
        self._partial = data[complete:]
        self._scan(data[:complete])

    def _scan(self, data: bytes) -> None:
        for match in _ITERATION.finditer(data):
            iteration = int(match[1])
            if self._iteration is None or iteration >= self._iteration:
                self._iteration, self._total = iteration, int(match[2])
        if b"load" not in data:
            return
        adapter = self._load_adapter()
        if adapter is None:
            return
        from pytest_nvrx.evidence.refs import LineCursor
        from pytest_nvrx.evidence.workload import LoadCompleted, LoadStarted

        cursor = LineCursor(cycle_log_name(self._cycle or 0))
        for raw in data.splitlines():
            if b"load" not in raw:
                continue
            prefix = _RANK_PREFIX.match(raw)
            text = raw[prefix.end() if prefix else 0 :].decode("utf-8", "replace")
            cursor.raw = text
            event = adapter.parse_line(text, cursor)
            if isinstance(event, LoadCompleted):
                self._restored = event.iteration
            elif isinstance(event, LoadStarted):
                self._restoring = event.iteration

    def _load_adapter(self) -> Any:
        if not self._adapter_loaded:
            self._adapter_loaded = True
            workload = self._workload or _manifest_workload(self.layout)
            if workload:
                from pytest_nvrx.evidence.workload import get_adapter

                with contextlib.suppress(KeyError, ImportError):
                    self._adapter = get_adapter(workload)
        return self._adapter

    def _read_fault(self, logs: Mapping[int, Path], position: int) -> InjectedFault | None:
        """The injection of the marker at ``position`` (1: the run's one fault, or a schedule's
        first), once it is complete (it is written after its claim: an unreadable one is read
        again at the next poll)."""
        marker_path = self.layout.marker_at(position)
        if not marker_path.exists():
            return None
        from pytest_nvrx.evidence.marker import read_marker

        marker = read_marker(marker_path, self.layout.run_dir)
        if marker is None or not marker.ok:
            return None
        # the cycle hit: the injecting worker's restart count names it where that cycle's log
        # exists (our injector records it), else the newest cycle
        data = marker.doc.data if marker.doc is not None else None
        restarts = data.get("restart_count") if isinstance(data, dict) else None
        cycle = self._cycle if self._cycle is not None else 0
        if isinstance(restarts, int) and restarts in logs and restarts <= cycle:
            cycle = restarts
        if cycle == self._cycle:
            iteration = self._iteration
        else:
            found = _ITERATION.findall(_tail(logs[cycle]))
            iteration = max(int(it) for it, _ in found) if found else None
        return InjectedFault(
            rank=marker.rank,
            fault=marker.fault,
            cycle=cycle,
            iteration=iteration,
            position=marker.schedule_position,
            loading=marker.load_iteration,
        )


def read_progress(layout: RunLayout, elapsed_s: float, workload: str | None = None) -> Progress:
    """One look at a run (a :class:`ProgressReader` read once)."""
    return ProgressReader(layout, workload).read(elapsed_s)


def _manifest_workload(layout: RunLayout) -> str | None:
    import json

    try:
        data = json.loads(layout.manifest.read_text())
    except (OSError, ValueError):
        return None
    config = data.get("config") if isinstance(data, dict) else None
    workload = config.get("workload") if isinstance(config, dict) else None
    return workload if isinstance(workload, str) else None


def _tail(path: Path, size: int = _TAIL_SIZE) -> bytes:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            end = fh.tell()
            fh.seek(max(0, end - size))
            return fh.read()
    except OSError:
        return b""


def tail_text(path: Path, lines: int = 40) -> str:
    data = _tail(path, 256 * 1024).decode("utf-8", errors="replace").splitlines()
    return "\n".join(data[-lines:])


# ---------------------------------------------------------------------------------------------
# a running launch


class Launch:
    """A launched recipe. Use as a context manager: leaving it always kills the whole tree,
    removes the launch's TMPDIR and leaves a result.json."""

    def __init__(
        self,
        recipe: Recipe,
        *,
        stack: Mapping[str, Any] | None = None,
        gpu_sharing: Callable[[], Sequence[str]] | None = None,
    ) -> None:
        self.recipe = recipe
        #: asked as the launch ends: which runs shared its GPUs (result.json)
        self._gpu_sharing = gpu_sharing
        self.layout = recipe.layout
        self.tag = uuid.uuid4().hex
        #: a by-hand node (run --node-index): its own console, and beside node 0's run.json
        #: and result.json its own (node 0 hosted the rendezvous: its files are the run's)
        self.node_index = recipe.config.node_index
        self.console = self.layout.logs / (
            CONSOLE_LOG_NAME if self.node_index is None else node_console_log_name(self.node_index)
        )
        #: the launcher's TMPDIR, made fresh by start() (run_dir.make_run_tmpdir)
        self.tmpdir: Path | None = None
        #: how the launch ended, once result.json is written
        self.result: RunResult | None = None
        self._stack = stack
        self._popen: subprocess.Popen[bytes] | None = None
        self._console_fh: IO[bytes] | None = None
        self._started_at = 0.0
        self._start_time = ""
        #: the Slurm side of a ``launcher == "slurm"`` launch, once start() began it
        self.slurm: SlurmLaunch | None = None
        #: the stop signal that ended this launch from outside wait() (stop_for): a pool's
        #: waiting thread records it in result.json as wait() does its own
        self.interrupted_by: signal.Signals | None = None
        self._progress = ProgressReader(self.layout, recipe.config.workload)
        #: the run's watchdog and the write end of its pipe (None once released)
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._watchdog_fd: int | None = None

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen is not None else None

    def start(self) -> Launch:
        # A new private TMPDIR for this launch; run.json records it (a dry run shows the
        # recipe's stand-in name).
        self.tmpdir = make_run_tmpdir(self.recipe.config.run_id)
        self.recipe = dataclasses.replace(
            self.recipe, env={**self.recipe.env, "TMPDIR": str(self.tmpdir)}
        )
        wrote_manifest = False
        try:
            env = dict(os.environ)
            argv = self.recipe.argv
            if self.recipe.config.launcher == "slurm":
                self.slurm = SlurmLaunch(self.recipe, env)
                self.slurm.prepare()
                self.recipe = self.slurm.recipe
                argv = self.slurm.argv
                env.update(self.slurm.env)
            man = manifest(self.recipe, stack=self._stack)
            target = self.layout.manifest
            if self.slurm is not None:
                man["slurm"] = self.slurm.describe()
            elif self.node_index is not None:
                man["node_index"] = self.node_index
                target = self._node_file(MANIFEST_NAME)
            elif self.recipe.config.nnodes > 1 and target.exists():
                # another node of this run wrote run.json first: keep ours beside it
                target = target.with_name(f"run.{man['host']}.json")
            try:
                write_json_atomic(target, man)
            except OSError as exc:
                if not is_disk_full(exc):
                    raise
                raise ConfigError(
                    f"no space left for {target}: {exc.strerror}; free space there or choose"
                    " another work dir (nothing was launched)"
                ) from None
            wrote_manifest = True
            env.update(self.recipe.env)
            # every process of the run carries the tag, a Slurm step's tasks too (srun passes
            # the environment on)
            env[TAG_VAR] = self.tag
            self._console_fh = self.console.open("ab")
            self._start_time = utc_now()
            self._started_at = time.monotonic()
            # before the launcher: no moment when the run goes unwatched
            self._start_watchdog()
            try:
                self._popen = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=self._console_fh,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=str(self.layout.run_dir),
                    start_new_session=True,
                )
            except OSError as exc:
                raise RuntimeError(f"cannot start {argv[0]!r}: {exc}") from exc
            self._tell_watchdog(f"pid {self._popen.pid}\n".encode())
        except BaseException:
            # __exit__ does not run when __enter__ fails: clean up here (a signal may have
            # arrived just after the launcher started, so look for its tag too)
            with deferred_stop_signals():
                self.stop(grace_s=2.0)
                self._release_watchdog()
                if not wrote_manifest:  # no run here: nothing may block its ID
                    config = self.recipe.config
                    give_back_run_dir(self.layout, nnodes=config.nnodes, node_index=self.node_index)
            raise
        return self

    def _start_watchdog(self) -> None:
        """The run's watchdog (pytest_nvrx.watchdog): a process of its own session that stops
        the run if this harness dies, by whatever signal, before it released it."""
        assert self.tmpdir is not None
        read_end, write_end = os.pipe()
        env = {k: v for k, v in os.environ.items() if k != TAG_VAR}
        here = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join([here, *filter(None, [env.get("PYTHONPATH")])])
        try:
            self._watchdog = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "pytest_nvrx.watchdog",
                    "--fd",
                    str(read_end),
                    "--tag",
                    self.tag,
                    "--result",
                    str(self._node_file(RESULT_NAME)),
                    "--tmpdir",
                    str(self.tmpdir),
                    "--start-time",
                    self._start_time,
                    "--started-at",
                    repr(time.time()),
                    "--checkpoint-dir",
                    str(self.layout.checkpoint_dir),
                    "--harness-pid",
                    str(os.getpid()),
                ],
                pass_fds=(read_end,),
                stdin=subprocess.DEVNULL,
                stdout=self._console_fh,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            os.close(write_end)
            raise RuntimeError(f"cannot start the run's watchdog: {exc}") from exc
        finally:
            os.close(read_end)
        self._watchdog_fd = write_end

    def _tell_watchdog(self, message: bytes) -> None:
        if self._watchdog_fd is not None:
            with contextlib.suppress(OSError):
                os.write(self._watchdog_fd, message)

    def _release_watchdog(self) -> None:
        """The harness stopped the tree and wrote result.json itself: the watchdog may go."""
        if self._watchdog_fd is None:
            return
        self._tell_watchdog(WATCHDOG_DONE)
        with contextlib.suppress(OSError):
            os.close(self._watchdog_fd)
        self._watchdog_fd = None
        if self._watchdog is not None:
            try:
                self._watchdog.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._watchdog.kill()
                self._watchdog.wait()

    def __enter__(self) -> Launch:
        return self.start() if self._popen is None else self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        with deferred_stop_signals():
            self.stop()
            if self._popen is not None and self.result is None:
                stopped_by = interrupt_signal(exc) if isinstance(exc, KeyboardInterrupt) else None
                self._record(timed_out=False, interrupted=stopped_by)
            self._release_watchdog()

    def stop_for(self, cause: BaseException | None) -> None:
        """Stop the tree because of ``cause`` (a stop signal: result.json names it)."""
        if isinstance(cause, KeyboardInterrupt):
            self.interrupted_by = interrupt_signal(cause)
        self.stop()

    def stop(self, grace_s: float = 5.0) -> None:
        # srun forwards the SIGTERM to the step's tasks; on this host the tag finds them too
        kill_tree(self.pid, self.tag, grace_s=grace_s)
        if self._popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._popen.wait(timeout=grace_s)
        if self.slurm is not None:
            # what runs on other nodes: the step (or the allocation made for it) is cancelled
            self.slurm.release()
        if self._console_fh is not None:
            self._console_fh.close()
            self._console_fh = None
        if self.tmpdir is not None:
            # the launcher's sockets and scratch files; we made it, nobody else uses it
            shutil.rmtree(self.tmpdir, ignore_errors=True)

    def _record(self, *, timed_out: bool, interrupted: signal.Signals | None) -> RunResult:
        """Write result.json (once): how the launcher ended."""
        assert self._popen is not None
        self.result = RunResult(
            exit_code=self._popen.poll(),
            wall_s=time.monotonic() - self._started_at,
            timed_out=timed_out,
            interrupted=interrupted.name if interrupted is not None else None,
            start_time=self._start_time,
            end_time=utc_now(),
            launcher_pid=self._popen.pid,
            gpu_shared_with=tuple(sorted(self._gpu_sharing()))
            if self._gpu_sharing is not None
            else None,
        )
        write_json_atomic(self._node_file(RESULT_NAME), self.result.as_dict())
        return self.result

    def _node_file(self, name: str) -> Path:
        """``name`` in the run dir: node 0's (or an unnumbered launch's), else the node's own."""
        if not self.node_index:
            return self.layout.run_dir / name
        return self.layout.run_dir / node_file_name(name, self.node_index)

    def progress(self) -> Progress:
        return self._progress.read(time.monotonic() - self._started_at)

    def _wait_for_exit(self, timeout_s: float) -> None:
        """Like ``time.sleep(timeout_s)``, but returns as soon as the launcher exits."""
        assert self._popen is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout=timeout_s)

    def wait(
        self,
        timeout_s: float,
        *,
        on_progress: Callable[[Progress], None] | None = None,
        poll_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] | None = None,
    ) -> RunResult:
        """Wait for the launcher to exit; on timeout or a stop signal kill the tree and say so.

        Between polls it waits on the launcher itself (``sleep`` None), so its exit is seen at
        once rather than up to ``poll_s`` later. A stop signal (:class:`Interrupted`, or Ctrl-C's
        KeyboardInterrupt) propagates after the tree is stopped and result.json names it.
        """
        assert self._popen is not None, "start() first"
        if sleep is None:
            sleep = self._wait_for_exit
        deadline = clock() + timeout_s
        last: tuple[object, ...] | None = None
        timed_out = False
        interrupted: signal.Signals | None = None
        try:
            while self._popen.poll() is None:
                if clock() >= deadline:
                    timed_out = True
                    break
                if on_progress is not None:
                    prog = self.progress()
                    if prog.state != last:
                        last = prog.state
                        on_progress(prog)
                sleep(poll_s)
        except KeyboardInterrupt as exc:
            interrupted = interrupt_signal(exc)
            raise
        finally:
            with deferred_stop_signals():
                if timed_out or interrupted is not None or self._popen.poll() is None:
                    self.stop()
                interrupted = interrupted or self.interrupted_by
                result = self._record(timed_out=timed_out, interrupted=interrupted)
        # The launcher exited: its workers, monitors and log server must be gone too.
        with deferred_stop_signals():
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
