"""The criteria over a fault schedule's run (issue #26): every fault's recovery, then the whole run.

Each fault that happened is judged by the recovery criteria as a run of that one fault
(pytest_nvrx.evidence.segments: its marker, its failure, the cycles up to its replacement), with
run.json's schedule entry as the expected fault and window. A criterion passes only when it
passes for every fault; a failing one names the fault it is about (``fault 2 of 3,
hang@finalize in cycle 1: ...``). Two kinds of recovery are judged for less than the run's end:

* one that a later fault ended: it must have restored, trained past the restore and completed a
  checkpoint (the next fault needs one), not reached the final iteration;
* one whose replacement the next fault struck while it loaded (window ``restore``): it never
  trained; its load must have been of the checkpoint it had to restore (the next marker's
  ``load_iteration``), and the next fault's recovery restores in its place.

``no_repeat_injection`` is the whole run's: every fault the schedule and the restart budget
allow happened exactly once and no other fault did, no failure is left that no scheduled fault
explains, and the launcher ended as it must: successfully after the last recovery, or, for a
schedule longer than ``--max-restarts``, by giving up after exactly max-restarts + 1 cycles (its
own line quoted) — a qualification of the launcher's budget, not a failure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from pytest_nvrx.criteria import clocks
from pytest_nvrx.criteria.context import JudgeContext
from pytest_nvrx.criteria.expected import ExpectedFault, ExpectedWindow
from pytest_nvrx.criteria.helpers import (
    launcher_outcome,
    launcher_words,
    timed_out_failure,
    workload_failures,
)
from pytest_nvrx.criteria.registry import CRITERIA
from pytest_nvrx.criteria.replaced_cycle import death_problem
from pytest_nvrx.criteria.verdict import (
    CRITERIA_IDS,
    CriterionId,
    Verdict,
    failing,
    not_applicable,
    passing,
)
from pytest_nvrx.evidence.durability import end_of_run_break, reading_breaks, unfinalized_breaks
from pytest_nvrx.evidence.launcher_log import LauncherEvent, LauncherEventKind
from pytest_nvrx.evidence.refs import EvidenceRef, Problem, is_ascii_number
from pytest_nvrx.evidence.rundir import RunEvidence
from pytest_nvrx.evidence.segments import FaultSegment, fault_recoveries, unexplained_failures
from pytest_nvrx.evidence.timeline import PHASES
from pytest_nvrx.evidence.workload import LoadCompleted, LoadStarted
from pytest_nvrx.layout import SCHEDULE_WINDOWS, marker_name
from pytest_nvrx.settings.schedule import (
    NVRX_NO_PROGRESS_LIMIT,
    EndingKind,
    ScheduledFault,
    render_schedule,
    schedule_ending,
)

#: What the whole run is judged by; every other criterion is judged per fault.
WHOLE_RUN: CriterionId = "no_repeat_injection"


def restart_budget(run: RunEvidence) -> tuple[int, EvidenceRef] | None:
    """``--max-restarts``: run.json's, else the launcher's launch configuration."""
    manifest = run.manifest
    if manifest is not None and manifest.max_restarts is not None:
        return manifest.max_restarts.value, manifest.max_restarts.ref
    value = run.launcher.config.get("max_restarts", "")
    if is_ascii_number(value):
        return int(value), run.launcher.config_refs["max_restarts"]
    return None


#: NVRx's exit code when it decides a job must not be restarted (its no-progress stop;
#: ``--ft-no-restart-exit-code``, which our recipe never sets); a spent restart budget exits as a
#: failed run (1).
NO_RESTART_EXIT_CODE = 93
#: NVRx's own line stating the no-progress limit in force ("Consecutive cycles without progress:
#: 1/3"), which wins over its default (NVRX_NO_PROGRESS_LIMIT) where the log has one.
_NO_PROGRESS_COUNT = re.compile(r"Consecutive cycles without progress: (\d+)/(\d+)")


@dataclass(frozen=True, slots=True)
class Ending:
    """How a schedule's run must end: after how many faults, and why.

    ``finished``: every fault recovered and training ran to the end. ``budget``: the fault at
    ``due`` found no restart left (``--max-restarts``). ``no-progress``: the cycle that fault
    ended was the ``limit``-th in a row without progress (a fault in a replacement's restore
    ends a cycle whose tracker never moved), so NVRx stopped the job instead of restarting it.
    """

    due: int
    how: EndingKind
    budget: tuple[int, EvidenceRef] | None
    limit: tuple[int, EvidenceRef | None]

    @property
    def stopped(self) -> bool:
        return self.how != "finished"

    def why(self) -> str:
        if self.how == "budget" and self.budget is not None:
            return f"the launcher's restart budget (max_restarts {self.budget[0]})"
        return f"NVRx's no-progress limit ({self.limit[0]} consecutive cycles without progress)"


def no_progress_limit(run: RunEvidence) -> tuple[int, EvidenceRef | None]:
    """The no-progress limit in force: NVRx's own line that states it, else its default."""
    for event in run.launcher.of_kind(LauncherEventKind.NO_PROGRESS):
        m = _NO_PROGRESS_COUNT.search(event.ref.text)
        if m is not None:
            return int(m[2]), event.ref
    return NVRX_NO_PROGRESS_LIMIT, None


