"""A fault schedule's run cut into one recovery per fault (issue #26): derived facts, no judgement.

A schedule injects fault k into cycle k-1 (one fault per cycle), and each fault's recovery is the
replacement cycle that follows it. :func:`fault_segments` gives, for every fault that happened (its
marker, ``fault_injected.json`` then ``fault_injected_<k>.json``), the run *as that recovery sees
it*: its own marker, the launcher's events without the other faults' failure records, and the
cycles up to its replacement (the last recovery keeps every later cycle: it runs to the end). The
criteria then judge each recovery as they judge a run of one fault; what is no single recovery's
(the end of the run, failures no fault explains, the restart budget) is judged over the whole run.

Each segment's recovery clock (:func:`~pytest_nvrx.evidence.timeline.recovery_clock` over its
view) is computed here, once: :class:`FaultRecovery` is what every output reads of it (verify's
per-fault timings, the console's rows, the report's bars, the JUnit properties, the downtime
gate), and :func:`schedule_downtime_s` the schedule's total. A recovery whose replacement the
next fault struck while it restored ends at that fault's instant: it is down until then, and
the milestones a fault in the restore comes before (the checkpoint loaded, the first committed
step) are *not reached*, not missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

from pytest_nvrx.evidence.launcher_log import LauncherEvent
from pytest_nvrx.evidence.manifest import Setting
from pytest_nvrx.evidence.marker import Marker
from pytest_nvrx.evidence.refs import Instant, seconds_between
from pytest_nvrx.evidence.rundir import RunEvidence
from pytest_nvrx.evidence.timeline import (
    PHASES,
    Phase,
    RecoveryClock,
    Timeline,
    build_timeline,
    is_failure,
    recovery_clock,
)
from pytest_nvrx.settings.schedule import ScheduledFault


@dataclass(frozen=True)
class FaultSegment:
    """One scheduled fault that happened, and the run as its recovery sees it."""

    position: int  # 1-based
    schedule: tuple[ScheduledFault, ...]
    marker: Marker
    view: RunEvidence
    timeline: Timeline
    #: the recovery clock of :attr:`view` (computed once, here)
    clock: RecoveryClock
    #: the next fault struck this fault's replacement while it loaded (window restore): the
    #: replacement never trained, and the next fault's recovery restores in its place
    interrupted_restore: bool
    #: no later fault happened: this recovery runs to the end of the run
    last: bool
    #: the next fault's marker (None for the last)
    next_marker: Marker | None = None

    @property
    def scheduled(self) -> ScheduledFault:
        return self.schedule[self.position - 1]

    @property
    def label(self) -> str:
        """``fault 2 of 3, hang@finalize in cycle 1``: what every verdict about it starts with."""
        cycle = self.timeline.failed_cycle
        where = f" in cycle {cycle}" if cycle is not None else ""
        return f"fault {self.position} of {len(self.schedule)}, {self.scheduled}{where}"


def scheduled_markers(run: RunEvidence, count: int) -> list[Marker | None]:
    """The markers of positions 1..count (None where a fault left none)."""
    return [run.marker_at(k) for k in range(1, count + 1)]


def fault_segments(run: RunEvidence, schedule: tuple[ScheduledFault, ...]) -> list[FaultSegment]:
    """One segment per leading fault of ``schedule`` whose usable marker exists, in order (a gap
    ends the list: a later marker without an earlier one is judged as the contradiction it is)."""
    markers: list[Marker] = []
    for marker in scheduled_markers(run, len(schedule)):
        if marker is None or not marker.ok:
            break
        markers.append(marker)
    timelines = [build_timeline(replace(run, marker=m, later_markers=())) for m in markers]
    out: list[FaultSegment] = []
    for i, (marker, timeline) in enumerate(zip(markers, timelines, strict=True)):
        last = i == len(markers) - 1
        others = {
            id(e) for j, other in enumerate(timelines) if j != i for e in other.failure_events
        }
        events = tuple(e for e in run.launcher.events if id(e) not in others)
        replacement = timeline.replacement_cycle
        # every cycle up to the replacement; the last recovery keeps the run's end
        keep = None if last or replacement is None else replacement
        view = replace(
            run,
            marker=marker,
            later_markers=(),
            launcher=replace(run.launcher, events=events),
            cycle_infos=replace(
                run.cycle_infos,
                records=tuple(
                    r for r in run.cycle_infos.records if keep is None or r.cycle <= keep
                ),
            ),
            cycle_logs=tuple(g for g in run.cycle_logs if keep is None or g.cycle <= keep),
        )
        manifest = run.manifest
        if manifest is not None and manifest.schedule is not None:
            # a run of this one fault: run.json's fault and window are its schedule entry's
            entry, at = schedule[i], manifest.schedule.ref
            view = replace(
                view,
                manifest=replace(
                    manifest, fault=Setting(entry.fault, at), window=Setting(entry.window, at)
                ),
            )
        nxt = markers[i + 1] if not last else None
        own = build_timeline(view)
        out.append(
            FaultSegment(
                position=i + 1,
                schedule=schedule,
                marker=marker,
                view=view,
                timeline=own,
                clock=recovery_clock(view, own),
                interrupted_restore=nxt is not None and nxt.window == "restore",
                last=last,
                next_marker=nxt,
            )
        )
    return out


def unexplained_failures(run: RunEvidence, segments: list[FaultSegment]) -> list[LauncherEvent]:
    """The launcher's failure records that no scheduled fault's recovery window holds."""
    explained = {id(e) for s in segments for e in s.timeline.failure_events}
    return [e for e in run.launcher.events if is_failure(e) and id(e) not in explained]


# ----------------------------------------------------------------------------------------------
# Every recovery of a schedule, measured

#: the milestones a fault in a replacement's restore comes before: the replacement it struck never
#: reached them (the fault fires inside its checkpoint load, after its workers started)
CUT_BY_RESTORE_FAULT = frozenset({"checkpoint_loaded", "first_step"})
#: the milestones of a replacement: where the launcher had to stop the job, none was started
CUT_BY_STOP = frozenset({"rendezvous", "workers_started", "checkpoint_loaded", "first_step"})

#: how a scheduled fault's recovery ended: its first committed step; the next fault struck its
#: replacement while it restored; no restart was due (the launcher had to stop the job); or
#: none of these (the evidence shows no step committed after the restore)
RecoveryOutcome = Literal["recovered", "struck", "stopped", "not recovered"]

#: Which fault of a schedule a recovery is and how it ended: :class:`FaultRecovery`'s properties
#: and the report's recovery fields of these names, the keys verify's ``recoveries`` entry and the
#: report's recovery of a schedule's run state first, in this order.
SCHEDULE_KEYS: tuple[str, ...] = ("position", "fault", "outcome", "struck_by", "stopped")


def schedule_keys(recovery: object) -> dict[str, Any]:
    """``recovery``'s :data:`SCHEDULE_KEYS`, by name (a FaultRecovery or the report's)."""
    return {key: getattr(recovery, key) for key in SCHEDULE_KEYS}


def outcome_note(outcome: str | None, struck_by: int | None, stopped: str | None) -> str | None:
    """How a schedule's recovery ended, in words, where it did not recover: what verify, the
    console's row and the report's bar say instead of a downtime to a first step (None: it
    recovered)."""
    if outcome == "stopped":
        return f"no restart due: {stopped} stopped the job"
    if outcome == "struck":
        return f"struck while restoring by fault {struck_by}"
    if outcome == "not recovered":
        return "not recovered: no step committed after the restore"
    return None


@dataclass(frozen=True)
class FaultRecovery:
    """One scheduled fault's recovery, as its segment's recovery clock measured it.

    It ends at its first committed step; where the next fault struck its replacement while it
    restored, at that fault's instant (:attr:`struck`): the recovery was down until then, and
    the next fault's recovery restores in its place. After the fault at which the launcher had
    to stop the job (:attr:`stopped`: its restart budget, NVRx's no-progress limit) no recovery
    was due: it has no downtime and adds none to the schedule's.
    """

    position: int  # 1-based
    count: int  # the faults of the schedule
    fault: str  # FAULT@WINDOW
    clock: RecoveryClock = field(compare=False, repr=False)
    marker: Marker = field(compare=False, repr=False)
    #: the next fault's instant, where it struck this recovery's replacement while it restored
    struck: Instant | None = None
    #: why no restart was due after this fault (the judgement's expected end of the run: the
    #: launcher's restart budget, NVRx's no-progress limit); None: a recovery was due
    stopped: str | None = None

    @property
    def label(self) -> str:
        """``fault 1 of 2, kill@step``."""
        return f"fault {self.position} of {self.count}, {self.fault}"

    @property
    def struck_by(self) -> int | None:
        """The fault that struck this recovery's replacement while it restored."""
        return self.position + 1 if self.struck is not None else None

    @property
    def due(self) -> bool:
        """A recovery was due (the job was not to be stopped after this fault)."""
        return self.stopped is None

    @property
    def outcome(self) -> RecoveryOutcome:
        if self.stopped is not None:
            return "stopped"
        if self.struck is not None:
            return "struck"
        return "recovered" if self.clock.at("first_step") is not None else "not recovered"

    @property
    def end(self) -> datetime | None:
        """When the recovery ended: the next fault's instant where that struck it, else its
        first committed step (None: neither, or no recovery was due)."""
        if self.stopped is not None:
            return None
        if self.struck is not None:
            return self.struck.time
        return self.clock.at("first_step")

    @property
    def downtime_s(self) -> float | None:
        """The fault's instant to the end of its recovery (:attr:`end`); None where the evidence
        does not show both, or no recovery was due."""
        return seconds_between(self.clock.at("failure"), self.end)

    @property
    def unreached(self) -> tuple[str, ...]:
        """The phases a recovery never reached (ids of :data:`PHASES`): a struck one's that end
        at a milestone the fault in its restore came before (:data:`CUT_BY_RESTORE_FAULT`), a
        stopped one's that end at a replacement's (:data:`CUT_BY_STOP`), each starting at a
        milestone it reached or at another such one. Any other phase the evidence lacks is
        missing."""
        if self.stopped is not None:
            cut = CUT_BY_STOP
        elif self.struck is not None:
            cut = CUT_BY_RESTORE_FAULT
        else:
            return ()
        return tuple(
            spec.id
            for spec in PHASES
            if spec.end in cut
            and self.clock.at(spec.end) is None
            and (spec.start in cut or self.clock.at(spec.start) is not None)
        )

    @property
    def phases(self) -> tuple[Phase, ...]:
        """The clock's phases; those the recovery never reached say why."""
        unreached = self.unreached
        if not unreached:
            return self.clock.phases
        if self.stopped is not None:
            why = f"not reached: no restart was due ({self.stopped} stopped the job)"
        else:
            why = f"not reached: fault {self.struck_by} struck the replacement while it restored"
        return tuple(replace(p, missing=why) if p.id in unreached else p for p in self.clock.phases)

    @property
    def restoring_s(self) -> float | None:
        """A struck recovery's restore, cut short: its workers started to the next fault's
        instant (None: not struck, or its workers' start is not in the evidence)."""
        if self.struck is None:
            return None
        return seconds_between(self.clock.at("workers_started"), self.struck.time)

    @property
    def unattributed_s(self) -> float | None:
        """The downtime neither a known phase nor a struck restore covers (milestones
        missing): known phases plus :attr:`restoring_s` plus this are the downtime."""
        if self.struck is None:
            return self.clock.unattributed_s if self.due else None
        downtime = self.downtime_s
        if downtime is None:
            return None
        phases = self.phases
        unreached = set(self.unreached)
        restoring = self.restoring_s
        if (
            restoring is not None
            and restoring >= 0
            and all(p.seconds is not None for p in phases if p.id not in unreached)
        ):
            return 0.0
        known = sum(p.seconds for p in phases if p.seconds is not None)
        return round(downtime - known - (restoring or 0.0), 3)

    def note(self) -> str | None:
        """How the recovery ended, in words, where it did not recover (:func:`outcome_note`)."""
        return outcome_note(self.outcome, self.struck_by, self.stopped)

    def timings(self) -> dict[str, float]:
        """verify's timings of this recovery (the clock's, less the whole run's)."""
        return self.clock.recovery_timings()

    def as_dict(self) -> dict[str, Any]:
        """verify's ``recoveries`` entry (docs/criteria.md)."""
        return {**schedule_keys(self), "downtime_s": self.downtime_s, "timings": self.timings()}


def fault_recoveries(
    segments: Sequence[FaultSegment], stop: tuple[int, str] | None = None
) -> tuple[FaultRecovery, ...]:
    """Every segment's recovery; ``stop``: the fault after which the launcher had to stop the
    job, and why (no recovery was due after it)."""
    out = []
    for segment in segments:
        nxt = segment.next_marker
        struck = None
        if segment.interrupted_restore and nxt is not None:
            struck = Instant(nxt.time, nxt.ref("time"))
        stopped = stop[1] if stop is not None and stop[0] == segment.position else None
        out.append(
            FaultRecovery(
                position=segment.position,
                count=len(segment.schedule),
                fault=str(segment.scheduled),
                clock=segment.clock,
                marker=segment.marker,
                struck=struck,
                stopped=stopped,
            )
        )
    return tuple(out)


def schedule_downtime_s(recoveries: Sequence[FaultRecovery]) -> float | None:
    """A schedule's total downtime: the union of its due recoveries' down intervals (each fault's
    instant to the end of its recovery). None where one of them is not measurable (or runs
    backwards: the clocks disagree), or no recovery was due."""
    intervals: list[tuple[datetime, datetime]] = []
    for recovery in recoveries:
        if not recovery.due:
            continue
        start, end = recovery.clock.at("failure"), recovery.end
        if start is None or end is None or end < start:
            return None
        intervals.append((start, end))
    if not intervals:
        return None
    total = 0.0
    intervals.sort()
    run_start, run_end = intervals[0]
    for start, end in intervals[1:]:
        if start > run_end:
            total += (run_end - run_start).total_seconds()
            run_start, run_end = start, end
        else:
            run_end = max(run_end, end)
    total += (run_end - run_start).total_seconds()
    return round(total, 3)
