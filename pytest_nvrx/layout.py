"""Names of the artifacts in a run directory (the NVRx GPT walkthrough's layout).

A run directory is ``<work>/runs/<run-id>/``. Every stage (recipe, injector, evidence, criteria)
agrees on these names through this module; only the injector, which must stay stdlib-only and
importable as a plain script, repeats the few it needs.
"""

from __future__ import annotations

import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args, overload

MARKER_NAME = "fault_injected.json"
#: The one list of faults (a run's ``fault``; ``none`` = a baseline). kill = SIGKILL,
#: hang = SIGSTOP, term = SIGTERM, segv = SIGSEGV to the rank; exception = an InjectedFault
#: raised on the rank's training thread; ckpt-worker = SIGKILL to the rank's persistent async
#: checkpoint worker while a save is in flight. pytest_nvrx.worker.injector, stdlib-only by design,
#: repeats it as FAULTS (tests/launch/test_fault_catalogue.py holds them equal).
FaultKind = Literal["none", "kill", "hang", "term", "segv", "exception", "ckpt-worker"]
#: The faults the injector can deliver (and a marker can record).
INJECTED_FAULTS: tuple[str, ...] = tuple(f for f in get_args(FaultKind) if f != "none")
#: Where in the training loop the selected rank is faulted (pytest_nvrx.worker.injector.WINDOWS,
#: tests/worker/test_tracker_readers_agree.py holds them equal): step = a training step after a
#: checkpoint completed; save = the preparation of checkpoint N; finalize = save N submitted,
#: its background write in flight, not yet finalized.
FaultWindow = Literal["step", "save", "finalize"]
FAULT_WINDOWS: tuple[str, ...] = get_args(FaultWindow)
#: Windows only a fault schedule's second or later fault can have (pytest_nvrx.worker.injector's
#: SCHEDULE_WINDOWS): restore = in a replacement while it loads its checkpoint, before its first
#: iteration after the load.
SCHEDULE_WINDOWS = ("restore",)
#: Faults that exist only in some windows (as pytest_nvrx.worker.injector.FAULT_WINDOWS_ONLY): the
#: persistent checkpoint worker is busy only while a save is in flight.
FAULT_WINDOWS_ONLY: dict[str, tuple[str, ...]] = {"ckpt-worker": ("finalize",)}
#: The signal each fault sends, as its marker records it (as
#: pytest_nvrx.worker.injector.FAULT_SIGNALS; tests/criteria/test_marker_agreement.py holds them
#: equal); ``exception`` sends none (null).
FAULT_SIGNAL_NAMES: dict[str, str | None] = {
    "kill": "SIGKILL",
    "hang": "SIGSTOP",
    "term": "SIGTERM",
    "segv": "SIGSEGV",
    "exception": None,
    "ckpt-worker": "SIGKILL",
}
#: Faults after which the rank itself runs on until it dies (it exits, or its monitor times it
#: out): an uncaught exception unwinds the training thread, a killed checkpoint worker leaves the
#: rank waiting on it. A save the rank finalizes in between is a completed checkpoint, so the
#: restore point is the newest one finalized before the rank's death, not before the fault.
RANK_OUTLIVES_FAULT: tuple[str, ...] = ("exception", "ckpt-worker")
#: A work dir's folder of run dirs: <work dir>/runs/<run ID>.
RUNS_DIR = "runs"
MANIFEST_NAME = "run.json"
#: A run dir's claim (pytest_nvrx.launch.run_dir_setup.claim_file); on several nodes each node's
#: own, ``run.node<N>.claim`` or ``run.<host>.claim`` (:func:`is_run_claim_name`).
RUN_CLAIM_NAME = "run.claim"
#: run.json's ``schema``: raised when a change means other things by its keys; a verifier
#: refuses a run.json of another schema (pytest_nvrx.evidence.manifest)
MANIFEST_SCHEMA = 1
# written by pytest_nvrx.launch.launcher next to run.json when the launcher exits
RESULT_NAME = "result.json"
#: A planted self-test run's records of what its plant did (pytest_nvrx/plant_hook), one per act.
PLANT_RECORDS_DIR = "plant-records"
CYCLE_INFOS_DIR = "cycle_infos"
LOGS_DIR = "logs"
CHECKPOINTS_DIR = "checkpoints"
TRACKER_NAME = "latest_checkpointed_iteration.txt"
FT_STATE_NAME = "ft_state.json"
LAUNCHER_LOG_NAME = "launcher.log"
# ft_launcher's --ft-per-cycle-applog-prefix: cycle N writes logs/train_cycle<N>.log
APPLOG_PREFIX_NAME = "train.log"
#: Parent of the per-run TMPDIRs (short on purpose, see RunLayout.tmp).
TMP_ROOT = Path("/tmp")


