"""Start a recipe as a process tree, follow its progress, and always stop the whole tree.

ft_launcher starts its workers in new sessions and a gRPC log server beside them, so neither the
launcher's PID nor its process group covers everything it started. Every process of a run
inherits a unique tag in its environment; cleanup signals the launcher's group, the groups of
all descendants, and every process still carrying the tag (orphans included).

With ``config.launcher == "slurm"`` the launch is one ``srun`` step of one task per node, each
task a node's ft_launcher (:class:`SlurmLaunch`): the rendezvous host is the step's first node,
the allocation is the caller's (inside a batch script or an salloc shell) or one made here with
``salloc`` and cancelled when the launch ends.

SIGTERM (CI cancel, Slurm timeout) and SIGHUP (a closed terminal) stop a run like Ctrl-C: inside
:func:`interrupt_on_stop_signals` each raises :class:`Interrupted`, a ``KeyboardInterrupt``. A
launch's cleanup runs with those signals held back (:func:`deferred_stop_signals`), so a second
one cannot cut it short.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

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
    check_fresh_run_dir,
    give_back_run_dir,
    make_run_tmpdir,
    manifest,
    rdzv_host_option,
    utc_now,
    write_json_atomic,
)
from pytest_nvrx.settings import DEFAULT_RDZV_ENDPOINT, ConfigError
from pytest_nvrx.watchdog import DONE as WATCHDOG_DONE

CONSOLE_LOG_NAME = "launcher.console.log"
_ITERATION = re.compile(rb"iteration\s+(\d+)\s*/\s*(\d+)")


class RunTimeout(RuntimeError):
    """The run outlived its deadline; the tree was killed. The message carries a hint."""


# ---------------------------------------------------------------------------------------------
# stop signals

#: Signals that stop a run the way Ctrl-C does.
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """A stop signal arrived. A ``KeyboardInterrupt``, so pytest (exit 2, teardown and report)
    and every ``except KeyboardInterrupt`` treat SIGTERM and SIGHUP like Ctrl-C."""

    def __init__(self, signum: int) -> None:
        self.signal = signal.Signals(signum)
        super().__init__(self.signal.name)

    @property
    def exit_status(self) -> int:
        """What a shell reports for a process ended by this signal: 128 + its number."""
        return 128 + int(self.signal)


def interrupt_signal(exc: BaseException) -> signal.Signals:
    """The signal behind an interruption (a plain KeyboardInterrupt is SIGINT)."""
    return exc.signal if isinstance(exc, Interrupted) else signal.SIGINT


@dataclass
class _StopSignalState:
    """Process-wide: signal handlers are process-wide too."""

    installed: bool = False
    #: the signal that interrupted, once one did: later ones are absorbed
    interrupted: int | None = None
    #: open deferred_stop_signals blocks, and a signal that arrived in one
    defer_depth: int = 0
    held: int | None = None


_STATE = _StopSignalState()


def _on_stop_signal(signum: int, frame: object) -> None:
    if _STATE.interrupted is not None:
        return  # the first one's cleanup is under way: never cut it short
    if _STATE.defer_depth:
        # only reached when another thread took the signal (the main thread blocks them)
        _STATE.held = _STATE.held or signum
        return
    _interrupt(signum)


def _interrupt(signum: int) -> None:
    """The first stop signal: from now on the process is stopping. Further stop signals are
    ignored by the kernel itself, which also holds while the interpreter shuts down (it resets
    Python-level handlers to the default action, which would end a cleanly stopped process
    by the signal after all)."""
    _STATE.interrupted = signum
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    raise Interrupted(signum)


@contextlib.contextmanager
def interrupt_on_stop_signals() -> Iterator[None]:
    """While the block runs, SIGINT, SIGTERM and SIGHUP raise :class:`Interrupted`.

    SIGINT is handled whatever this process inherited: started with SIGINT ignored (a script's
    background job and some CI runners ignore it without anyone asking), it still stops on
    SIGINT. SIGTERM and SIGHUP inherited as ignored stay ignored: that is a request (``nohup``:
    survive the terminal's hangup) and the launched tree inherits it. Children started in the
    block get default dispositions for the handled signals (a handled signal is reset on exec,
    an ignored one would stay ignored). Only the first signal raises; from then on the stop signals
    are ignored, also after the block ends: what follows (result.json, pytest's teardown and
    report, the CLI's last line, the interpreter's exit) is cleanup too, and the process is on
    its way out. Without an interruption the previous handlers come back. A no-op outside the
    main thread or when already active.
    """
    if _STATE.installed or threading.current_thread() is not threading.main_thread():
        yield
        return
    _STATE.interrupted = _STATE.held = None
    previous = {
        sig: signal.signal(sig, _on_stop_signal)
        for sig in STOP_SIGNALS
        if sig == signal.SIGINT or signal.getsignal(sig) != signal.SIG_IGN
    }
    _STATE.installed = True
    try:
        yield
    finally:
        with deferred_stop_signals():
            if _STATE.interrupted is None:
                for sig, handler in previous.items():
                    signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
            _STATE.installed = False


@contextlib.contextmanager
def deferred_stop_signals() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP back while the block runs (a run's cleanup must finish);
    one that arrived meanwhile acts when the block ends.

    Blocked in the main thread (so a default handler cannot fire either); never around starting
    a child, which would inherit the blocked mask.
    """
    main = threading.current_thread() is threading.main_thread()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS) if main else None
    _STATE.defer_depth += 1
    try:
        yield
    finally:
        if old is not None:
            # a pending signal is handled here, while defer_depth still holds it back
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        _STATE.defer_depth -= 1
        held = _STATE.held if not _STATE.defer_depth else None
        if held is not None:
            _STATE.held = None
            if _STATE.installed and _STATE.interrupted is None:
                _interrupt(held)


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

    def describe(self) -> str:
        kind = f" ({self.fault})" if self.fault else ""
        rank = f" into rank {self.rank}" if self.rank is not None else ""
        at = (
            f" at iteration {self.iteration}"
            if self.iteration is not None
            else " before the first iteration"
        )
        return f"fault injected{rank}{at}{kind}"


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
        if self._fault is None:
            self._fault = self._read_fault(logs)
            if self._fault is not None:
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

    def _read_fault(self, logs: Mapping[int, Path]) -> InjectedFault | None:
        """The injection, once the marker is complete (it is written after its claim: an
        unreadable one is read again at the next poll)."""
        marker_path = self.layout.marker
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
        return InjectedFault(rank=marker.rank, fault=marker.fault, cycle=cycle, iteration=iteration)


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
# Slurm: one ft_launcher per node, as the tasks of one srun step