def expected_ending(
    schedule: tuple[ScheduledFault, ...],
    budget: tuple[int, EvidenceRef] | None,
    limit: tuple[int, EvidenceRef | None],
) -> Ending:
    """How the run of ``schedule`` must end (pytest_nvrx.settings.schedule.schedule_ending),
    with the lines that state the budget and the limit."""
    due, how = schedule_ending(schedule, budget[0] if budget is not None else None, limit[0])
    return Ending(due, how, budget, limit)


def run_ending(run: RunEvidence, schedule: tuple[ScheduledFault, ...]) -> Ending:
    """How ``run``, a run of ``schedule``, must end: by its restart budget and no-progress limit."""
    return expected_ending(schedule, restart_budget(run), no_progress_limit(run))


def schedule_verdicts(
    run: RunEvidence,
    schedule: tuple[ScheduledFault, ...],
    schedule_ref: EvidenceRef,
    segments: list[FaultSegment],
    *,
    baseline: RunEvidence | None = None,
    continuity_rtol: float = 0.0,
    ending: Ending | None = None,
) -> tuple[Verdict, ...]:
    """Every criterion over ``run``, a run of ``schedule`` (run.json's, at ``schedule_ref``) cut
    into ``segments`` (:func:`~pytest_nvrx.evidence.segments.fault_segments`); ``ending``: its
    :func:`run_ending`, computed if None."""
    if ending is None:
        ending = run_ending(run, schedule)
    due = ending.due
    per_fault: dict[CriterionId, list[tuple[str, Verdict]]] = {c: [] for c in CRITERIA_IDS}
    for segment in segments:
        last = ending if ending.stopped and segment.position == due else None
        for cid, verdict in _segment_verdicts(
            segment, schedule_ref, baseline, continuity_rtol, last
        ).items():
            per_fault[cid].append((segment.label, verdict))
    missing = _missing_fault(run, schedule, segments, due, schedule_ref)
    out = []
    for cid in CRITERIA_IDS:
        if cid == WHOLE_RUN:
            out.append(_whole_run(run, schedule, segments, ending, schedule_ref))
        elif missing is not None:
            out.append(failing(cid, missing[0], missing[1], schedule_ref))
        else:
            out.append(_combined(cid, per_fault[cid], schedule, schedule_ref))
    return tuple(out)


