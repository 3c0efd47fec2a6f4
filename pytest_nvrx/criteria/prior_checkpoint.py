"""Criterion 1: a checkpoint was *completed* (finalized, tracker advanced) before the failure.

The fault time is the marker's: the checkpoint it names must have been finalized by then (the
launcher's later detection only bounds which saves count as before the failure at all). In a
window run (issue #10) the fault must also have landed in its window (criteria/windows.py): the
restore point is the marker's tracker iteration T, the newest checkpoint completed before the
fault, never the save N in flight, which the faulted cycle must not have completed. The marker
must name the rank run.json asked for and say what the injector's own lines say
(criteria/marker_agreement.py: where_problem).
"""

from __future__ import annotations

from pytest_nvrx.criteria.context import JudgeContext
from pytest_nvrx.criteria.expected import ExpectedFault
from pytest_nvrx.criteria.helpers import clock, marker_ref
from pytest_nvrx.criteria.marker_agreement import where_problem
from pytest_nvrx.criteria.verdict import CriterionId, Verdict, failing, not_applicable, passing
from pytest_nvrx.criteria.windows import Fact
from pytest_nvrx.evidence.refs import EvidenceRef, seconds_between, split_rank_prefix
from pytest_nvrx.evidence.rundir import RunEvidence
from pytest_nvrx.evidence.timeline import FINALIZED_BEFORE_FAULT_SLACK
from pytest_nvrx.evidence.workload import SaveCompleted
from pytest_nvrx.layout import INJECTED_FAULTS, SCHEDULE_WINDOWS

ID: CriterionId = "prior_checkpoint"


def prior_checkpoint(run: RunEvidence, expected: ExpectedFault | None = None) -> Verdict:
    """A checkpoint was *completed* (finalized, tracker advanced) before the injected failure."""
    return check(JudgeContext.build(run, expected))


