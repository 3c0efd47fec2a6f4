"""Gather every artifact of a run directory into one typed :class:`RunEvidence`.

The only entry point the criteria, ``verify`` and the plugin need: :func:`load_run`. Nothing
here judges; it reads, normalizes times to UTC and records what is missing or broken as
:class:`~pytest_nvrx.evidence.refs.Problem` (fatal ones mean the run cannot be judged).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import UTC, timezone, tzinfo
from pathlib import Path
from typing import Any

from pytest_nvrx.evidence.checkpoint import (
    DCP_METADATA,
    CheckpointMetadata,
    list_checkpoint_iterations,
    read_checkpoint_metadata,
)
from pytest_nvrx.evidence.cycle_infos import CycleInfo, CycleInfos, read_cycle_infos
from pytest_nvrx.evidence.cycle_log import CycleLog, parse_cycle_log
from pytest_nvrx.evidence.launcher_log import LauncherLog, parse_launcher_log
from pytest_nvrx.evidence.manifest import RESULT_VALUES, Manifest, ManifestError, read_manifest
from pytest_nvrx.evidence.marker import Marker, read_marker
from pytest_nvrx.evidence.megatron import MEGATRON
from pytest_nvrx.evidence.refs import (
    MAX_DIGITS,
    EvidenceRef,
    Problem,
    absent,
    display_path,
    file_refusal,
    says_disk_full,
)
from pytest_nvrx.evidence.tracker import Tracker, read_tracker
from pytest_nvrx.evidence.workload import (
    LoadCompleted,
    LoadStarted,
    VersionReported,
    WorkloadError,
    WorkloadLogAdapter,
    get_adapter,
)
from pytest_nvrx.layout import (
    CYCLE_LOG_LOOK_ALIKE,
    CYCLE_LOG_NAMES,
    CYCLE_LOG_PATTERN,
    LATER_MARKER_PATTERN,
    RESULT_NAME,
    RunLayout,
    marker_name,
    node_file_name,
)
from pytest_nvrx.settings.values import quote


class RunDirError(ValueError):
    """The path is not something that can be judged at all (missing, not a directory)."""


@dataclass(frozen=True, slots=True)
class RunEvidence:
    """Everything a run directory shows, parsed; pure data for the criteria."""

    run_dir: Path
    checkpoint_dir: Path
    workload: str
    manifest: Manifest | None
    marker: Marker | None  # None: no marker file; Marker.error set: unusable marker
    launcher: LauncherLog
    cycle_infos: CycleInfos
    cycle_logs: tuple[CycleLog, ...]  # by cycle number
    tracker: Tracker
    # of the iterations the logs say were loaded, and of the marker's in-flight iteration
    checkpoints: tuple[CheckpointMetadata, ...]
    problems: tuple[Problem, ...]
    # a fault schedule's later markers (issue #26), by position (2, 3, ...): each file named
    # fault_injected_<k>.json in the run dir; ``marker`` is position 1's
    later_markers: tuple[tuple[int, Marker], ...] = ()
    # the iterations of the checkpoint directories (iter_N/) on disk, sorted; None: not listed
    # (checkpoints not read, the directory absent, refused or unreadable)
    checkpoint_dirs: tuple[int, ...] | None = None

    def marker_at(self, position: int) -> Marker | None:
        """The marker of a schedule's ``position``-th fault (1: :attr:`marker`)."""
        if position == 1:
            return self.marker
        return next((m for k, m in self.later_markers if k == position), None)

    @property
    def fatal_problems(self) -> tuple[Problem, ...]:
        return tuple(p for p in self.problems if p.severity == "fatal")

    @property
    def cycles(self) -> tuple[CycleInfo, ...]:
        return self.cycle_infos.records

    def cycle_log(self, cycle: int) -> CycleLog | None:
        for log in self.cycle_logs:
            if log.cycle == cycle:
                return log
        return None

    def checkpoint(self, iteration: int) -> CheckpointMetadata | None:
        for meta in self.checkpoints:
            if meta.iteration == iteration:
                return meta
        return None

    def stack(self) -> dict[str, Any]:
        """Component versions: run.json's ``stack`` when recorded, else what the logs printed."""
        if self.manifest is not None and self.manifest.stack:
            return dict(self.manifest.stack)
        found: dict[str, Any] = {}
        for log in self.cycle_logs:
            for event in log.events:
                if isinstance(event, VersionReported):
                    found.setdefault(event.component, event.version)
        if found:
            found["source"] = "application logs"
        return found


