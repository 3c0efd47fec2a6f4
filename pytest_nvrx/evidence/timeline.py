"""Correlate the artifacts of one run: when was the fault, which cycle failed, which replaced it.

Derived facts, not judgement: the criteria and the timings both start from a :class:`Timeline`.
The injected failure is the first launcher failure record at or after the marker's time; it
lasts until the first ``worker_start_completed`` after its detection (the replacement's start).
Any failure record outside that window is "another" failure.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from pytest_nvrx.evidence.cycle_log import CycleLog
from pytest_nvrx.evidence.launcher_log import FAILURE_KINDS, LauncherEvent, LauncherEventKind
from pytest_nvrx.evidence.refs import EvidenceRef, seconds_between
from pytest_nvrx.evidence.rundir import RunEvidence
from pytest_nvrx.evidence.workload import (
    IterationCommitted,
    LoadCompleted,
    Milestone,
    SaveCompleted,
    SaveScheduled,
)

# Marker times have millisecond precision and come from another clock read than the launcher's.
CLOCK_SLACK = timedelta(seconds=1)

# How far the marker's time may lie before the "save completed" line of the checkpoint it names.
# The fault follows the finalization: the injector waits for the tracker, which Megatron writes
# just before it prints "successfully saved". Measured on the 14 committed real fault runs
# (tests/data): the marker came 1.6 ms (gpu-kill-100, the walkthrough's wrapper) to 61 ms (our
# injector, which confirms the tracker by two reads 10 ms apart: 11-61 ms) *after* that line,
# never before it. The one millisecond allowed is the resolution of a marker written to the
# millisecond ("11:03:55.960"), not a clock allowance.
FINALIZED_BEFORE_FAULT_SLACK = timedelta(milliseconds=1)


@dataclass(frozen=True, slots=True)
class Timeline:
    fault_time: datetime | None  # the marker's time
    failure_events: tuple[LauncherEvent, ...]  # the injected failure as the launcher recorded it
    detected: LauncherEvent | None  # failure_detected (else the first failure record)
    restart_decision: LauncherEvent | None  # "Worker group FAILED ... will restart"
    replacement_started: LauncherEvent | None  # worker_start_completed after the detection
    other_failures: tuple[LauncherEvent, ...]  # failure records before or after that window
    failed_cycle: int | None
    replacement_cycle: int | None

    @property
    def save_bound(self) -> datetime | None:
        """Latest time a save can have completed and still count as before the failure.

        The launcher's detection: no rank can finalize a save once the launcher saw one die.
        (Which of those saves the *marker* names must also precede the marker's own time:
        :data:`FINALIZED_BEFORE_FAULT_SLACK`, checked by prior_checkpoint.)
        """
        if self.detected is not None and self.detected.time is not None:
            return self.detected.time
        return self.fault_time


def _is_failure(event: LauncherEvent) -> bool:
    return event.kind in FAILURE_KINDS or event.is_failure_detected


def build_timeline(run: RunEvidence) -> Timeline:
    marker = run.marker
    fault_time = marker.time if marker is not None and marker.ok else None
    events = run.launcher.events
    failures = [i for i, e in enumerate(events) if _is_failure(e)]

    anchor: int | None = None
    for i in failures:
        t = events[i].time
        if fault_time is None or t is None or t >= fault_time - CLOCK_SLACK:
            anchor = i
            break

    detected_i: int | None = None
    decision: LauncherEvent | None = None
    started_i: int | None = None
    if anchor is not None:
        detected_i = next(
            (i for i in failures if i >= anchor and events[i].is_failure_detected), None
        )
        if detected_i is None:
            detected_i = anchor
        started_i = next(
            (
                i
                for i in range(detected_i, len(events))
                if events[i].kind is LauncherEventKind.PROFILING
                and events[i].name == "worker_start_completed"
            ),
            None,
        )
        end = started_i if started_i is not None else len(events)
        decision = next(
            (
                events[i]
                for i in range(anchor, end)
                if events[i].kind
                in (LauncherEventKind.GROUP_FAILED, LauncherEventKind.JOIN_RESTART)
            ),
            None,
        )
    window_end = started_i if started_i is not None else len(events)
    in_window = [i for i in failures if anchor is not None and anchor <= i < window_end]
    others = [i for i in failures if i not in in_window]

    detected = events[detected_i] if detected_i is not None else None
    failed_cycle = _failed_cycle(run, fault_time, detected)
    replacement = _replacement_cycle(run, failed_cycle)
    return Timeline(
        fault_time=fault_time,
        failure_events=tuple(events[i] for i in in_window),
        detected=detected,
        restart_decision=decision,
        replacement_started=events[started_i] if started_i is not None else None,
        other_failures=tuple(events[i] for i in others),
        failed_cycle=failed_cycle,
        replacement_cycle=replacement,
    )


def _failed_cycle(
    run: RunEvidence, fault_time: datetime | None, detected: LauncherEvent | None
) -> int | None:
    if fault_time is not None:
        for record in run.cycles:
            if record.start is None or record.start > fault_time:
                continue
            if record.end is None or fault_time <= record.end + CLOCK_SLACK:
                return record.cycle
    if detected is not None and detected.is_failure_detected and detected.cycle:
        # NVRx bumps its profiling cycle at failure_detected: the failed cycle is the one before
        return detected.cycle - 1
    if fault_time is not None and run.cycle_logs and not run.cycles:
        return run.cycle_logs[0].cycle
    return None


def _replacement_cycle(run: RunEvidence, failed: int | None) -> int | None:
    if failed is None:
        return None
    later = {r.cycle for r in run.cycles if r.cycle > failed}
    later |= {log.cycle for log in run.cycle_logs if log.cycle > failed}
    return min(later) if later else None


# ----------------------------------------------------------------------------------------------
# Saves across cycles


def saves_before_failure[S: (SaveCompleted, SaveScheduled)](
    run: RunEvidence, tl: Timeline, kind: type[S]
) -> list[S]:
    """Saves of ``kind`` logged before the failure: in a cycle before the replacement and, where
    both times are known, no later than :attr:`Timeline.save_bound`."""
    bound = tl.save_bound
    out: list[S] = []
    for log in run.cycle_logs:
        if tl.replacement_cycle is not None and log.cycle >= tl.replacement_cycle:
            continue
        for event in log.of_type(kind):
            if bound is not None and event.time is not None and event.time > bound:
                continue
            out.append(event)
    return out


def logs_from(run: RunEvidence, cycle: int | None) -> list[CycleLog]:
    return [log for log in run.cycle_logs if cycle is None or log.cycle >= cycle]


# ----------------------------------------------------------------------------------------------
# Timings


def first_iteration(logs: list[CycleLog]) -> IterationCommitted | None:
    for log in logs:
        if log.first_iteration is not None:
            return log.first_iteration
    return None


def checkpoint_loaded(log: CycleLog) -> tuple[LoadCompleted | None, Milestone | None]:
    """A cycle's first checkpoint load and the instant it was done: the first ``setup_done``
    milestone after the load line (Megatron's load lines carry no time of their own)."""
    load: LoadCompleted | None = None
    for event in log.events:
        if isinstance(event, LoadCompleted):
            load = load or event
        elif load is not None and isinstance(event, Milestone) and event.name == "setup_done":
            return load, event
    return load, None


def loaded_at(log: CycleLog | None) -> tuple[datetime | None, EvidenceRef | None, int | None]:
    """When a cycle had loaded its checkpoint, the line that shows it, and the iteration: the
    first ``setup_done`` after the load line (Megatron's load lines carry no time), else the
    load lines' own time (the reference workload prints one per rank, each with its time: the
    last, when every rank had loaded). verify's timings and the report both read it here."""
    if log is None:
        return None, None, None
    load, done = checkpoint_loaded(log)
    if load is None:
        return None, None, None
    if done is not None:
        return done.time, done.ref, load.iteration
    timed = [
        (e.time, e.ref)
        for e in log.of_type(LoadCompleted)
        if e.iteration == load.iteration and e.time is not None
    ]
    if not timed:
        return None, None, load.iteration
    t, ref = max(timed, key=lambda pair: pair[0])
    return t, ref, load.iteration


def timings(run: RunEvidence, tl: Timeline) -> dict[str, float]:
    """Seconds between the recovery's milestones, where the evidence shows both ends.

    ``checkpoint_loaded``: :func:`loaded_at`; ``replacement_start`` is the launcher's
    ``worker_start_completed`` (else the cycle record's start).
    """
    manifest = run.manifest
    start = None
    end = None
    if manifest is not None:
        start = manifest.result_start_time or manifest.start_time
        end = manifest.end_time
    start = start or run.launcher.first_time
    end = end or run.launcher.last_time

    all_logs = list(run.cycle_logs)
    first_it = first_iteration(all_logs)
    first_saved = next(
        (e for log in all_logs for e in log.of_type(SaveCompleted) if e.time is not None), None
    )
    detected_t = tl.detected.time if tl.detected is not None else None
    replacement_t = tl.replacement_started.time if tl.replacement_started is not None else None
    replacement_log = (
        run.cycle_log(tl.replacement_cycle) if tl.replacement_cycle is not None else None
    )
    if replacement_t is None and tl.replacement_cycle is not None:
        record = run.cycle_infos.by_cycle(tl.replacement_cycle)
        replacement_t = record.start if record is not None else None
    loaded_t = None
    restored_first_t = None
    if replacement_log is not None:
        loaded_t = loaded_at(replacement_log)[0]
        if replacement_log.first_iteration is not None:
            restored_first_t = replacement_log.first_iteration.time

    pairs = {
        "launcher_start_to_first_iteration_s": (start, first_it.time if first_it else None),
        "launcher_start_to_first_checkpoint_s": (start, first_saved.time if first_saved else None),
        "failure_to_detected_s": (tl.fault_time, detected_t),
        "detected_to_replacement_start_s": (detected_t, replacement_t),
        "replacement_start_to_checkpoint_loaded_s": (replacement_t, loaded_t),
        "replacement_start_to_first_iteration_s": (replacement_t, restored_first_t),
        "failure_to_first_iteration_after_restore_s": (tl.fault_time, restored_first_t),
        "whole_run_s": (start, end),
    }
    out: dict[str, float] = {}
    for key, (a, b) in pairs.items():
        value = seconds_between(a, b)
        if value is not None:
            out[key] = value
    reclaim = gpu_reclaim(run, detected_t, replacement_t)
    if reclaim is not None:
        out["gpu_memory_reclaim_s"] = reclaim.duration_s or 0.0
    return out


def gpu_reclaim(
    run: RunEvidence, detected: datetime | None, replacement: datetime | None
) -> LauncherEvent | None:
    """NVRx's wait for the GPUs' memory in this recovery (the longest of its GPUs): logged after
    the workers were stopped, before the replacement started. Part of ``detected -> replacement
    start``; on a GPU other runs hold it waits for their memory too."""
    if detected is None:
        return None
    found = [
        e
        for e in run.launcher.events
        if e.kind is LauncherEventKind.GPU_RECLAIM
        and e.time is not None
        and e.time >= detected
        and (replacement is None or e.time <= replacement)
        and e.duration_s is not None
    ]
    return max(found, key=lambda e: e.duration_s or 0.0) if found else None
