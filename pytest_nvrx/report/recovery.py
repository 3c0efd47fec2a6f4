"""A recovery's cost as plain data: the recovery clock's milestones in seconds from the
scenario's ``t0``, its phases and downtime, and the training the fault threw away.

The recovery breakdown splits the downtime (the fault's instant to the first step the
replacement committed) at the milestones NVRx's profiling lines and the workload's log show. A
milestone the evidence lacks makes the phases on either side of it *missing* (``None``, never 0):
the time between the known milestones around it is ``unattributed_s``, so that the known phases
plus ``unattributed_s`` are always the downtime. The milestones, phases and downtime are the
recovery clock's (:func:`pytest_nvrx.evidence.timeline.recovery_clock`), the computation verify's
timings and the downtime gate read too; here they are only put in seconds from ``t0``.

A fault schedule has one recovery per fault (:class:`~pytest_nvrx.evidence.segments.
FaultRecovery`, each its own clock's), which says which fault it is and how it ended: one whose
replacement the next fault struck while it restored is down until that fault (``downtime_s``),
its restore cut short (``restoring_s``: its workers' start to the strike) and its checkpoint load
and first step *not reached* (``unreached``), never "not recovered".
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from pytest_nvrx.evidence.cycle_log import CycleLog
from pytest_nvrx.evidence.marker import Marker
from pytest_nvrx.evidence.rundir import RunEvidence
from pytest_nvrx.evidence.segments import FaultRecovery, outcome_note, schedule_keys
from pytest_nvrx.evidence.timeline import Phase, RecoveryClock, Timeline
from pytest_nvrx.report.plain import flat_dict, seconds_from


@dataclass(frozen=True, slots=True)
class MilestoneTime:
    id: str
    t_s: float | None  # None: the evidence does not show it
    ref: str | None  # file:line that shows it


@dataclass(frozen=True, slots=True)
class LostWork:
    """Training the fault threw away and the replacement did again."""

    restored_iteration: int | None
    last_iteration_before_failure: int | None
    iterations: int | None  # recomputed: last before failure - restored
    # the failed cycle's time from committing the restored iteration to the fault
    discarded_s: float | None
    # the replacement's time from its first committed step to re-committing the last lost one
    recomputed_s: float | None


@dataclass(frozen=True, slots=True)
class Recovery:
    milestones: tuple[MilestoneTime, ...]
    phases: tuple[Phase, ...]
    # failure -> first committed step after restore (a schedule's struck recovery: -> the next
    # fault)
    downtime_s: float | None
    unattributed_s: float | None  # downtime not covered by a known phase (milestones missing)
    lost_work: LostWork
    # a fault schedule's recovery (None/() for a run of one fault): its fault's position and
    # FAULT@WINDOW, how it ended (recovered, struck, stopped, not recovered), the fault that
    # struck its restore, why no restart was due (the first five: FaultRecovery's of the same
    # names, evidence/segments.SCHEDULE_KEYS), its restore cut short, the phases it never reached
    position: int | None = None
    fault: str | None = None
    outcome: str | None = None
    struck_by: int | None = None
    stopped: str | None = None
    restoring_s: float | None = None
    unreached: tuple[str, ...] = ()

    @property
    def scheduled(self) -> bool:
        """One recovery of a fault schedule's."""
        return self.position is not None

    def note(self) -> str | None:
        """How a schedule's recovery ended where it did not recover (None: it recovered, or
        a run of one fault)."""
        return outcome_note(self.outcome, self.struck_by, self.stopped)

    def as_dict(self) -> dict[str, Any]:
        # a schedule's recovery says which fault it is first; a one-fault run's is as it was
        scheduled = schedule_keys(self) if self.scheduled else {}
        struck = (
            {"restoring_s": self.restoring_s, "unreached": list(self.unreached)}
            if self.scheduled
            else {}
        )
        return {
            **scheduled,
            "downtime_s": self.downtime_s,
            "unattributed_s": self.unattributed_s,
            **struck,
            "milestones": [flat_dict(m) for m in self.milestones],
            "phases": [flat_dict(p) for p in self.phases],
            "lost_work": flat_dict(self.lost_work),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Recovery:
        # a document of a version before schedules' recoveries lacks their keys: defaults
        return cls(
            **{
                **data,
                "milestones": tuple(MilestoneTime(**m) for m in data["milestones"]),
                "phases": tuple(Phase(**p) for p in data["phases"]),
                "lost_work": LostWork(**data["lost_work"]),
                "unreached": tuple(data.get("unreached") or ()),
            }
        )


def recovery_of(
    run: RunEvidence, clock: RecoveryClock, t0: datetime | None, marker: Marker | None = None
) -> Recovery | None:
    """The recovery clock's milestones (from ``t0``), phases and downtime, and the lost work
    (``marker``: the fault's, where not run.marker: a schedule's later fault)."""
    if not clock.has_recovery:
        return None
    timeline = clock.timeline
    restored = clock.restored_iteration
    if marker is None:
        marker = run.marker
    if restored is None and marker is not None and marker.ok:
        restored = marker.tracker_iteration
    replacement = (
        run.cycle_log(timeline.replacement_cycle)
        if timeline.replacement_cycle is not None
        else None
    )
    return Recovery(
        milestones=_milestones(clock, t0),
        phases=clock.phases,
        downtime_s=clock.downtime_s,
        unattributed_s=clock.unattributed_s,
        lost_work=_lost_work(run, timeline, restored, replacement),
    )


def fault_recovery_of(run: RunEvidence, fault: FaultRecovery, t0: datetime | None) -> Recovery:
    """One recovery of a fault schedule's run, as :class:`FaultRecovery` measured it (its
    segment's clock: nothing computed again but the lost work)."""
    clock = fault.clock
    failed = clock.timeline.failed_cycle
    if failed is not None:
        # the work this fault threw away is its own cycle's, not an earlier fault's
        run = replace(run, cycle_logs=tuple(g for g in run.cycle_logs if g.cycle >= failed))
    base = recovery_of(run, clock, t0, fault.marker)
    lost = base.lost_work if base is not None else LostWork(None, None, None, None, None)
    return Recovery(
        milestones=_milestones(clock, t0),
        phases=fault.phases,
        downtime_s=fault.downtime_s,
        unattributed_s=fault.unattributed_s,
        lost_work=lost,
        restoring_s=fault.restoring_s,
        unreached=fault.unreached,
        **schedule_keys(fault),
    )


def _milestones(clock: RecoveryClock, t0: datetime | None) -> tuple[MilestoneTime, ...]:
    return tuple(
        MilestoneTime(
            mid,
            seconds_from(t0, at.time),
            None if at.ref is None or at.time is None else at.ref.location,
        )
        for mid, at in clock.milestones.items()
    )


def _lost_work(
    run: RunEvidence, timeline: Timeline, restored: int | None, replacement: CycleLog | None
) -> LostWork:
    failed = [
        log
        for log in run.cycle_logs
        if timeline.replacement_cycle is None or log.cycle < timeline.replacement_cycle
    ]
    before = [it for log in failed for it in log.iterations]
    last = max((it.iteration for it in before), default=None)
    iterations = max(0, last - restored) if last is not None and restored is not None else None
    discarded = None
    if restored is not None and timeline.fault_time is not None:
        done = [it.time for it in before if it.iteration == restored and it.time is not None]
        if done:
            discarded = round((timeline.fault_time - done[-1]).total_seconds(), 3)
        elif restored == 0:
            starts = [it.time for it in before if it.time is not None]
            discarded = (
                round((timeline.fault_time - starts[0]).total_seconds(), 3) if starts else None
            )
    recomputed = None
    if replacement is not None and replacement.first_iteration is not None and last is not None:
        first_t = replacement.first_iteration.time
        redone = [it.time for it in replacement.iterations if it.iteration == last and it.time]
        if first_t is not None and redone:
            recomputed = round((redone[0] - first_t).total_seconds(), 3)
        elif iterations == 0:
            recomputed = 0.0
    return LostWork(restored, last, iterations, discarded, recomputed)