#: What launch.RunResult.as_dict and the watchdog write in every result.json (launcher_pid and
#: gpu_shared_with came later or are optional: runs recorded before them lack them)
RESULT_KEYS = ("exit_code", "wall_s", "timed_out", "interrupted", "start_time", "end_time")


def _result_missing(
    layout: RunLayout, run_dir: Path, manifest: Manifest | None, node_index: int | None
) -> list[Problem]:
    """A run our harness launched (its run.json is there) and no result.json, or a result.json
    without what it records: the harness writes it at every end of the launch, its watchdog when
    the harness dies first; without it nothing says how the launch ended (its exit code, our
    deadline, a stop signal), or that it ended at all (both SIGKILLed, the launcher ran on
    unwatched; or the launch is still running). The logs then cannot show a whole recovery:
    fatal. A run made by hand has neither file (the walkthrough's): its missing run.json claims
    nothing, and it is judged from its logs. The harness of node ``node_index`` > 0 of a run
    started node by node judges with its own record (``result.node1.json``): node 0's harness
    may not have written result.json yet."""
    if manifest is None:
        return []
    result = run_dir / RESULT_NAME
    if manifest.result_keys is not None and not (
        layout.manifest.exists() or layout.manifest.is_symlink()
    ):
        # result.json is written only by our harness and its watchdog, and the harness writes
        # run.json before it launches: a result.json without it is a launch whose statement of
        # what it was asked to do (config, argv, stack) is gone, not a run made by hand
        return [
            Problem(
                "fatal",
                f"{RESULT_NAME} says our harness launched this run, but there is no"
                f" {manifest.file}: the harness writes it before it launches, so what the run"
                " was asked to do (its config, launcher and workload arguments, stack) is"
                " unknown and nothing of it can be cross-checked",
                absent(manifest.file, f"absent beside {RESULT_NAME}"),
            )
        ]
    if manifest.result_keys is not None:
        lacking = [key for key in RESULT_KEYS if key not in manifest.result_keys]
        if not lacking:
            return _result_nulls(manifest) + _no_exit_code(manifest)
        return [
            Problem(
                "fatal",
                f"{RESULT_NAME} records no {', '.join(map(repr, lacking))}: the harness and its"
                f" watchdog write {', '.join(RESULT_KEYS)} in every {RESULT_NAME} (null where"
                " unknown), so this one is not their record of how the launch ended",
                absent(RESULT_NAME, f"no {lacking[0]!r} key"),
            )
        ]
    if result.exists() or result.is_symlink() or not layout.manifest.exists():
        return []  # there but unusable (read_manifest said why), or no run.json claims it
    if node_index and (run_dir / node_file_name(RESULT_NAME, node_index)).is_file():
        return []
    return [
        Problem(
            "fatal",
            f"{manifest.file} says our harness launched this run, but there is no {RESULT_NAME}:"
            " the harness writes it when the launch ends (its watchdog, when the harness dies"
            " first), so how the launch ended (its exit code, our deadline, a stop signal) is"
            " unknown, or it has not ended",
            absent(RESULT_NAME, "absent: the end of the launch was never recorded"),
        )
    ]