def _segment_verdicts(
    segment: FaultSegment,
    schedule_ref: EvidenceRef,
    baseline: RunEvidence | None,
    rtol: float,
    stop: Ending | None,
) -> dict[CriterionId, Verdict]:
    """The per-fault criteria of one fault's recovery."""
    entry = segment.scheduled
    view = segment.view
    source = f"run.json schedule, fault {segment.position}"
    ctx = JudgeContext.build(
        view,
        ExpectedFault(entry.fault, source, schedule_ref),  # type: ignore[arg-type]
        baseline=baseline,
        continuity_rtol=rtol,
        window=ExpectedWindow(entry.window, source, schedule_ref),
        cut_short=not segment.last or segment.interrupted_restore,
    )
    out: dict[CriterionId, Verdict] = {}
    for cid in CRITERIA_IDS:
        if cid == WHOLE_RUN:
            continue
        died = death_problem(ctx) if cid == "replaced_cycle" and stop is not None else None
        if died is not None:
            # no replacement is due, but the records must still show the fault's death
            out[cid] = died
        elif cid != "prior_checkpoint" and stop is not None:
            out[cid] = not_applicable(
                cid,
                f"after this fault {stop.why()} stops the job: no replacement is expected"
                " (no_repeat_injection judges the launcher's stop)",
                stop.budget[1] if stop.how == "budget" and stop.budget else stop.limit[1],
                segment.marker.ref("time"),
            )
        elif segment.interrupted_restore and cid in (
            "optimizer_state_load",
            "progress_past_restore",
            "training_continuity",
        ):
            out[cid] = _interrupted(cid, ctx, segment)
        else:
            out[cid] = CRITERIA[cid](ctx)
    return out


def _interrupted(cid: CriterionId, ctx: JudgeContext, segment: FaultSegment) -> Verdict:
    """A recovery whose replacement the next fault struck while it loaded: what it loaded must
    be the checkpoint it had to restore; it trained nothing to judge."""
    nxt = segment.next_marker
    assert nxt is not None  # an interrupted restore has a next fault
    position = segment.position + 1
    struck = f"fault {position} struck its replacement while it loaded"
    cycle = segment.timeline.replacement_cycle
    log = segment.view.cycle_log(cycle) if cycle is not None else None
    trained = log.first_iteration if log is not None else None
    if trained is not None:
        # the log says the struck replacement trained: the marker's "during the load" is false
        return failing(
            cid,
            f"{struck} (window restore), yet cycle {cycle} committed iteration"
            f" {trained.iteration}: the fault did not land in its restore",
            trained.ref,
            nxt.ref("window"),
        )
    if cid != "optimizer_state_load":
        return not_applicable(
            cid,
            f"{struck}: it never trained; fault {position}'s recovery is judged in its place",
            nxt.ref("time"),
        )
    target = ctx.restore_target
    loading = nxt.load_iteration
    proof = target.save.ref if target.save is not None else segment.marker.ref("tracker_iteration")
    other = [
        e
        for e in (log.events if log is not None else ())
        if isinstance(e, LoadCompleted | LoadStarted) and e.iteration != target.iteration
    ]
    if other:
        # a rank of the struck replacement logged loading another checkpoint
        why = (
            f"cycle {cycle} logged loading checkpoint {other[0].iteration}, not {target.iteration}"
        )
        return failing(
            cid, f"{struck}, but {why}, the newest completed before this fault", other[0].ref, proof
        )
    if target.iteration is None or loading != target.iteration:
        why = f"the newest checkpoint completed before this fault is {target.iteration}"
        return failing(
            cid,
            f"{struck}, loading checkpoint {loading}, but {why}",
            nxt.ref("load_iteration"),
            proof,
        )
    return passing(
        cid,
        f"{struck}: it was loading checkpoint {loading}, the newest completed before this fault"
        f" (fault {position}'s recovery loads it again and is judged in full)",
        nxt.ref("load_iteration"),
        proof,
    )


def _combined(
    cid: CriterionId,
    results: list[tuple[str, Verdict]],
    schedule: tuple[ScheduledFault, ...],
    schedule_ref: EvidenceRef,
) -> Verdict:
    """One verdict of every fault's: the first failing fault's, named, else all of them."""
    if not results:
        return failing(
            cid, f"no fault of the schedule {render_schedule(schedule)} happened", schedule_ref
        )
    bad = [(label, v) for label, v in results if not v.passed]
    if bad:
        label, first = bad[0]
        more = f" (and {len(bad) - 1} more of the faults)" if len(bad) > 1 else ""
        verdict = failing(cid, f"{label}: {first.reason}{more}", first.evidence)
        return replace(verdict, cannot_judge=first.cannot_judge)
    reason = "; ".join(f"{label}: {v.reason}" for label, v in results)
    evidence = [ref for _, v in results for ref in v.evidence]
    if all(v.not_applicable for _, v in results):
        return replace(passing(cid, reason, evidence), not_applicable=True)
    return passing(cid, reason, evidence)