def check(ctx: JudgeContext) -> Verdict:
    run, exp, timeline = ctx.run, ctx.expected, ctx.timeline
    marker = run.marker
    if exp.baseline:
        return not_applicable(
            ID, f"baseline run (fault=none, from {exp.source}) has no fault to precede", exp.ref
        )
    if marker is None:
        asked = (
            "a fault run was expected" if exp.kind == "any" else f"fault {exp.kind} was requested"
        )
        window = ctx.window.window if ctx.window is not None else None
        where = f" in window {window}" if window is not None else ""
        return failing(
            ID,
            f"no injection marker: {asked}{where} ({exp.source}) but it never happened",
            marker_ref(run),
            exp.ref,
            ctx.window.ref if window is not None and ctx.window is not None else None,
            ctx.launcher_outcome,
        )
    if not marker.ok:
        return failing(ID, f"injection marker unusable: {marker.error}", marker.ref())
    if exp.kind in INJECTED_FAULTS and marker.fault != exp.kind:
        return failing(
            ID,
            f"marker records fault {marker.fault!r} but {exp.kind!r} was expected ({exp.source})",
            marker.ref("fault"),
            exp.ref,
        )
    facts = ctx.windows
    if isinstance(facts, Fact):
        return failing(ID, facts.text, facts.refs)
    if facts is not None and facts.problem is not None:
        return failing(ID, f"window {facts.window}: {facts.problem.text}", facts.problem.refs)
    disagreement = where_problem(ctx)
    if disagreement is not None:
        return failing(ID, disagreement.text, disagreement.refs)
    tracked = marker.tracker_iteration
    if tracked is None:
        return failing(ID, "marker records no tracker_iteration", marker.ref())
    base = marker.baseline_iteration or 0
    if marker.window in SCHEDULE_WINDOWS:
        # a schedule's fault in a replacement's load (issue #26): the checkpoint it struck the
        # load of is the prior one; it was completed in an earlier cycle, not above this one's
        # start-up tracker
        if marker.load_iteration != tracked or tracked == 0:
            return failing(
                ID,
                f"the marker says the replacement was loading checkpoint {marker.load_iteration}"
                f" while the tracker named {tracked}: not the newest completed checkpoint",
                marker.ref("load_iteration"),
                marker.ref("tracker_iteration"),
            )
    elif tracked <= base:
        return failing(
            ID,
            f"marker records tracker iteration {tracked} (baseline {base}): the fault came before"
            " any checkpoint completed",
            marker.ref("tracker_iteration"),
            marker.ref("baseline_iteration"),
        )
    completed = [e for e in ctx.completed_before_failure if e.iteration == tracked]
    if not completed:
        later = [
            e
            for log in run.cycle_logs
            for e in log.of_type(SaveCompleted)
            if e.iteration == tracked and e not in completed
        ]
        scheduled = [e for e in ctx.scheduled_before_failure if e.iteration == tracked]
        if later:
            reason = (
                f"checkpoint {tracked} was finalized only at {clock(later[0].time)}, after the"
                f" failure ({clock(timeline.save_bound)})"
            )
            proof: list[EvidenceRef] = [later[0].ref]
        elif scheduled:
            reason = (
                f"the save of iteration {tracked} was only scheduled before the failure, never"
                " finalized ('successfully saved' missing)"
            )
            proof = [scheduled[0].ref]
        else:
            reason = f"no completed save of iteration {tracked} in the logs before the failure"
            proof = [e.ref for e in ctx.completed_before_failure[-1:]]
        return failing(ID, reason, marker.ref("tracker_iteration"), proof, marker.ref("time"))
    # the earliest line that reports it finalized (each rank may print one)
    save = completed[0]
    for other in completed[1:]:
        if other.time is not None and (save.time is None or other.time < save.time):
            save = other
    signal = f" ({marker.signal})" if marker.signal else ""
    if (
        save.time is not None
        and marker.time is not None
        and save.time > marker.time + FINALIZED_BEFORE_FAULT_SLACK
    ):
        # the marker says the fault followed this checkpoint; its own time says otherwise
        return failing(
            ID,
            f"checkpoint iteration {tracked} was finalized at {clock(save.time)},"
            f" {seconds_between(marker.time, save.time):.3f} s after the {marker.fault}{signal} of"
            f" rank {marker.rank} at {clock(marker.time)}: the marker names a checkpoint that"
            " had not completed when it says the fault came",
            marker.ref("time"),
            save.ref,
            marker.ref("tracker_iteration"),
        )
    window_text = ""
    window_refs: tuple[EvidenceRef | None, ...] = ()
    target = ctx.restore_target
    if facts is not None:
        window_text = (
            f"; in window {facts.window} (from {facts.source}): {facts.proof.text}; restore point"
            f" {target.iteration if target.iteration is not None else tracked}"
            + (f", never the in-flight {facts.in_flight}" if facts.in_flight is not None else "")
        )
        window_refs = facts.proof.refs
    if target.save is not None and target.iteration is not None and target.iteration > tracked:
        # a rank that lived on finalized a save written before the fault, before the detection
        window_text += (
            f"; checkpoint {target.iteration} was finalized at {clock(target.save.time)}, after"
            f" the {marker.fault} and before the failure was detected"
            f" ({_finalizer(target.save.ref, marker.rank)}): the newest completed checkpoint at"
            " the failure"
        )
        window_refs = (*window_refs, target.save.ref)
    return passing(
        ID,
        f"checkpoint iteration {tracked} was finalized at {clock(save.time)}, before the"
        f" {marker.fault}{signal} of rank {marker.rank} at {clock(marker.time)}{window_text}",
        marker.ref("tracker_iteration"),
        save.ref,
        marker.ref("time"),
        window_refs,
    )


def _finalizer(ref: EvidenceRef, faulted: int | None) -> str:
    """Who printed a finalization line: the faulted rank itself, or another that lived on."""
    rank = split_rank_prefix(ref.text)[0]
    if rank is not None and rank == faulted:
        return f"rank {rank}, the faulted rank, ran on after its fault"
    return f"by rank {rank}, which lived on" if rank is not None else "by a rank that lived on"
