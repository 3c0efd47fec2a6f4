"""A scenario's timeline as plain data: its cycles, the launcher's decisions and failures, the
fault (every fault of a schedule), the saves and the recovery's milestones, in seconds from the
scenario's ``t0``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pytest_nvrx.evidence.launcher_log import FAILURE_KINDS, LauncherEvent, LauncherEventKind
from pytest_nvrx.evidence.rundir import RunEvidence
from pytest_nvrx.evidence.segments import FaultRecovery
from pytest_nvrx.evidence.timeline import MILESTONE_LABELS, Timeline, marker_ref
from pytest_nvrx.evidence.workload import SaveCompleted, SaveScheduled
from pytest_nvrx.report.plain import flat_dict, seconds_from
from pytest_nvrx.report.recovery import Recovery

#: at most this many save events per kind and run are drawn
MAX_SAVE_EVENTS = 200


@dataclass(frozen=True, slots=True)
class CycleSpan:
    cycle: int
    start_s: float | None
    end_s: float | None  # None: still running when the evidence ends
    ranks: tuple[int, ...]
    first_iteration: int | None
    last_iteration: int | None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CycleSpan:
        return cls(**{**data, "ranks": tuple(data["ranks"])})


#: the kinds of timeline events, and how the legend names them
EVENT_KINDS: dict[str, str] = {
    "fault": "fault injected",
    "failure": "failure recorded",
    "detected": "failure detected",
    "workers_terminated": "workers terminated",
    "rendezvous": "rendezvous completed",
    "workers_started": "workers started",
    "checkpoint_loaded": "checkpoint loaded",
    "first_step": "first committed step",
    "save_submitted": "save submitted",
    "save_finalized": "save finalized",
    "decision": "launcher decision",
}


@dataclass(frozen=True, slots=True)
class TimelineEvent:
    kind: str  # a key of EVENT_KINDS
    t_s: float
    label: str
    cycle: int | None
    rank: int | None
    ref: str | None


@dataclass(frozen=True, slots=True)
class TimelineData:
    t0: str | None  # ISO UTC time that t_s counts from
    end_s: float | None
    cycles: tuple[CycleSpan, ...]
    events: tuple[TimelineEvent, ...]
    fault_rank: int | None
    # the shaded window: the fault's instant to the first committed step after the restore (a
    # schedule's: its first fault's)
    fault_window: tuple[float, float] | None
    # a fault schedule's windows, one per fault: to the end of its recovery (() for one fault)
    fault_windows: tuple[tuple[float, float], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "t0": self.t0,
            "end_s": self.end_s,
            "fault_rank": self.fault_rank,
            "fault_window": list(self.fault_window) if self.fault_window is not None else None,
            # a schedule's; absent from a one-fault run's document (as it was)
            **(
                {"fault_windows": [list(w) for w in self.fault_windows]}
                if self.fault_windows
                else {}
            ),
            "cycles": [flat_dict(c) for c in self.cycles],
            "events": [flat_dict(e) for e in self.events],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TimelineData:
        window = data["fault_window"]
        window = (float(window[0]), float(window[1])) if window is not None else None
        return cls(
            **{
                **data,
                "cycles": tuple(CycleSpan.from_dict(c) for c in data["cycles"]),
                "events": tuple(TimelineEvent(**e) for e in data["events"]),
                "fault_window": window,
                "fault_windows": tuple(
                    (float(a), float(b)) for a, b in data.get("fault_windows") or ()
                ),
            }
        )


_DECISIONS = {
    LauncherEventKind.GROUP_FAILED: "worker group failed, restart",
    LauncherEventKind.JOIN_RESTART: "joining cluster restart",
    LauncherEventKind.PROGRESS: "cycle made progress",
    LauncherEventKind.NO_PROGRESS: "cycle made NO progress",
    LauncherEventKind.EARLY_TERMINATION: "early termination",
    LauncherEventKind.NO_RESTART: "no more restarts",
    LauncherEventKind.GROUP_SUCCEEDED: "worker group finished",
    LauncherEventKind.RUN_OK: "run OK",
    LauncherEventKind.RUN_FAILED: "run failed",
    LauncherEventKind.AGENT_EXIT: "agent exit",
}
_PROFILING_KINDS = {
    "failure_detected": "detected",
    "worker_terminated": "workers_terminated",
    "rendezvous_completed": "rendezvous",
    "worker_start_completed": "workers_started",
}


def _later_faults(recoveries: Sequence[FaultRecovery], t0: datetime | None) -> list[TimelineEvent]:
    """A fault schedule's later faults (issue #26), each with its cycle, and each later
    recovery's checkpoint load and first committed step (its own clock's): the timeline shows
    every fault."""
    out: list[TimelineEvent] = []
    for recovery in recoveries[1:]:
        marker, timeline = recovery.marker, recovery.clock.timeline
        t_s = seconds_from(t0, marker.time)
        if t_s is None:
            continue
        what = f"{marker.fault} ({marker.signal})" if marker.signal else (marker.fault or "fault")
        out.append(
            TimelineEvent(
                "fault",
                t_s,
                f"fault {recovery.position}: {what} into rank {marker.rank} ({recovery.fault})",
                timeline.failed_cycle,
                marker.rank,
                marker.ref("time").location,
            )
        )
        for mid in ("checkpoint_loaded", "first_step"):
            instant = recovery.clock.milestones[mid]
            at = seconds_from(t0, instant.time)
            if at is not None:
                ref = instant.ref.location if instant.ref is not None else None
                label = f"{MILESTONE_LABELS[mid]} (fault {recovery.position})"
                out.append(TimelineEvent(mid, at, label, timeline.replacement_cycle, None, ref))
    return out


def _down_windows(
    recoveries: Sequence[FaultRecovery], t0: datetime | None, end_s: float | None
) -> tuple[tuple[float, float], ...]:
    """A schedule's shaded windows: each fault to the end of its recovery (its first committed
    step, the next fault that struck its restore); to the end of the evidence where it has no
    end (the job stopped after it, or it never recovered)."""
    out = []
    for recovery in recoveries:
        start = seconds_from(t0, recovery.clock.at("failure"))
        end = seconds_from(t0, recovery.end)
        if end is None:
            end = end_s
        if start is not None and end is not None and end > start:
            out.append((start, end))
    return tuple(out)


def _launcher_event(event: LauncherEvent, t_s: float) -> TimelineEvent | None:
    ref = event.ref.location
    if event.kind is LauncherEventKind.PROFILING:
        kind = _PROFILING_KINDS.get(event.name or "")
        if kind is None:
            return None
        return TimelineEvent(
            kind, t_s, f"{event.name} (cycle {event.cycle})", event.cycle, event.rank, ref
        )
    if event.kind in FAILURE_KINDS:
        what = event.kind.value.replace("_", " ")
        if event.exit_code is not None:
            what += f" (exit {event.exit_code})"
        if event.name and event.kind is not LauncherEventKind.GROUP_FAILED:
            what += f" {event.name}"
        kind = "decision" if event.kind is LauncherEventKind.GROUP_FAILED else "failure"
        label = _DECISIONS[event.kind] if kind == "decision" else what
        return TimelineEvent(kind, t_s, label, event.cycle, event.rank, ref)
    if event.kind in _DECISIONS:
        label = _DECISIONS[event.kind]
        if event.exit_code is not None:
            label += f" (exit {event.exit_code})"
        return TimelineEvent("decision", t_s, label, event.cycle, None, ref)
    return None


def timeline_data(
    run: RunEvidence,
    timeline: Timeline,
    t0: datetime | None,
    recovery: Recovery | None,
    recoveries: Sequence[FaultRecovery] = (),
) -> TimelineData:
    """The run's timeline (``recoveries``: a fault schedule's, evidence/segments.py)."""
    events: list[TimelineEvent] = []
    for event in run.launcher.events:
        t_s = seconds_from(t0, event.time)
        if t_s is None:
            continue
        found = _launcher_event(event, t_s)
        if found is not None:
            events.append(found)
    fault_t = seconds_from(t0, timeline.fault_time)
    marker = run.marker
    fault_rank = marker.rank if marker is not None and marker.ok else None
    if fault_t is not None and marker is not None:
        what = (
            f"{marker.fault or 'fault'} ({marker.signal})"
            if marker.signal
            else (marker.fault or "fault")
        )
        ref = marker_ref(run)
        events.append(
            TimelineEvent(
                "fault",
                fault_t,
                f"{what} into rank {fault_rank}",
                timeline.failed_cycle,
                fault_rank,
                ref.location if ref else None,
            )
        )
    events += _later_faults(recoveries, t0)
    cycles: list[CycleSpan] = []
    numbers = sorted({r.cycle for r in run.cycles} | {log.cycle for log in run.cycle_logs})
    for cycle in numbers:
        record = run.cycle_infos.by_cycle(cycle)
        log = run.cycle_log(cycle)
        start = record.start if record is not None else None
        end = record.end if record is not None else None
        if log is not None and start is None and log.first_iteration is not None:
            start = log.first_iteration.time
        if log is not None and end is None and log.last_iteration is not None:
            end = log.last_iteration.time
        cycles.append(
            CycleSpan(
                cycle,
                seconds_from(t0, start),
                seconds_from(t0, end),
                log.ranks if log is not None else (),
                log.first_iteration.iteration if log is not None and log.first_iteration else None,
                log.last_iteration.iteration if log is not None and log.last_iteration else None,
            )
        )
        if log is None:
            continue
        saves: list[tuple[str, SaveScheduled | SaveCompleted]] = [
            *(("submitted", e) for e in log.of_type(SaveScheduled)[:MAX_SAVE_EVENTS]),
            *(("finalized", e) for e in log.of_type(SaveCompleted)[:MAX_SAVE_EVENTS]),
        ]
        for verb, save in saves:
            t_s = seconds_from(t0, save.time)
            if t_s is not None:
                label = f"save {save.iteration} {verb}"
                where = save.ref.location
                events.append(TimelineEvent(f"save_{verb}", t_s, label, cycle, None, where))
    if recovery is not None:
        for m in recovery.milestones:
            if m.id in ("checkpoint_loaded", "first_step") and m.t_s is not None:
                events.append(
                    TimelineEvent(
                        m.id, m.t_s, MILESTONE_LABELS[m.id], timeline.replacement_cycle, None, m.ref
                    )
                )
    events.sort(key=lambda e: e.t_s)
    ends = [run.launcher.last.time]
    if run.manifest is not None:
        ends.append(run.manifest.end.time)
    end_s = max((v for v in (seconds_from(t0, t) for t in ends) if v is not None), default=None)
    known = [e.t_s for e in events] + [c.end_s for c in cycles if c.end_s is not None]
    if known:
        end_s = max([*known, end_s or 0.0])
    window = None
    windows = _down_windows(recoveries, t0, end_s)
    if windows:
        window = windows[0]
    elif recovery is not None and fault_t is not None:
        # to the first committed step after the restore; without one, to the end of the evidence
        by_id = {m.id: m.t_s for m in recovery.milestones}
        end_t = by_id["first_step"] if by_id["first_step"] is not None else end_s
        if end_t is not None and end_t > fault_t:
            window = (fault_t, end_t)
    return TimelineData(
        t0=t0.isoformat() if t0 is not None else None,
        end_s=end_s,
        cycles=tuple(cycles),
        events=tuple(events),
        fault_rank=fault_rank,
        fault_window=window,
        fault_windows=windows,
    )