def _missing_fault(
    run: RunEvidence,
    schedule: tuple[ScheduledFault, ...],
    segments: list[FaultSegment],
    due: int,
    schedule_ref: EvidenceRef,
) -> tuple[str, EvidenceRef | None] | None:
    """The first fault that was due but never happened, and why (never a pass)."""
    if len(segments) >= due:
        return None
    position = len(segments) + 1
    entry = schedule[position - 1]
    marker = run.marker_at(position)
    name = marker_name(position)
    if marker is not None and not marker.ok:
        return f"fault {position} of {len(schedule)}, {entry}: {marker.error}", marker.ref()
    never = [line for log in run.cycle_logs for line in log.injector if line.kind == "never"]
    why = (
        f"the injector said: {never[-1].reason}"
        if never and never[-1].reason
        else "no line of the injector says why"
    )
    return (
        f"fault {position} of {len(schedule)}, {entry}, never happened ({name} is absent): {why}",
        never[-1].ref if never else None,
    )


def _whole_run(
    run: RunEvidence,
    schedule: tuple[ScheduledFault, ...],
    segments: list[FaultSegment],
    ending: Ending,
    schedule_ref: EvidenceRef,
) -> Verdict:
    """Every due fault exactly once, nothing else failed, and the launcher ended as it must."""
    cid = WHOLE_RUN
    n, due = len(schedule), ending.due
    extra = [(k, m) for k, m in run.later_markers if k > due]
    if extra:
        k, m = extra[0]
        why = f"beyond the schedule's {n} faults" if k > n else f"after {ending.why()} stopped"
        return failing(
            cid, f"fault {k} was injected {why} (faults due: {due})", m.ref("time"), schedule_ref
        )
    fired = [line for log in run.cycle_logs for line in log.injector if line.kind == "fired"]
    if len(fired) > len(segments):
        return failing(
            cid,
            f"the injector fired {len(fired)} times for {len(segments)} markers:"
            f" {fired[-1].ref.location}",
            [line.ref for line in fired[:4]],
            schedule_ref,
        )
    if len(segments) < due:
        return failing(
            cid,
            f"{len(segments)} of the {due} faults due happened (schedule"
            f" {render_schedule(schedule)})",
            schedule_ref,
            launcher_outcome(run),
        )
    stray = unexplained_failures(run, segments)
    if stray:
        return failing(
            cid,
            f"a failure no scheduled fault explains: {launcher_words(stray[0].ref)}",
            [e.ref for e in stray[:3]],
            schedule_ref,
        )
    cycles = sorted({r.cycle for r in run.cycles} | {g.cycle for g in run.cycle_logs if g.exists})
    manifest = run.manifest
    exit_code = manifest.exit_code if manifest is not None else None
    stops = run.launcher.of_kind(
        LauncherEventKind.EARLY_TERMINATION,
        LauncherEventKind.NO_RESTART,
        LauncherEventKind.RUN_FAILED,
    )
    timed = timed_out_failure(cid, run, "end as the schedule must")
    if timed is not None:
        return timed
    if ending.stopped:
        return _stopped(run, segments, ending, cycles, stops, schedule_ref)
    if stops:
        what = (
            "a no-progress stop"
            if stops[0].kind is LauncherEventKind.EARLY_TERMINATION
            or "no progress" in stops[0].ref.text
            else "a failed run"
        )
        return failing(
            cid,
            f"the launcher stopped ({what}): {launcher_words(stops[0].ref)}",
            [e.ref for e in stops][:3],
            exit_code.ref if exit_code is not None else None,
        )
    if exit_code is not None and exit_code.value != 0:
        return failing(cid, f"launcher exited with code {exit_code.value}", exit_code.ref)
    if len(cycles) != due + 1:
        return failing(
            cid,
            f"{due} faults need {due + 1} cycles (each fault ends one), but the run had"
            f" {len(cycles)}: {', '.join(map(str, cycles))}",
            [r.ref for r in run.cycles][:4] or schedule_ref,
        )
    finished = run.launcher.of_kind(LauncherEventKind.RUN_OK, LauncherEventKind.GROUP_SUCCEEDED)
    if not finished and exit_code is None:
        return failing(cid, "the launcher recorded no successful finish", launcher_outcome(run))
    # every scheduled fault ended a cycle before the last: a failure the workload logged in the
    # last one is none of them, whatever the launcher saw (a fault cycle's own errors are its
    # fault's: an exception@restore logs one)
    reported = workload_failures(run, cycles[-1])
    if reported:
        return failing(
            cid,
            f"the workload reported a failure in the last cycle ({cycles[-1]}), after every"
            f" scheduled fault: {reported[0].text.strip()}",
            reported[:3],
            schedule_ref,
        )
    return passing(
        cid,
        f"each of the {due} scheduled faults happened exactly once, one per cycle"
        f" ({len(cycles)} cycles); no other failure; the launcher finished successfully",
        [s.marker.ref("time") for s in segments],
        finished[-1].ref if finished else None,
        exit_code.ref if exit_code is not None else None,
    )