def windows_of(fault: str) -> tuple[str, ...]:
    """The windows ``fault`` can be injected in, in FAULT_WINDOWS order; none for ``none`` (a
    baseline injects nothing) or an unknown fault."""
    if fault not in INJECTED_FAULTS:
        return ()
    return FAULT_WINDOWS_ONLY.get(fault, FAULT_WINDOWS)


def window_allowed(fault: str, window: str) -> bool:
    """Whether the injector accepts ``--fault fault --window window``."""
    return window in windows_of(fault)


def marker_name(position: int) -> str:
    """The marker of a schedule's fault at ``position`` (1-based): the first keeps the
    walkthrough's ``fault_injected.json``, the k-th is ``fault_injected_<k>.json``
    (pytest_nvrx.worker.injector.scheduled_marker_path; tests/settings/test_schedule.py holds them
    equal)."""
    if position < 1:
        raise ValueError(f"schedule positions start at 1, got {position}")
    if position == 1:
        return MARKER_NAME
    stem, dot, suffix = MARKER_NAME.rpartition(".")
    return f"{stem}_{position}{dot}{suffix}"


#: what a later fault's marker is named like (ASCII digits; :func:`marker_name` spells it)
LATER_MARKER_PATTERN = re.compile(r"fault_injected_(?P<k>[0-9]+)\.json")


def node_console_log_name(node: int | str) -> str:
    """Console (stdout and stderr) of one node's ft_launcher in a Slurm launch, by the node's
    index in the step (``srun --output`` writes ``%n`` as that index), or in a launch started
    by hand with ``run --node-index``. The launchers' logs and
    the cycle logs need no per-node names: NVRx's gRPC log server, on the rendezvous host, is
    their only writer and interleaves every node's lines (tagged ``infra:<node rank>``)."""
    return f"launcher.console.node{node}.log"


def node_file_name(name: str, node: int) -> str:
    """A run-dir file of one node that is not the rendezvous host, when nodes are started by
    hand (``run --node-index``): ``run.json`` -> ``run.node1.json``. Node 0 keeps the plain
    names (its ``result.json`` is the run's: its launcher hosted the rendezvous)."""
    stem, dot, suffix = name.partition(".")
    return f"{stem}.node{node}{dot}{suffix}"


def cycle_log_name(cycle: int) -> str:
    """Name ft_launcher gives the application log of one cycle for our applog prefix."""
    return f"train_cycle{cycle}.log"


_APPLOG_STEM, _APPLOG_EXT = APPLOG_PREFIX_NAME.rsplit(".", 1)
#: ft_launcher names cycle N's log <prefix-stem>_cycle<N>.<ext> (cycle_log_name)
CYCLE_LOG_NAMES = f"{_APPLOG_STEM}_cycle<N>.{_APPLOG_EXT}"
# ASCII digits only: re's \d (and int()) also take other scripts' digits, so that
# train_cycle\u0661.log would be read as cycle 1's log
CYCLE_LOG_PATTERN = re.compile(
    re.escape(_APPLOG_STEM) + r"_cycle(?P<n>[0-9]+)\." + re.escape(_APPLOG_EXT)
)
#: what looks like a cycle log to a reader (any letters or digits of any script after
#: ``_cycle``): a name that matches this but not CYCLE_LOG_PATTERN is reported, never read
CYCLE_LOG_LOOK_ALIKE = re.compile(re.escape(_APPLOG_STEM) + r"_cycle\w+\." + re.escape(_APPLOG_EXT))


class _PathIn:
    """A path of a run's layout, read as a :class:`Path`: the layout's directory ``under`` (the
    attribute that holds it) joined with ``name``."""

    __slots__ = ("name", "under")

    def __init__(self, under: Literal["run_dir", "checkpoint_dir", "logs"], name: str) -> None:
        self.under = under
        self.name = name

    @overload
    def __get__(self, layout: None, owner: type) -> _PathIn: ...
    @overload
    def __get__(self, layout: RunLayout, owner: type) -> Path: ...
    def __get__(self, layout: RunLayout | None, owner: type) -> Path | _PathIn:
        if layout is None:
            return self
        under: Path = getattr(layout, self.under)
        return under / self.name