def _result_nulls(manifest: Manifest) -> list[Problem]:
    """result.json's values the harness (launch.RunResult) and its watchdog always know and
    write (manifest.RESULT_VALUES), null: ``timed_out`` (a bool), ``wall_s`` (the monotonic
    clock), ``start_time`` and ``end_time``. A null one is not their record, and it silences
    what reads it: whether our deadline stopped the launch, the clocks of result.json against
    run.json and the logs."""
    return [
        Problem(
            "fatal",
            f"{ref.location} records {key} as null: the harness and its watchdog always write"
            f" {', '.join(RESULT_VALUES)} (timed_out true or false), so this {RESULT_NAME} is"
            " not their record of how the launch ended",
            ref,
        )
        for key, ref in manifest.result_nulls
    ]


def _no_exit_code(manifest: Manifest) -> list[Problem]:
    """result.json's exit code is null though nothing stopped the launch: the harness records
    the launcher's exit code whenever it saw it end; only a stop (the watchdog's "harness
    killed", a signal, our deadline) leaves it unknown."""
    timed_out = manifest.timed_out is not None and manifest.timed_out.value is True
    if manifest.exit_code is not None or manifest.interrupted is not None or timed_out:
        return []
    return [
        Problem(
            "fatal",
            f"{RESULT_NAME} records no exit code (null), yet neither a stop signal nor our"
            " deadline ended the launch: the harness records the launcher's exit code whenever"
            " it saw it end, so how this launch ended is unknown",
            absent(RESULT_NAME, "exit_code null"),
        )
    ]


def _adapter_for(
    manifest: Manifest | None, adapter: WorkloadLogAdapter | None
) -> WorkloadLogAdapter:
    if adapter is not None:
        return adapter
    if manifest is not None and manifest.workload is not None:
        return get_adapter(str(manifest.workload.value))
    return MEGATRON