def _stopped(
    run: RunEvidence,
    segments: list[FaultSegment],
    ending: Ending,
    cycles: list[int],
    stops: tuple[LauncherEvent, ...],
    schedule_ref: EvidenceRef,
) -> Verdict:
    """A schedule the launcher must stop: after exactly ``due`` cycles, for the right reason,
    with a non-zero exit; its own line quoted where it wrote one."""
    cid = WHOLE_RUN
    manifest = run.manifest
    exit_code = manifest.exit_code if manifest is not None else None
    why = ending.why()
    where = ending.budget[1] if ending.how == "budget" and ending.budget else ending.limit[1]
    if len(cycles) != ending.due:
        return failing(
            cid,
            f"after fault {ending.due} {why} had to stop the job after exactly {ending.due}"
            f" cycles, but the run had {len(cycles)}",
            where or schedule_ref,
            [r.ref for r in run.cycles][-2:],
        )
    if exit_code is None or exit_code.value == 0:
        shown = f" (exit code {exit_code.value})" if exit_code is not None else ""
        return failing(
            cid,
            f"after fault {ending.due} {why} had to stop the job, but the launcher did not"
            f" fail{shown}",
            where or schedule_ref,
            launcher_outcome(run),
        )
    if (ending.how == "no-progress") != (exit_code.value == NO_RESTART_EXIT_CODE):
        wanted = (
            f"{NO_RESTART_EXIT_CODE}, NVRx's exit code for a job it must not restart"
            if ending.how == "no-progress"
            else f"a failure's, not {NO_RESTART_EXIT_CODE} (NVRx's for a job it must not restart)"
        )
        return failing(
            cid,
            f"after fault {ending.due} {why} had to stop the job, so the launcher's exit code is"
            f" {wanted}, but it is {exit_code.value}",
            exit_code.ref,
            where or schedule_ref,
        )
    no_progress = [
        e
        for e in stops
        if e.kind is LauncherEventKind.EARLY_TERMINATION or "no progress" in e.ref.text
    ]
    restarts = run.launcher.of_kind(LauncherEventKind.GROUP_FAILED)
    last = segments[-1].timeline
    after = [e for e in restarts if last.detected is not None and _after(e.ref, last.detected.ref)]
    if after:
        return failing(
            cid,
            f"the launcher decided to restart after fault {ending.due}, where {why} had to"
            f" stop it: {launcher_words(after[0].ref)}",
            after[0].ref,
            where or schedule_ref,
        )
    undurable = _durability_at_stop(run)
    if undurable is not None:
        return undurable
    if ending.how == "no-progress":
        if not no_progress:
            return failing(
                cid,
                f"after fault {ending.due} {why} had to stop the job, but no line of NVRx says"
                " it stopped for no progress",
                where or schedule_ref,
                launcher_outcome(run),
            )
        counted = run.launcher.of_kind(LauncherEventKind.NO_PROGRESS)
        return passing(
            cid,
            f"each of the {ending.due} faults due happened once; NVRx stopped the job after"
            f" {ending.due} cycles, {ending.limit[0]} of them in a row without progress (its"
            f" limit), as it must: {launcher_words(no_progress[0].ref)!r}"
            f" (exit code {exit_code.value})",
            no_progress[0].ref,
            counted[-1].ref if counted else None,
            exit_code.ref,
            [s.marker.ref("time") for s in segments],
        )
    if no_progress:
        return failing(
            cid,
            f"the launcher stopped for no progress, not for {why}:"
            f" {launcher_words(no_progress[0].ref)}",
            no_progress[0].ref,
            where or schedule_ref,
        )
    said = [*stops, *run.launcher.of_kind(LauncherEventKind.AGENT_EXIT)]
    quote = (
        f"its own words: {launcher_words(said[0].ref)!r}"
        if said
        else "it wrote no line of its own saying so (NVRx logs its exit after its log server"
        " closed), so its last restart decision, the last failure and the exit code are quoted"
    )
    last_restart = launcher_words(restarts[-1].ref) if restarts else None
    return passing(
        cid,
        f"each of the {ending.due} faults the budget allows happened once; the launcher gave up"
        f" after exactly {ending.due} cycles ({why}), as it must"
        + (f", its last restart being {last_restart!r}" if last_restart else "")
        + f"; {quote} (exit code {exit_code.value})",
        [e.ref for e in said][:2],
        restarts[-1].ref if restarts else None,
        last.detected.ref if last.detected is not None else None,
        exit_code.ref,
        where,
        [s.marker.ref("time") for s in segments],
    )