@dataclass(frozen=True)
class RunLayout:
    """Absolute paths of one run's artifacts."""

    run_dir: Path
    checkpoint_dir: Path

    @classmethod
    def for_run(cls, run_dir: Path, checkpoint_dir: Path | None = None) -> RunLayout:
        return cls(
            run_dir, checkpoint_dir if checkpoint_dir is not None else run_dir / CHECKPOINTS_DIR
        )

    marker = _PathIn("run_dir", MARKER_NAME)
    manifest = _PathIn("run_dir", MANIFEST_NAME)
    cycle_infos = _PathIn("run_dir", CYCLE_INFOS_DIR)
    logs = _PathIn("run_dir", LOGS_DIR)
    launcher_log = _PathIn("logs", LAUNCHER_LOG_NAME)
    applog_prefix = _PathIn("logs", APPLOG_PREFIX_NAME)
    tracker = _PathIn("checkpoint_dir", TRACKER_NAME)
    ft_state = _PathIn("checkpoint_dir", FT_STATE_NAME)

    def marker_at(self, position: int) -> Path:
        """The marker of a fault schedule's fault at ``position`` (1: :attr:`marker`)."""
        return self.run_dir / marker_name(position)

    def cycle_log(self, cycle: int) -> Path:
        return self.logs / cycle_log_name(cycle)

    def cycle_log_paths(self) -> dict[int, Path]:
        """The cycle logs on disk by cycle number, in numeric order (cycle 10 after cycle 9);
        none where the logs directory cannot be read. Where several names parse to one cycle
        (``train_cycle1.log``, ``train_cycle01.log``) the launcher's own name wins, else the
        first by name: the same file whatever order the directory lists them in. (Launch
        progress and log tails read this; the evidence reads :meth:`cycle_log_candidates` and
        lets the launcher's cycle record decide.)"""
        return {
            cycle: next((p for p in paths if p.name == cycle_log_name(cycle)), paths[0])
            for cycle, paths in self.cycle_log_candidates().items()
        }

    def cycle_log_candidates(self) -> dict[int, tuple[Path, ...]]:
        """Every file named like a cycle log (ASCII digits), by the cycle its name parses to, in
        numeric order; each cycle's files sorted by name."""
        found: dict[int, list[Path]] = {}
        try:
            with os.scandir(self.logs) as entries:
                for entry in entries:
                    m = CYCLE_LOG_PATTERN.fullmatch(entry.name)
                    if m is not None:
                        found.setdefault(int(m["n"]), []).append(Path(entry.path))
        except OSError:
            return {}
        return {cycle: tuple(sorted(found[cycle])) for cycle in sorted(found)}

    @property
    def tmp(self) -> Path:
        """Per-run TMPDIR: ft_launcher puts its Unix sockets and torchelastic files there.

        Not inside the run dir: a socket path must fit in 108 bytes, and ft_launcher appends
        ~40 bytes (``_ft_launcher<pid>_rmon<rank>.socket``) to TMPDIR. With a long work dir the
        launcher cannot bind its sockets and stalls (seen with pytest's tmp paths). This name
        is only the recipe's stand-in (what a dry run prints): each launch makes a fresh one
        with ``mkdtemp`` (``run_dir.make_run_tmpdir``), never reusing a guessable path.
        """
        return TMP_ROOT / f"nvrx-{zlib.crc32(str(self.run_dir).encode()):08x}"


#: The recovery's phases, in order (the recovery clock's, pytest_nvrx.evidence.timeline.PHASES,
#: defines each; --nvrx-max-phase names them): here so that settings need not import evidence.
PHASE_IDS: tuple[str, ...] = (
    "detection",
    "termination",
    "gpu_reclaim",
    "rendezvous",
    "worker_start",
    "checkpoint_load",
    "first_step",
)


#: a launch's console (the launcher's stdout and stderr), in the run dir's logs/
CONSOLE_LOG_NAME = "launcher.console.log"


def is_run_claim_name(name: str) -> bool:
    """Whether a file of a directory is a run dir's claim (any node's)."""
    return name.startswith("run.") and name.endswith(".claim")


def iteration_dir_name(iteration: int) -> str:
    """Megatron's name for one iteration's checkpoint directory (the reference workload's too)."""
    return f"iter_{iteration:07d}"


def iteration_of_dir_name(name: str) -> int | None:
    """The iteration a checkpoint directory's name is :func:`iteration_dir_name` of, else None
    (``iter_5``, ``iter_+000005`` or ``iter_0000005.tmp`` are not Megatron's names)."""
    digits = name.removeprefix("iter_")
    if digits == name or not (digits.isascii() and digits.isdigit()):
        return None
    iteration = int(digits)
    return iteration if iteration_dir_name(iteration) == name else None