def load_run(
    run_dir: Path,
    checkpoint_dir: Path | None = None,
    *,
    adapter: WorkloadLogAdapter | None = None,
    read_checkpoints: bool = True,
    node_index: int | None = None,
) -> RunEvidence:
    """Read a run directory in the walkthrough's layout.

    ``checkpoint_dir`` defaults to ``<run_dir>/checkpoints``. ``adapter`` defaults to the one
    registered for run.json's ``workload`` (Megatron when there is no manifest). With
    ``read_checkpoints`` the metadata of each checkpoint the logs say was loaded is read, and of
    the save the marker says was in flight at the fault (whether a partial ``iter_N/`` is left).
    ``node_index``: the node of a run of several nodes started by hand whose harness is judging
    (its own end is recorded in its own result file, node 0's may not be written yet).
    Raises :class:`RunDirError` only when ``run_dir`` is not a directory; everything else
    missing or broken becomes a Problem.
    """
    run_dir = Path(run_dir)
    if not os.path.lexists(run_dir):
        raise RunDirError(f"run directory {run_dir} does not exist")
    why = file_refusal(run_dir, want_dir=True)
    if why is not None:
        raise RunDirError(f"run directory {run_dir} {why}")
    layout = RunLayout.for_run(
        run_dir, Path(checkpoint_dir) if checkpoint_dir is not None else None
    )
    problems: list[Problem] = []
    # Only a directory is a directory of evidence: a file (or FIFO, ...) in its place is no run,
    # and one that cannot be read (its permissions) hides what it holds.
    refused_dirs: set[Path] = set()
    own_dirs = [layout.cycle_infos, layout.logs]
    if checkpoint_dir is None:  # a checkpoint dir named apart from the run may lie anywhere
        own_dirs.append(layout.checkpoint_dir)
    for directory in (layout.checkpoint_dir, layout.cycle_infos, layout.logs):
        inside = run_dir if directory in own_dirs else None
        why = file_refusal(directory, inside, want_dir=True)
        if why is not None:
            problems.append(Problem("fatal", f"{display_path(directory, run_dir)} {why}"))
            refused_dirs.add(directory)
    if checkpoint_dir is not None and not os.path.lexists(layout.checkpoint_dir):
        problems.append(
            Problem("fatal", f"checkpoint directory {layout.checkpoint_dir} does not exist")
        )

    manifest: Manifest | None = None
    try:
        manifest = read_manifest(layout.manifest, run_dir)
    except ManifestError as exc:
        problems.append(
            Problem("fatal", f"{exc}: cannot tell what this run was asked to do or how it ended")
        )
    problems += _result_missing(layout, run_dir, manifest, node_index)
    if manifest is not None and manifest.interrupted is not None:
        signal = manifest.interrupted
        named = f" ({signal.value})" if isinstance(signal.value, str) else ""
        problems.append(
            Problem(
                "fatal",
                f"{signal.ref.location} says the run was interrupted{named}: it was stopped"
                " before it ended on its own, so its logs cannot show a whole recovery",
                signal.ref,
            )
        )
    try:
        workload_adapter = _adapter_for(manifest, adapter)
    except KeyError as exc:
        problems.append(Problem("fatal", str(exc.args[0])))
        workload_adapter = MEGATRON

    marker = read_marker(layout.marker, run_dir)
    if marker is not None and not marker.ok:
        problems.append(
            Problem("fatal", f"injection marker unusable: {marker.error}", marker.ref())
        )

    later_markers = _later_markers(layout, problems)

    launcher_file = display_path(layout.launcher_log, run_dir)
    refused = _refuse(layout.launcher_log, run_dir, launcher_file, problems)
    launcher = (
        LauncherLog(launcher_file, exists=True, read_error=refused)
        if refused is not None
        else parse_launcher_log(layout.launcher_log, file=launcher_file)
    )
    if not launcher.exists:
        problems.append(Problem("warning", f"{launcher.file} is missing"))
    elif launcher.read_error and refused is None:
        # it is there and could not be read (its permissions, EIO): what it says is unknown
        problems.append(Problem("fatal", f"{launcher.file} unreadable: {launcher.read_error}"))
    # Megatron's naive timestamps are in the same host zone as the launcher's.
    zone: tzinfo = timezone(launcher.utc_offset) if launcher.utc_offset is not None else UTC

    infos = read_cycle_infos(layout.cycle_infos, run_dir)
    problems.extend(infos.problems)
    if not infos.exists:
        problems.append(Problem("warning", f"{infos.dir}/ is missing: no launcher cycle records"))

    cycle_logs = _read_cycle_logs(layout, infos, workload_adapter, zone, problems)
    problems += _unread_numbers(launcher, cycle_logs)
    full = _disk_full(launcher, cycle_logs)
    if full is not None:
        # it explains what else is missing or cut short: it leads
        problems.insert(
            0,
            Problem(
                "fatal",
                f"{full.location} says {says_disk_full(full.text)}: a write of the run failed"
                " for a full disk or quota, so its logs, records and checkpoints may be cut"
                " short and it cannot be judged; free space where it writes and run it again",
                full,
            ),
        )

    if not (launcher.exists or cycle_logs or infos.records or marker is not None):
        problems.append(
            Problem(
                "fatal",
                f"{run_dir} is not a run directory: no"
                f" {display_path(layout.launcher_log, run_dir)},"
                f" no {display_path(layout.logs, run_dir)}/{CYCLE_LOG_NAMES},"
                f" no {infos.dir}/ records, no injection marker",
            )
        )

    tracker = read_tracker(layout.tracker, run_dir)
    if tracker.refused:
        problems.append(
            Problem("fatal", f"checkpoint tracker {tracker.file} {tracker.error}", tracker.ref)
        )
    elif tracker.error:
        problems.append(Problem("warning", f"tracker {tracker.file}: {tracker.error}", tracker.ref))

    checkpoints: list[CheckpointMetadata] = []
    listed: tuple[int, ...] | None = None
    if read_checkpoints and layout.checkpoint_dir not in refused_dirs:
        listed = list_checkpoint_iterations(layout.checkpoint_dir)
        loaded = sorted(
            {
                e.iteration
                for log in cycle_logs
                for e in log.events
                if isinstance(e, LoadCompleted | LoadStarted) and e.iteration > 0
            }
            | _in_flight(marker)
            | ({tracker.iteration} if tracker.iteration else set())
        )
        for iteration in loaded:
            path = workload_adapter.checkpoint_path(layout.checkpoint_dir, iteration)
            meta = read_checkpoint_metadata(path, iteration, run_dir)
            if meta.not_evidence is not None:
                problems.append(Problem("fatal", f"checkpoint {meta.not_evidence}", meta.ref))
            checkpoints.append(meta)
        problems += _foreign_model_keys(checkpoints, listed, layout, workload_adapter, run_dir)

    return RunEvidence(
        run_dir=run_dir,
        checkpoint_dir=layout.checkpoint_dir,
        workload=workload_adapter.name,
        manifest=manifest,
        marker=marker,
        launcher=launcher,
        cycle_infos=infos,
        cycle_logs=cycle_logs,
        tracker=tracker,
        checkpoints=tuple(checkpoints),
        problems=tuple(problems),
        later_markers=later_markers,
        checkpoint_dirs=listed,
    )


