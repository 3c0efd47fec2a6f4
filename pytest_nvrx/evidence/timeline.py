"""Correlate the artifacts of one run: when was the fault, which cycle failed, which replaced it.

Derived facts, not judgement: the criteria and the timings both start from a :class:`Timeline`.
The injected failure is the first launcher failure record at or after the marker's time; it
lasts until the first ``worker_start_completed`` after its detection (the replacement's start).
Any failure record outside that window is "another" failure.

The recovery clock (:func:`recovery_clock`) is computed here once from the timeline: the
recovery's milestones, its phases and the downtime. verify's timings, the recovery report
(pytest_nvrx.report) and the downtime gate (pytest_nvrx.session.scenario_run) all read it. A failure
the launcher recorded after it was told to stop (its ``death signal`` line: our run timeout
killed the run, a stop signal) is its own shutdown's, never the fault's detection: the clock
then has no detection, and no timing from one (the criteria judge that record as they do).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from pytest_nvrx.evidence.cycle_log import CycleLog
from pytest_nvrx.evidence.launcher_log import FAILURE_KINDS, LauncherEvent, LauncherEventKind
from pytest_nvrx.evidence.refs import EvidenceRef, Instant, seconds_between
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


def is_failure(event: LauncherEvent) -> bool:
    """A launcher record of a worker failure (or of its detection)."""
    return event.kind in FAILURE_KINDS or event.is_failure_detected


def build_timeline(run: RunEvidence) -> Timeline:
    marker = run.marker
    fault_time = marker.time if marker is not None and marker.ok else None
    events = run.launcher.events
    failures = [i for i, e in enumerate(events) if is_failure(e)]

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
    run: RunEvidence, timeline: Timeline, kind: type[S]
) -> list[S]:
    """Saves of ``kind`` logged before the failure: in a cycle before the replacement and, where
    both times are known, no later than :attr:`Timeline.save_bound`."""
    bound = timeline.save_bound
    out: list[S] = []
    for log in run.cycle_logs:
        if timeline.replacement_cycle is not None and log.cycle >= timeline.replacement_cycle:
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


# ----------------------------------------------------------------------------------------------
# The recovery clock: milestones, downtime and phases, computed here once for verify's timings,
# the recovery report and the downtime gate


@dataclass(frozen=True, slots=True)
class PhaseSpec:
    id: str
    label: str
    start: str  # milestone ids
    end: str


#: the milestones of a recovery, in order (ids as in report.json)
MILESTONES: tuple[tuple[str, str], ...] = (
    ("failure", "failure"),
    ("detected", "detected"),
    ("workers_stopped", "workers stopped"),
    ("workers_terminated", "workers terminated"),
    ("rendezvous", "rendezvous"),
    ("workers_started", "workers started"),
    ("checkpoint_loaded", "checkpoint loaded"),
    ("first_step", "first committed step"),
)
MILESTONE_LABELS = dict(MILESTONES)

#: the phases between consecutive milestones; their seconds sum to the downtime
PHASES: tuple[PhaseSpec, ...] = (
    PhaseSpec("detection", "failure → detected", "failure", "detected"),
    PhaseSpec("termination", "detected → workers stopped", "detected", "workers_stopped"),
    # NVRx waits, after stopping the workers, until every GPU of the node is nearly empty, other
    # runs' memory included ("GPU 0 memory reclaimed in 38s"); 0 where it logs no wait (CPU)
    PhaseSpec(
        "gpu_reclaim", "stopped → GPU memory reclaimed", "workers_stopped", "workers_terminated"
    ),
    PhaseSpec("rendezvous", "terminated → rendezvous", "workers_terminated", "rendezvous"),
    PhaseSpec("worker_start", "rendezvous → workers started", "rendezvous", "workers_started"),
    PhaseSpec(
        "checkpoint_load", "started → checkpoint loaded", "workers_started", "checkpoint_loaded"
    ),
    PhaseSpec("first_step", "loaded → first committed step", "checkpoint_loaded", "first_step"),
)


#: the timings of :meth:`RecoveryClock.timings` that are the whole run's, not its recovery's
RUN_TIMINGS = frozenset(
    {
        "launcher_start_to_first_iteration_s",
        "launcher_start_to_first_checkpoint_s",
        "whole_run_s",
    }
)


@dataclass(frozen=True, slots=True)
class Phase:
    id: str
    label: str
    seconds: float | None  # None: a milestone at either end is missing (not 0)
    missing: str | None  # which milestone the evidence lacks


@dataclass(frozen=True, slots=True)
class RecoveryClock:
    """The instants of one run's recovery and the seconds between them: verify's timings
    (:meth:`timings`), the report's milestones and phases, and the downtime the gate holds to
    its limit all read this one computation (:func:`recovery_clock`).

    Two instants start the replacement, and they differ on a multinode run: the ``workers_started``
    milestone (the report's phases) is the last ``worker_start_completed`` of the recovery's
    profiling cycle, when every node's workers had started; :attr:`replacement_start` (verify's
    ``detected_to_replacement_start_s`` and ``replacement_start_to_*``) is the first one after
    the detection, when the first node's had, else the replacement cycle's record start.
    """

    timeline: Timeline
    #: every id of :data:`MILESTONES`, in order
    milestones: Mapping[str, Instant]
    replacement_start: datetime | None
    #: NVRx's wait for GPU memory between the detection and :attr:`replacement_start`
    gpu_reclaim: LauncherEvent | None
    #: the iteration the replacement loaded (None: no load line)
    restored_iteration: int | None
    run_start: datetime | None  # run.json's (result.json's) start, else the launcher's first line
    run_end: datetime | None
    first_iteration: datetime | None  # the run's first committed step
    first_checkpoint: datetime | None  # the run's first save completed

    @property
    def has_recovery(self) -> bool:
        """A recovery to measure: the fault's instant or the launcher's detection is known."""
        return self.timeline.fault_time is not None or self.timeline.detected is not None

    def at(self, milestone: str) -> datetime | None:
        return self.milestones[milestone].time

    @property
    def downtime_s(self) -> float | None:
        """The fault's instant to the first step committed after the restore."""
        return seconds_between(self.at("failure"), self.at("first_step"))

    @property
    def phases(self) -> tuple[Phase, ...]:
        """:data:`PHASES`; a phase whose milestone the evidence lacks is missing (None), not 0."""
        out = []
        for spec in PHASES:
            a, b = self.at(spec.start), self.at(spec.end)
            lacking = [
                MILESTONE_LABELS[m] for m, t in ((spec.start, a), (spec.end, b)) if t is None
            ]
            missing = " and ".join(lacking) + " not in the evidence" if lacking else None
            out.append(Phase(spec.id, spec.label, seconds_between(a, b), missing))
        return tuple(out)

    @property
    def unattributed_s(self) -> float | None:
        """The downtime no known phase covers (milestones missing): known phases plus this are
        the downtime (each phase rounds to the millisecond, as the downtime itself)."""
        downtime = self.downtime_s
        if downtime is None:
            return None
        phases = self.phases
        if all(p.seconds is not None for p in phases):
            return 0.0
        return round(downtime - sum(p.seconds for p in phases if p.seconds is not None), 3)

    def run_timings(self) -> dict[str, float]:
        """The whole run's timings of :meth:`timings` (:data:`RUN_TIMINGS`): a fault schedule's
        run reports these for the run and every other one per fault."""
        return {k: v for k, v in self.timings().items() if k in RUN_TIMINGS}

    def recovery_timings(self) -> dict[str, float]:
        """The recovery's own timings of :meth:`timings` (all but :data:`RUN_TIMINGS`)."""
        return {k: v for k, v in self.timings().items() if k not in RUN_TIMINGS}

    def timings(self) -> dict[str, float]:
        """verify's timings: seconds between the recovery's instants, where the evidence shows
        both ends (``checkpoint_loaded``: :func:`loaded_at`)."""
        detected, replacement = self.at("detected"), self.replacement_start
        pairs = {
            "launcher_start_to_first_iteration_s": (self.run_start, self.first_iteration),
            "launcher_start_to_first_checkpoint_s": (self.run_start, self.first_checkpoint),
            "failure_to_detected_s": (self.at("failure"), detected),
            "detected_to_replacement_start_s": (detected, replacement),
            "replacement_start_to_checkpoint_loaded_s": (replacement, self.at("checkpoint_loaded")),
            "replacement_start_to_first_iteration_s": (replacement, self.at("first_step")),
            "failure_to_first_iteration_after_restore_s": (
                self.at("failure"),
                self.at("first_step"),
            ),
            "whole_run_s": (self.run_start, self.run_end),
        }
        out: dict[str, float] = {}
        for key, (a, b) in pairs.items():
            value = seconds_between(a, b)
            if value is not None:
                out[key] = value
        if self.gpu_reclaim is not None:
            out["gpu_memory_reclaim_s"] = self.gpu_reclaim.duration_s or 0.0
        return out