def _durability_at_stop(run: RunEvidence) -> Verdict | None:
    """A stopped schedule has no recovery left to judge progress_past_restore by, which is where
    a run's tracker is held to the finalized saves (evidence/durability.py): the whole run's
    verdict holds it here, over every reading and the tracker the stop left."""
    breaks = reading_breaks(run) + unfinalized_breaks(run)
    end = end_of_run_break(run)
    found = breaks[0] if breaks else end
    if found is None:
        return None
    return failing(WHOLE_RUN, f"durability at the stop: {found.text}", list(found.refs))


def _after(ref: EvidenceRef, anchor: EvidenceRef) -> bool:
    """Whether ``ref`` is a later line of the same file than ``anchor``."""
    return (
        ref.file == anchor.file
        and ref.line is not None
        and anchor.line is not None
        and ref.line > anchor.line
    )


_CYCLE_PROGRESS = re.compile(r"Training cycle #(\d+) made (NO )?progress")


def schedule_problems(
    run: RunEvidence, schedule: tuple[ScheduledFault, ...], segments: list[FaultSegment]
) -> tuple[Problem, ...]:
    """Where a schedule's evidence contradicts itself (fatal: the run cannot be judged): a
    marker that names another schedule or position than run.json and its file name, or another
    cycle than the one it fired in; a later marker outside its cycle or with an impossible
    recovery clock; run.json's restart budget against the launcher's own; NVRx's per-cycle
    progress lines against what the faults allow (a cycle struck in its restore cannot have
    advanced the tracker; one ended by a step, save or finalize fault had one complete)."""
    found: list[Problem] = []
    listed = [str(e) for e in schedule]
    positions = [(1, run.marker)] + [(k, m) for k, m in run.later_markers]
    for k, marker in positions:
        if marker is None or not marker.ok:
            continue
        if marker.schedule is None:
            found.append(
                Problem(
                    "fatal",
                    f"{marker.file} records no schedule, but run.json runs the schedule"
                    f" {render_schedule(schedule)}: the marker of a one-fault run",
                    marker.ref("fault"),
                )
            )
            continue
        if list(marker.schedule) != listed:
            found.append(
                Problem(
                    "fatal",
                    f"{marker.ref('schedule').location} records the schedule"
                    f" {','.join(marker.schedule)}, but run.json runs {render_schedule(schedule)}",
                    marker.ref("schedule"),
                )
            )
        if marker.schedule_position != k:
            found.append(
                Problem(
                    "fatal",
                    f"{marker.ref('schedule_position').location} says it is fault"
                    f" {marker.schedule_position}, but its name {marker.file} is fault {k}'s",
                    marker.ref("schedule_position"),
                )
            )
    for segment in segments:
        marker, cycle = segment.marker, segment.timeline.failed_cycle
        if marker.restart_count is not None and cycle is not None and marker.restart_count != cycle:
            found.append(
                Problem(
                    "fatal",
                    f"{marker.ref('restart_count').location} records restart count"
                    f" {marker.restart_count}, but fault {segment.position} fired in cycle"
                    f" {cycle}: a schedule's fault fires in the cycle of its restart count",
                    marker.ref("restart_count"),
                )
            )
        if segment.position == 1:
            continue  # the whole run's clock checks hold the first marker
        found += clocks.marker_outside_its_cycle(segment.view, segment.timeline)
        found += clocks.marker_after_stop(segment.view)
        found += clocks.marker_before_its_rank(segment.view, segment.timeline)
        found += clocks.timing_problems(segment.clock.timings())
    found += _recovery_problems(run, schedule, segments)
    found += _arming_disagrees(run, schedule, segments)
    found += _budget_disagrees(run)
    found += _progress_disagrees(run, schedule, segments)
    return tuple(found)