#: In a node's launcher argv: replaced on each node by ``true`` on the rendezvous host (the
#: step's first node, which hosts the c10d store, NVRx's log server and the cycle records) and
#: ``false`` elsewhere. Explicit, because NVRx guesses it from the host name, and several nodes
#: on one host (a test cluster) would all guess true.
IS_HOST_PLACEHOLDER = "@NVRX_IS_HOST@"
#: the rendezvous host's Slurm node name, for the shim
RDZV_NODE_VAR = "NVRX_RDZV_NODE"
#: Extra arguments for salloc / srun (a partition, an account, a container), shell-quoted.
SALLOC_ARGS_VAR = "NVRX_SALLOC_ARGS"
SRUN_ARGS_VAR = "NVRX_SRUN_ARGS"
#: Slurm commands that answer at once; a stuck controller must not hang the launch.
SLURM_QUERY_TIMEOUT_S = 30.0
#: How long salloc may wait for nodes.
SALLOC_TIMEOUT_S = 600.0

#: Run on each node by srun (``bash -c NODE_SHIM nvrx-node <argv>``): a TMPDIR of the node's own
#: below the launch's (two launchers on one host must not share torchelastic's files), the
#: rendezvous-host flag, then exec the node's ft_launcher.
NODE_SHIM = (
    'node="${SLURMD_NODENAME:?not a task of a Slurm step}"; '
    'is_host=false; [ "$node" = "${' + RDZV_NODE_VAR + ':?}" ] && is_host=true; '
    'export TMPDIR="$TMPDIR/$node"; mkdir -p -m 700 "$TMPDIR" || exit 1; '
    "args=(); "
    'for a in "$@"; do args+=("${a//' + IS_HOST_PLACEHOLDER + '/$is_host}"); done; '
    'exec "${args[@]}"'
)
_JOB_ALLOCATION = re.compile(r"job allocation (\d+)")
_NODE_ADDR = re.compile(r"(?:^|\s)NodeAddr=(\S+)")


