"""A fault schedule's run cut into one recovery per fault (issue #26): derived facts, no judgement.

A schedule injects fault k into cycle k-1 (one fault per cycle), and each fault's recovery is the
replacement cycle that follows it. :func:`fault_segments` gives, for every fault that happened (its
marker, ``fault_injected.json`` then ``fault_injected_<k>.json``), the run *as that recovery sees
it*: its own marker, the launcher's events without the other faults' failure records, and the
cycles up to its replacement (the last recovery keeps every later cycle: it runs to the end). The
criteria then judge each recovery as they judge a run of one fault; what is no single recovery's
(the end of the run, failures no fault explains, the restart budget) is judged over the whole run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pytest_nvrx.evidence.launcher_log import LauncherEvent
from pytest_nvrx.evidence.manifest import Setting
from pytest_nvrx.evidence.marker import Marker
from pytest_nvrx.evidence.rundir import RunEvidence
from pytest_nvrx.evidence.timeline import Timeline, build_timeline, is_failure
from pytest_nvrx.settings.schedule import ScheduledFault


@dataclass(frozen=True)
class FaultSegment:
    """One scheduled fault that happened, and the run as its recovery sees it."""

    position: int  # 1-based
    schedule: tuple[ScheduledFault, ...]
    marker: Marker
    view: RunEvidence
    timeline: Timeline
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
        out.append(
            FaultSegment(
                position=i + 1,
                schedule=schedule,
                marker=marker,
                view=view,
                timeline=build_timeline(view),
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