def _unread_numbers(launcher: LauncherLog, logs: tuple[CycleLog, ...]) -> list[Problem]:
    """A line of evidence the parsers left out for a number past MAX_DIGITS or in foreign
    digits (refs.read_int, refs.UnreadableNumber)."""
    refs = [launcher.bad_number, *(log.bad_number for log in logs)]
    return [
        Problem(
            "fatal",
            f"{ref.location} holds a number of more than {MAX_DIGITS} digits, or in digits other"
            " than ASCII 0-9, which no count of a run has: the line cannot be read, so the run"
            " cannot be judged by it",
            ref,
        )
        for ref in refs
        if ref is not None
    ]


def _disk_full(launcher: LauncherLog, logs: tuple[CycleLog, ...]) -> EvidenceRef | None:
    """The first line that says a write failed for a full disk or quota: the launcher's, else
    a worker's error."""
    if launcher.disk_full is not None:
        return launcher.disk_full
    for log in logs:
        for error in log.of_type(WorkloadError):
            if says_disk_full(error.ref.text) is not None:
                return error.ref
    return None


def _later_markers(layout: RunLayout, problems: list[Problem]) -> tuple[tuple[int, Marker], ...]:
    """Every ``fault_injected_<k>.json`` (k >= 2) in the run dir, by position; an unusable one is
    a fatal problem, as the first marker's is."""
    found: list[tuple[int, Marker]] = []
    try:
        names = sorted(os.listdir(layout.run_dir))
    except OSError:
        return ()
    for name in names:
        m = LATER_MARKER_PATTERN.fullmatch(name)
        if m is None or int(m["k"]) < 2 or name != marker_name(int(m["k"])):
            continue
        marker = read_marker(layout.run_dir / name, layout.run_dir)
        if marker is None:
            continue
        if not marker.ok:
            problems.append(
                Problem("fatal", f"injection marker unusable: {marker.error}", marker.ref())
            )
        found.append((int(m["k"]), marker))
    return tuple(sorted(found, key=lambda pair: pair[0]))


def _in_flight(marker: Marker | None) -> set[int]:
    """The save a usable marker says was in flight at the fault (none for a schema-1 marker)."""
    if marker is None or not marker.ok or not marker.in_flight_iteration:
        return set()
    return {marker.in_flight_iteration}


def _read_cycle_logs(
    layout: RunLayout,
    infos: CycleInfos,
    adapter: WorkloadLogAdapter,
    zone: tzinfo,
    problems: list[Problem],
) -> tuple[CycleLog, ...]:
    """One CycleLog per cycle known from records or from log files on disk."""
    run_dir = layout.run_dir
    paths = _cycle_log_paths(layout, infos, problems)
    logs: list[CycleLog] = []
    for cycle in sorted(paths):
        path = paths[cycle]
        file = display_path(path, run_dir)
        refused = _refuse(path, run_dir, file, problems)
        if refused is not None:
            logs.append(CycleLog(cycle, file, exists=True, read_error=refused))
            continue
        log = parse_cycle_log(path, cycle, adapter, file=file, tz=zone)
        if not log.exists:
            problems.append(
                Problem("warning", f"{log.file} is missing (cycle {cycle} is in {infos.dir}/)")
            )
        elif log.read_error:  # there, and not read: what it says is unknown
            problems.append(Problem("fatal", f"{log.file} unreadable: {log.read_error}"))
        logs.append(log)
    return tuple(logs)