def recovery_clock(run: RunEvidence, timeline: Timeline | None = None) -> RecoveryClock:
    """The recovery's instants in ``run`` (``timeline``: its :func:`build_timeline`, built if
    None)."""
    if timeline is None:
        timeline = build_timeline(run)
    manifest = run.manifest
    start = end = None
    if manifest is not None:
        start = manifest.result_start.time or manifest.start.time
        end = manifest.end.time
    first_it = first_iteration(list(run.cycle_logs))
    first_saved = next(
        (e for log in run.cycle_logs for e in log.of_type(SaveCompleted) if e.time is not None),
        None,
    )

    detected = timeline.detected
    if detected is not None and _after_stop(run, detected):
        detected = None  # the launcher's shutdown, not a detection of the fault
    detected_t = detected.time if detected is not None else None
    started_first = (
        timeline.replacement_started.time if timeline.replacement_started is not None else None
    )
    replacement_t = started_first
    if replacement_t is None and timeline.replacement_cycle is not None:
        record = run.cycle_infos.by_cycle(timeline.replacement_cycle)
        replacement_t = record.start if record is not None else None
    replacement = (
        run.cycle_log(timeline.replacement_cycle)
        if timeline.replacement_cycle is not None
        else None
    )
    loaded_t, loaded_ref, restored = loaded_at(replacement)
    first = replacement.first_iteration if replacement is not None else None

    profiling_cycle = (
        detected.cycle if detected is not None and detected.is_failure_detected else None
    )
    terminated = _profiling_in_cycle(run, profiling_cycle, "worker_terminated")
    rendezvous = _profiling_in_cycle(run, profiling_cycle, "rendezvous_completed")
    started = (
        _profiling_in_cycle(run, profiling_cycle, "worker_start_completed")
        or timeline.replacement_started
    )
    reclaim = gpu_reclaim(run, detected_t, replacement_t)
    # the workers-stopped milestone looks for the wait up to the first node's start only (no
    # bound without one), as the report always did; the same wait wherever that start is logged
    stop_reclaim = (
        reclaim if replacement_t == started_first else gpu_reclaim(run, detected_t, started_first)
    )
    milestones = {
        "failure": Instant(timeline.fault_time, marker_ref(run)),
        "detected": _instant(detected),
        "workers_stopped": _stopped(detected_t, stop_reclaim, terminated),
        "workers_terminated": _instant(terminated),
        "rendezvous": _instant(rendezvous),
        "workers_started": _instant(started),
        "checkpoint_loaded": Instant(loaded_t, loaded_ref),
        "first_step": Instant(first.time, first.ref) if first is not None else Instant(None),
    }
    return RecoveryClock(
        timeline=timeline,
        milestones={mid: milestones[mid] for mid, _ in MILESTONES},
        replacement_start=replacement_t,
        gpu_reclaim=reclaim,
        restored_iteration=restored,
        run_start=start or run.launcher.first.time,
        run_end=end or run.launcher.last.time,
        first_iteration=first_it.time if first_it else None,
        first_checkpoint=first_saved.time if first_saved else None,
    )


