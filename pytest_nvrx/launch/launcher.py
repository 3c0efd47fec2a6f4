"""Start a recipe as a process tree, follow its progress, and always stop the whole tree.

ft_launcher starts its workers in new sessions and a gRPC log server beside them, so neither the
launcher's PID nor its process group covers everything it started. Every process of a run
inherits a unique tag in its environment; cleanup signals the launcher's group, the groups of
all descendants, and every process still carrying the tag (orphans included).

With ``config.launcher == "slurm"`` the launch is one ``srun`` step of one task per node
(:mod:`pytest_nvrx.launch.slurm`). Stop signals stop a run like Ctrl-C, and a launch's cleanup
holds them back (:mod:`pytest_nvrx.launch.stop_signals`); their names are imported from there.
Live progress is read by :mod:`pytest_nvrx.evidence.progress`, in the line formats of the
workload's log adapter: those its parser reads.

:func:`hold_launch` runs a launch whole: started under its GPUs' locks, waited for, stopped, and
its checkpoint dir given back (:mod:`pytest_nvrx.launch.claims`) once its tree is gone;
:func:`wait_launch` waits for one, its deadline's kill an outcome (:class:`LaunchOutcome`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest_nvrx
from pytest_nvrx.evidence.progress import (
    WAIT_LINE_S,
    Progress,
    ProgressReader,
    read_tail,
    waiting_for,
)
from pytest_nvrx.launch import claims
from pytest_nvrx.launch.gpu_slots import LOCK_DIR, gpu_locks
from pytest_nvrx.launch.process_tree import TAG_VAR, kill_tree
from pytest_nvrx.launch.recipe import (
    Recipe,
    manifest,
    utc_now,
    write_json_atomic,
)
from pytest_nvrx.launch.run_dir_setup import give_back_run_dir, make_run_tmpdir
from pytest_nvrx.launch.slurm import SlurmLaunch
from pytest_nvrx.launch.stop_signals import deferred_stop_signals, interrupt_signal
from pytest_nvrx.launch.watchdog import DONE as WATCHDOG_DONE
from pytest_nvrx.layout import (
    CONSOLE_LOG_NAME,
    MANIFEST_NAME,
    RESULT_NAME,
    node_console_log_name,
    node_file_name,
)
from pytest_nvrx.outputs import is_disk_full
from pytest_nvrx.settings import ConfigError


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


def tail_text(path: Path, lines: int = 40) -> str:
    data = read_tail(path, 256 * 1024).decode("utf-8", errors="replace").splitlines()
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
        """The run's watchdog (pytest_nvrx.launch.watchdog): a process of its own session that stops
        the run if this harness dies, by whatever signal, before it released it."""
        assert self.tmpdir is not None
        read_end, write_end = os.pipe()
        env = {k: v for k, v in os.environ.items() if k != TAG_VAR}
        here = str(Path(pytest_nvrx.__file__).resolve().parent.parent)  # holds pytest_nvrx/
        env["PYTHONPATH"] = os.pathsep.join([here, *filter(None, [env.get("PYTHONPATH")])])
        try:
            self._watchdog = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "pytest_nvrx.launch.watchdog",
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

    def _waiting(self, prog: Progress, quiet_s: float, left_s: float) -> Progress:
        """``prog`` with what the run waits for (the recipe's NVRx deadlines)."""
        config = self.recipe.config
        said = waiting_for(
            prog,
            quiet_s=quiet_s,
            run_left_s=left_s,
            sections=config.section_timeouts,
            out_of_section_s=config.out_of_section_timeout,
        )
        return dataclasses.replace(prog, waiting=said)

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
        ``on_progress`` gets each new state, and at least every :data:`WAIT_LINE_S` of a wait
        that shows nothing new what it waits for (a hung rank's detection) and how long is left.
        """
        assert self._popen is not None, "start() first"
        if sleep is None:
            sleep = self._wait_for_exit
        deadline = clock() + timeout_s
        said_at = clock()
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
                        last, said_at = prog.state, clock()
                        on_progress(prog)
                    elif clock() - said_at >= WAIT_LINE_S:
                        on_progress(self._waiting(prog, clock() - said_at, deadline - clock()))
                        said_at = clock()
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


@dataclass(frozen=True)
class LaunchOutcome:
    """How a launch ended: the launcher's result, or the deadline's message (tree killed)."""

    result: RunResult | None
    timed_out: str | None = None


def wait_launch(
    launch: Launch, timeout_s: float, on_progress: Callable[[Progress], None] | None = None
) -> LaunchOutcome:
    """Wait for a started launch to end: the launcher's result, or the deadline's message (its
    tree killed)."""
    try:
        return LaunchOutcome(launch.wait(timeout_s, on_progress=on_progress))
    except RunTimeout as exc:
        return LaunchOutcome(None, str(exc))


def hold_launch(
    launch: Launch,
    wait: Callable[[Launch], LaunchOutcome],
    *,
    gpus: Sequence[str] = (),
    lock_dir: Path = LOCK_DIR,
    on_start: Callable[[Launch], None] | None = None,
) -> LaunchOutcome:
    """Start ``launch`` holding a lock per GPU in ``gpus`` (in ``lock_dir``) and ``wait`` for it;
    leaving kills the whole tree and writes result.json, also on Ctrl-C or a stop signal, then
    frees the run's checkpoint dir for the next run (its run dir stays claimed)."""
    try:
        with gpu_locks(list(gpus), lock_dir=lock_dir), launch:
            if on_start is not None:
                on_start(launch)
            return wait(launch)
    finally:
        # the tree is stopped (Launch's exit): the checkpoint dir is free for the next run
        claims.release(launch.layout)