# a name that parses to a cycle with any script's digits (train_cycle\u0661.log: cycle 1)
_ANY_DIGITS = re.compile(r"_cycle(?P<n>\d+)\.")


def _cycle_log_paths(
    layout: RunLayout, infos: CycleInfos, problems: list[Problem]
) -> dict[int, Path]:
    """Which file is each cycle's log. The cycle's record names it (the launcher that wrote the
    log wrote the record): that file is read, and any other file that looks like the same
    cycle's log is reported, not read. Without a record, the one file named for the cycle;
    two such files, or a recorded log that is absent while a look-alike exists, are a fatal
    problem: nothing says which file is the evidence."""
    run_dir = layout.run_dir
    candidates = {c: list(files) for c, files in layout.cycle_log_candidates().items()}
    for cycle in [c for c in candidates if c >= 10**MAX_DIGITS]:
        # (a name holds at most 255 bytes: its number is cheap to read, but no cycle's)
        for path in candidates.pop(cycle):
            name = display_path(path, run_dir)
            problems.append(
                Problem(
                    "fatal",
                    f"{name} is named for a cycle of {len(str(cycle))} digits, which no cycle of"
                    " a run has: which cycle's log it is cannot be told",
                    EvidenceRef(name, None, "(a name no cycle has)"),
                )
            )
    strays = _look_alikes(layout)
    records: dict[int, CycleInfo] = {}
    for info in infos.records:
        if info.log_name is not None:
            records.setdefault(info.cycle, info)
    named = {info.log_name for info in records.values()}
    for stray in strays:
        if stray.name not in named:
            problems.append(
                Problem(
                    "warning",
                    f"{display_path(stray, run_dir)} looks like a cycle log but is not named"
                    f" {CYCLE_LOG_NAMES} with ASCII digits: not read",
                )
            )
    paths: dict[int, Path] = {}
    for cycle in sorted({*candidates, *(r.cycle for r in infos.records)}):
        files = candidates.get(cycle, [])
        alike = files + [s for s in strays if _cycle_of(s.name) == cycle and s.name not in named]
        record = records.get(cycle)
        if record is None or record.log_name is None:
            if len(files) > 1:
                shown = [display_path(f, run_dir) for f in files]
                problems.append(
                    Problem(
                        "fatal",
                        f"{' and '.join(shown)} {'both' if len(files) == 2 else 'all'} look like"
                        f" cycle {cycle}'s log and no cycle record names"
                        f" {'either' if len(files) == 2 else 'any'}: cannot tell which file is"
                        f" cycle {cycle}'s log",
                        EvidenceRef(shown[-1], None, "(a second log of one cycle)"),
                    )
                )
            paths[cycle] = files[0] if files else layout.cycle_log(cycle)
            continue
        # the record names the log by an absolute path on the run host: its name is used
        name = record.log_name
        path = layout.logs / name
        record_file = record.ref.file
        owner = _cycle_of(name)
        if owner is not None and owner != cycle:
            problems.append(
                Problem(
                    "fatal",
                    f"{record_file} names {name} as cycle {cycle}'s log: the name of cycle"
                    f" {owner}'s log; cannot tell which file is cycle {cycle}'s log",
                    record.log_ref or record.ref,
                )
            )
        others = [f for f in alike if f.name != name]
        if others and not (path.exists() or path.is_symlink()):
            problems.append(
                Problem(
                    "fatal",
                    f"{record_file} names {name} as cycle {cycle}'s log, which is absent, while"
                    f" {', '.join(display_path(f, run_dir) for f in others)} looks like it:"
                    f" cannot tell which file is cycle {cycle}'s log",
                    record.log_ref or record.ref,
                )
            )
        else:
            problems.extend(
                Problem(
                    "warning",
                    f"{display_path(other, run_dir)} looks like cycle {cycle}'s log but"
                    f" {record_file} names {name}: not read",
                    record.log_ref or record.ref,
                )
                for other in others
                if other in files
            )
        paths[cycle] = path
    return paths