class SlurmError(RuntimeError):
    """A Slurm command failed or the allocation cannot hold the run; the message names it."""


def _slurm(argv: list[str], *, timeout: float = SLURM_QUERY_TIMEOUT_S) -> str:
    """Run a Slurm client command and return its stdout; any failure is a SlurmError."""
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmError(f"{shlex.join(argv)}: {exc}") from None
    if done.returncode != 0:
        raise SlurmError(
            f"{shlex.join(argv)} exited with {done.returncode}: {done.stderr.strip()[-2000:]}"
        )
    return done.stdout


def parse_job_id(salloc_stderr: str) -> str | None:
    """The job ID salloc names (``salloc: Granted job allocation 12``; pending ones too)."""
    m = _JOB_ALLOCATION.search(salloc_stderr)
    return m.group(1) if m else None


def parse_node_addr(scontrol_line: str) -> str | None:
    """``NodeAddr=`` of one ``scontrol -o show node`` line (the address its slurmd is reached
    at: the node's host name on most clusters)."""
    m = _NODE_ADDR.search(scontrol_line)
    return m.group(1) if m else None


def shared_hosts(addresses: Sequence[str]) -> bool:
    """Several nodes of the step on one host (Slurm nodes simulated by several slurmd)."""
    return len(set(addresses)) < len(addresses)


def srun_argv(
    *,
    srun: str,
    job_id: str,
    nodes: Sequence[str],
    step_name: str,
    console_dir: Path,
    node_argv: Sequence[str],
    extra: Sequence[str] = (),
) -> list[str]:
    """One task per node, each running the shim and then that node's ft_launcher.

    ``--kill-on-bad-exit``: a node's launcher that gives up ends the others (they would wait
    in the rendezvous until its timeout). ``--cpu-bind=none``: the launcher and its ranks get
    every CPU of the step (measured on the local Slurm with ``CpuBind=cores``: one CPU each
    without it). Each node's console goes to its own file. ``extra`` comes last: it wins.
    """
    n = len(nodes)
    return [
        srun,
        f"--jobid={job_id}",
        f"--nodes={n}",
        f"--ntasks={n}",
        "--ntasks-per-node=1",
        f"--nodelist={','.join(nodes)}",
        f"--job-name={step_name}",
        "--kill-on-bad-exit=1",
        # the node's launcher and every rank it starts share whatever the task is bound to: no
        # binding, so a site's default (CpuBind=cores) cannot pin them all to one core
        "--cpu-bind=none",
        f"--output={console_dir / node_console_log_name('%n')}",
        *extra,
        "bash",
        "-c",
        NODE_SHIM,
        "nvrx-node",
        *node_argv,
    ]


def node_launcher_argv(launcher_argv: Sequence[str], endpoint: str) -> list[str]:
    """The launcher argv for every node: the chosen endpoint, and who hosts the rendezvous."""
    out = [
        f"--rdzv-endpoint={endpoint}" if arg.startswith("--rdzv-endpoint=") else arg
        for arg in launcher_argv
    ]
    return [*out, rdzv_host_option(IS_HOST_PLACEHOLDER)]


def step_name(run_id: str) -> str:
    return f"nvrx-{run_id}"[:128]