def _recovery_problems(
    run: RunEvidence, schedule: tuple[ScheduledFault, ...], segments: list[FaultSegment]
) -> list[Problem]:
    """Each fault's recovery as every output measures it (FaultRecovery): a struck restore that
    began after the fault that struck it (its marker before its cycle's workers started), or
    phases longer than the downtime that holds them, is no measurement."""
    ending = run_ending(run, schedule)
    out = []
    for recovery in fault_recoveries(
        segments, (ending.due, ending.why()) if ending.stopped else None
    ):
        restoring = recovery.restoring_s
        if restoring is not None and restoring < 0:
            nxt = segments[recovery.position].marker if recovery.position < len(segments) else None
            out.append(
                Problem(
                    "fatal",
                    f"fault {recovery.position + 1}'s marker"
                    + (f" ({nxt.ref('time').location})" if nxt is not None else "")
                    + f" is {-restoring:.3f} s before the workers of the cycle it struck started:"
                    f" {recovery.label}'s restore would be negative",
                    nxt.ref("time") if nxt is not None else None,
                )
            )
            continue
        downtime = recovery.downtime_s
        if downtime is None:
            continue
        # a struck recovery: its phases up to its workers' start, then its restore until the
        # next fault (what its replacement logged while restoring lies inside that restore)
        counted = _UP_TO_START if restoring is not None else {p.id for p in PHASES}
        known = sum(p.seconds for p in recovery.phases if p.seconds is not None and p.id in counted)
        known += restoring or 0.0
        if known > downtime + _ROUNDING_S:
            out.append(
                Problem(
                    "fatal",
                    f"impossible timing: {recovery.label}'s phases sum to {known:.3f} s, more than"
                    f" its downtime {downtime:.3f} s",
                    recovery.marker.ref("time"),
                )
            )
    return out


_UP_TO_START = frozenset(
    spec.id
    for spec in PHASES[: next(i for i, p in enumerate(PHASES) if p.end == "workers_started") + 1]
)
#: Each phase and downtime is rounded to the millisecond: their sum may exceed it by that much.
_ROUNDING_S = 0.01