def _cycle_of(name: str) -> int | None:
    """The cycle a log name (any script's digits) says it is of; None: no number."""
    if CYCLE_LOG_LOOK_ALIKE.fullmatch(name) is None:
        return None
    m = _ANY_DIGITS.search(name)
    return int(m["n"]) if m is not None else None  # int() reads every script's digits


def _look_alikes(layout: RunLayout) -> list[Path]:
    """Files in logs/ that look like a cycle log but are not named with ASCII digits."""
    try:
        with os.scandir(layout.logs) as entries:
            names = sorted(e.name for e in entries)
    except OSError:
        return []
    return [
        layout.logs / n
        for n in names
        if CYCLE_LOG_LOOK_ALIKE.fullmatch(n) and not CYCLE_LOG_PATTERN.fullmatch(n)
    ]


#: How many checkpoints on disk, besides those read, a restore point's keys are compared with
_KEY_WITNESSES = 2


def _foreign_model_keys(
    read: list[CheckpointMetadata],
    listed: tuple[int, ...] | None,
    layout: RunLayout,
    adapter: WorkloadLogAdapter,
    run_dir: Path,
) -> list[Problem]:
    """One run trains one model: every checkpoint it saved holds the same keys besides the
    optimizer's (optimizer_state_load judges those). A checkpoint read whose other keys differ
    from another of the run's checkpoints (a .metadata of another model's, or another run's)
    leaves unknown which state was restored (fatal). The nearest checkpoints on disk besides
    those read are read for the comparison too (at most :data:`_KEY_WITNESSES`)."""
    known = {m.iteration: m for m in read if m.model_keys is not None}
    if not known:
        return []
    others = sorted(
        (i for i in listed or () if i not in {m.iteration for m in read}),
        key=lambda i: min(abs(i - k) for k in known),
    )[:_KEY_WITNESSES]
    witnesses = list(known.values())
    for iteration in others:
        path = adapter.checkpoint_path(layout.checkpoint_dir, iteration)
        meta = read_checkpoint_metadata(path, iteration, run_dir)
        if meta.model_keys is not None and meta.not_evidence is None:
            witnesses.append(meta)
    for meta in known.values():
        for other in witnesses:
            if other.model_keys != meta.model_keys:
                assert meta.model_keys is not None and other.model_keys is not None
                only = sorted(meta.model_keys - other.model_keys)
                lacks = sorted(other.model_keys - meta.model_keys)
                example = f"{quote(only[0])} only here" if only else f"no {quote(lacks[0])}"
                return [
                    Problem(
                        "fatal",
                        f"checkpoint {meta.dir}/{DCP_METADATA} holds {len(meta.model_keys)} keys"
                        f" besides the optimizer's, {other.dir}/{DCP_METADATA}"
                        f" {len(other.model_keys)} ({example}): one run's checkpoints hold one"
                        " model, so which state was restored is unknown",
                        meta.ref,
                    )
                ]
    return []


def _refuse(path: Path, run_dir: Path, file: str, problems: list[Problem]) -> str | None:
    """Why a log cannot be evidence (FIFO, device, directory, link out of the run dir), recorded
    as a fatal problem; None when it can be read (or is absent)."""
    why = file_refusal(path, run_dir)
    if why is not None:
        problems.append(Problem("fatal", f"{file} {why}", EvidenceRef(file, None, f"({why})")))
    return why


__all__ = ["EvidenceRef", "RunDirError", "RunEvidence", "load_run"]