class SlurmLaunch:
    """The Slurm side of one launch: its allocation, its endpoint, its srun step, its release.

    :meth:`prepare` finds or makes the allocation and picks the rendezvous endpoint;
    :meth:`release` (every exit path, also after a failed prepare) cancels the step if it still
    runs and the allocation if it was made here.
    """

    def __init__(self, recipe: Recipe, environ: Mapping[str, str]) -> None:
        self.recipe = recipe
        self.environ = environ
        self.srun = shutil.which("srun", path=environ.get("PATH"))
        self.job_id: str | None = None
        #: made here with salloc: cancelled at release
        self.owned = False
        self.nodes: tuple[str, ...] = ()
        self.addresses: tuple[str, ...] = ()
        self.endpoint = ""
        self.step_name = step_name(recipe.config.run_id)
        self.argv: list[str] = []
        self.env: dict[str, str] = {}
        self.released = False

    # -- prepare

    def prepare(self) -> None:
        config = self.recipe.config
        if self.srun is None or shutil.which("salloc") is None:
            raise SlurmError(
                "launcher slurm: srun/salloc not found on PATH; run where Slurm's clients are "
                "installed (scripts/slurm_local.sh up starts a local cluster), or use "
                "--launcher local"
            )
        try:
            # only this process writes the run dir's top level on a Slurm launch: a used one
            # is refused as on one node
            check_fresh_run_dir(self.recipe.layout)
        except ConfigError as exc:
            raise SlurmError(str(exc)) from None
        if self.environ.get("SLURM_JOB_ID"):
            self.job_id = self.environ["SLURM_JOB_ID"]
            nodelist = self.environ.get("SLURM_JOB_NODELIST", "")
            if not nodelist:
                nodelist = _slurm(["squeue", "-h", "-j", self.job_id, "-o", "%N"]).strip()
        else:
            self.job_id = self._salloc(config.nnodes)
            self.owned = True
            nodelist = _slurm(["squeue", "-h", "-j", self.job_id, "-o", "%N"]).strip()
        hosts = _slurm(["scontrol", "show", "hostnames", nodelist]).split()
        if len(hosts) < config.nnodes:
            raise SlurmError(
                f"allocation {self.job_id} has {len(hosts)} node(s) ({nodelist}) but the run "
                f"needs {config.nnodes} (NNODES); allocate {config.nnodes} nodes "
                f"(sbatch/salloc --nodes={config.nnodes}) or lower --nnodes"
            )
        self.nodes = tuple(hosts[: config.nnodes])
        self.addresses = tuple(self._node_addr(node) for node in self.nodes)
        if config.rdzv_endpoint == DEFAULT_RDZV_ENDPOINT:
            self.endpoint = f"{self.addresses[0]}:{self._free_port_on(self.nodes[0])}"
        else:
            self.endpoint = config.rdzv_endpoint
        self.recipe = dataclasses.replace(
            self.recipe,
            config=dataclasses.replace(config, rdzv_endpoint=self.endpoint),
            launcher_argv=tuple(node_launcher_argv(self.recipe.launcher_argv, self.endpoint)),
        )
        self.env = {RDZV_NODE_VAR: self.nodes[0]}
        if shared_hosts(self.addresses):
            self.env[MULTI_LAUNCHERS_VAR] = "1"
        self.argv = srun_argv(
            srun=self.srun,
            job_id=self.job_id,
            nodes=self.nodes,
            step_name=self.step_name,
            console_dir=self.recipe.layout.logs,
            node_argv=self.recipe.argv,
            extra=shlex.split(self.environ.get(SRUN_ARGS_VAR, "")),
        )

    def _salloc(self, nnodes: int) -> str:
        config = self.recipe.config
        # a request for more nodes than the cluster has would pend for ever
        known = set(_slurm(["sinfo", "-h", "-N", "-o", "%N"]).split())
        if len(known) < nnodes:
            raise SlurmError(
                f"the cluster has {len(known)} node(s), the run needs {config.nnodes} (NNODES): "
                f"lower --nnodes"
            )
        argv = [
            "salloc",
            "--no-shell",
            # give up (and withdraw the request) when the nodes do not come in time
            f"--immediate={int(SALLOC_TIMEOUT_S)}",
            f"--nodes={nnodes}",
            "--ntasks-per-node=1",
            "--exclusive",
            f"--job-name={self.step_name}",
        ]
        if config.workload == "megatron":
            argv.append(f"--gpus-per-node={config.gpus_per_node}")
        argv += shlex.split(self.environ.get(SALLOC_ARGS_VAR, ""))
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            _, err = proc.communicate(timeout=SALLOC_TIMEOUT_S + 30)
        except subprocess.TimeoutExpired:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=10)
            raise SlurmError(
                f"{shlex.join(argv)}: no allocation after {SALLOC_TIMEOUT_S + 30:.0f} s"
            ) from None
        except BaseException:
            # a pending salloc revokes its request when stopped; a granted one is cancelled
            # by release() once its job ID is known
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                _, err = proc.communicate(timeout=10)
                self.job_id = parse_job_id(err or "")
                self.owned = self.job_id is not None
            raise
        job_id = parse_job_id(err)
        if proc.returncode != 0 or job_id is None:
            raise SlurmError(
                f"{shlex.join(argv)} exited with {proc.returncode}: {err.strip()[-2000:]}"
            )
        return job_id

    def _node_addr(self, node: str) -> str:
        line = _slurm(["scontrol", "-o", "show", "node", node])
        return parse_node_addr(line) or node

    def _free_port_on(self, node: str) -> int:
        """A port free right now on ``node`` (asked there: the controller may be elsewhere)."""
        assert self.srun is not None and self.job_id is not None
        code = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"
        out = _slurm(
            [
                self.srun,
                f"--jobid={self.job_id}",
                "--nodes=1",
                "--ntasks=1",
                f"--nodelist={node}",
                "--overlap",
                "--quiet",
                f"--job-name={self.step_name}-port",
                sys.executable,
                "-c",
                code,
            ]
        )
        try:
            return int(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise SlurmError(f"no free port from node {node}: {out[-200:]!r}") from None

    def describe(self) -> dict[str, Any]:
        """For run.json: where and how the nodes' launchers ran."""
        return {
            "job_id": self.job_id,
            "allocated_here": self.owned,
            "step_name": self.step_name,
            "nodes": list(self.nodes),
            "node_addresses": list(self.addresses),
            "rdzv_node": self.nodes[0] if self.nodes else None,
            "rdzv_endpoint": self.endpoint,
            "nodes_share_a_host": shared_hosts(self.addresses),
            "env": dict(self.env),
            "srun_argv": list(self.argv),
        }

    # -- release

    def release(self) -> None:
        """Cancel what is left of the step, and the allocation if it was made here. Never
        raises: it runs on every exit path."""
        if self.released or self.job_id is None:
            return
        self.released = True
        with contextlib.suppress(SlurmError):
            if self.owned:
                _slurm(["scancel", self.job_id])
            else:
                steps = _slurm(["squeue", "-h", "-s", "-j", self.job_id, "-o", "%i %j"])
                ours = [
                    line.split()[0]
                    for line in steps.splitlines()
                    if line.split()[1:2] in ([self.step_name], [f"{self.step_name}-port"])
                ]
                if ours:
                    _slurm(["scancel", *ours])


def slurm_preview(recipe: Recipe) -> str:
    """What a dry run shows for a Slurm launch: the srun step with the values chosen at launch
    (job, nodes, endpoint) as placeholders."""
    endpoint = (
        "<first node>:<free port>"
        if recipe.config.rdzv_endpoint == DEFAULT_RDZV_ENDPOINT
        else recipe.config.rdzv_endpoint
    )
    argv = srun_argv(
        srun="srun",
        job_id="<job>",
        nodes=[f"<node {i}>" for i in range(recipe.config.nnodes)],
        step_name=step_name(recipe.config.run_id),
        console_dir=recipe.layout.logs,
        node_argv=[*node_launcher_argv(recipe.launcher_argv, endpoint), *recipe.workload_argv],
    )
    env = [f"{k}={shlex.quote(v)}" for k, v in sorted(recipe.env.items())]
    return " ".join([*env, f"{RDZV_NODE_VAR}='<node 0>'", shlex.join(argv)])


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
        #: the launcher's TMPDIR, made fresh by start() (recipe.make_run_tmpdir)
        self.tmpdir: Path | None = None
        #: how the launch ended, once result.json is written
        self.result: RunResult | None = None
        self._stack = stack
        self._popen: subprocess.Popen[bytes] | None = None
        self._console_fh: IO[bytes] | None = None
        self._t0 = 0.0
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
            self._t0 = time.monotonic()
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
            wall_s=time.monotonic() - self._t0,
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
        return self._progress.read(time.monotonic() - self._t0)

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