def _after_stop(run: RunEvidence, event: LauncherEvent) -> bool:
    """Whether the launcher wrote ``event`` after it was told to stop
    (:meth:`~pytest_nvrx.evidence.launcher_log.LauncherLog.signalled`): a record of its own
    shutdown."""
    stop = run.launcher.signalled()
    if stop is None:
        return False
    if stop.ref.file == event.ref.file and stop.ref.line is not None and event.ref.line is not None:
        return event.ref.line > stop.ref.line
    return stop.time is not None and event.time is not None and event.time >= stop.time


def _instant(event: LauncherEvent | None) -> Instant:
    return Instant(event.time, event.ref) if event is not None else Instant(None)


def _profiling_in_cycle(run: RunEvidence, cycle: int | None, name: str) -> LauncherEvent | None:
    """The last ``name`` profiling event of profiling cycle ``cycle`` (all nodes done)."""
    if cycle is None:
        return None
    found = [
        e
        for e in run.launcher.events
        if e.kind is LauncherEventKind.PROFILING and e.name == name and e.cycle == cycle and e.time
    ]
    return max(found, key=lambda e: e.time or datetime.min) if found else None


def _stopped(
    detected: datetime | None, reclaim: LauncherEvent | None, terminated: LauncherEvent | None
) -> Instant:
    """When NVRx had stopped the workers and began waiting for the GPUs' memory: its
    ``GPU N memory reclaimed in Ss`` line's time less the wait (whole seconds as logged); the
    workers-terminated instant itself where it logs no wait (a CPU run: nothing to reclaim)."""
    if reclaim is None or reclaim.time is None or reclaim.duration_s is None:
        return _instant(terminated)
    began = reclaim.time - timedelta(seconds=reclaim.duration_s)
    if detected is not None and began < detected:
        began = detected  # a wait logged in whole seconds: never before the detection
    return Instant(began, reclaim.ref)


def marker_ref(run: RunEvidence) -> EvidenceRef | None:
    """The marker's line that gives the fault's instant."""
    marker = run.marker
    if marker is None or not marker.ok:
        return None
    if marker.doc is not None and "time" in marker.doc.key_lines:
        line, text = marker.doc.key_lines["time"]
        return EvidenceRef(marker.file, line, text.strip())
    return EvidenceRef(marker.file, None, "fault marker")


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