def _arming_disagrees(
    run: RunEvidence, schedule: tuple[ScheduledFault, ...], segments: list[FaultSegment]
) -> list[Problem]:
    """The injector's arming lines (``arming fault k of n``) against run.json's schedule and
    the cycle each fault fired in. The injector arms the first fault without a marker, so fault
    k is armed after fault k-1 fired and up to the cycle it fires in: a cycle before that one
    may have armed it too when its workers failed before it fired (a failure no scheduled fault
    explains, which the first cause and no_repeat_injection name); a cycle after it, or one not
    after fault k-1's, cannot."""
    fired_in = {s.position: s.timeline.failed_cycle for s in segments}
    out = []
    for log in run.cycle_logs:
        for line in log.injector:
            if line.kind != "armed" or line.position is None:
                continue
            entry = schedule[line.position - 1] if line.position <= len(schedule) else None
            cycle = fired_in.get(line.position)
            before = fired_in.get(line.position - 1)
            if line.schedule != render_schedule(schedule) or entry is None:
                why = f"run.json runs {render_schedule(schedule)}"
            elif (line.fault, line.window) != (entry.fault, entry.window):
                why = f"run.json's fault {line.position} is {entry}"
            elif cycle is not None and log.cycle > cycle:
                why = f"fault {line.position} fired in cycle {cycle}"
            elif before is not None and log.cycle <= before:
                why = f"fault {line.position - 1} fired in cycle {before}"
            else:
                continue
            out.append(
                Problem(
                    "fatal",
                    f"{line.ref.location}: the injector of cycle {log.cycle} armed fault"
                    f" {line.position} ({line.fault}@{line.window}) of {line.schedule}, but {why}",
                    line.ref,
                )
            )
    return out


def _budget_disagrees(run: RunEvidence) -> list[Problem]:
    """run.json's max_restarts against the launcher's configuration and its restart lines
    (``Worker group FAILED. k/M attempts left``)."""
    manifest = run.manifest
    said = manifest.max_restarts if manifest is not None else None
    if said is None:
        return []
    out = []
    launched = run.launcher.config.get("max_restarts", "")
    if is_ascii_number(launched) and int(launched) != said.value:
        out.append(
            Problem(
                "fatal",
                f"{said.ref.location} says max_restarts {said.value}, but the launcher ran with"
                f" {launched} ({run.launcher.config_refs['max_restarts'].location})",
                said.ref,
            )
        )
    for event in run.launcher.of_kind(LauncherEventKind.GROUP_FAILED):
        m = _ATTEMPTS.search(event.ref.text)
        if m is not None and int(m[2]) != said.value:
            out.append(
                Problem(
                    "fatal",
                    f"{event.ref.location} counts {m[1]}/{m[2]} restart attempts, but"
                    f" {said.ref.location} says max_restarts {said.value}",
                    event.ref,
                )
            )
            break
    return out


_ATTEMPTS = re.compile(r"(\d+)/(\d+) attempts left")


def _progress_disagrees(
    run: RunEvidence, schedule: tuple[ScheduledFault, ...], segments: list[FaultSegment]
) -> list[Problem]:
    """NVRx's verdict on each faulted cycle's progress against the fault that ended it."""
    out = []
    for event in run.launcher.of_kind(LauncherEventKind.PROGRESS, LauncherEventKind.NO_PROGRESS):
        m = _CYCLE_PROGRESS.search(event.ref.text)
        if m is None:
            continue
        cycle, none = int(m[1]), m[2] is not None
        ended = next((s for s in segments if s.timeline.failed_cycle == cycle), None)
        if ended is None:
            continue
        struck_restore = ended.scheduled.window in SCHEDULE_WINDOWS
        if none != struck_restore:
            said = "no progress" if none else "progress"
            why = (
                "a fault struck its restore, before any iteration"
                if struck_restore
                else f"fault {ended.position} ({ended.scheduled}) fired only after a checkpoint"
                " of the cycle completed"
            )
            out.append(
                Problem(
                    "fatal",
                    f"{event.ref.location}: NVRx says cycle {cycle} made {said}, but {why}"
                    f" ({ended.marker.ref('time').location})",
                    event.ref,
                )
            )
    return out
