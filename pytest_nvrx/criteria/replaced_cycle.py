"""Criterion 2: the launcher recorded the failed cycle (for the injected rank) and started a
replacement cycle whose workers ran.

How the injected rank must have failed depends on the fault: a signal fault's exit code is minus
the marker's signal number; ``hang`` is a section timeout of the rank (in a schema-2 marker's
run, of the section the marker says was open); ``exception`` exits 1 with the ``InjectedFault``
traceback of that rank in the faulted cycle's log; ``ckpt-worker`` killed the rank's checkpoint
worker (the marker's ``pid``), so the rank (``rank_pid``) must fail by itself: any non-zero exit
or a section timeout. Whatever the fault, the launcher's record of the rank's failure, the pid
the injector's fire line signalled and the pid that wrote it name the marker's processes
(criteria/process_story.py: process_problem).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from pytest_nvrx.criteria.context import JudgeContext
from pytest_nvrx.criteria.expected import ExpectedFault
from pytest_nvrx.criteria.helpers import (
    EXCEPTION_EXIT_CODE,
    clock,
    marker_ref,
    nproc_per_node,
    on_faulted_node,
    rank_of,
)
from pytest_nvrx.criteria.peer_named import peer_failed_first, peer_named_first
from pytest_nvrx.criteria.process_story import process_problem
from pytest_nvrx.criteria.verdict import CriterionId, Verdict, failing, not_applicable, passing
from pytest_nvrx.evidence.launcher_log import LauncherEvent, LauncherEventKind
from pytest_nvrx.evidence.refs import EvidenceRef, absent, is_ascii_number
from pytest_nvrx.evidence.rundir import RunEvidence
from pytest_nvrx.evidence.timeline import CLOCK_SLACK
from pytest_nvrx.evidence.workload import LoadFailed, WorkloadError

ID: CriterionId = "replaced_cycle"

# The exit code a worker killed by the marker's signal reports is minus its number.
_SIGNAL_NUMBERS = {"SIGKILL": 9, "SIGTERM": 15, "SIGSTOP": 19, "SIGABRT": 6, "SIGSEGV": 11}


def replaced_cycle(run: RunEvidence, expected: ExpectedFault | None = None) -> Verdict:
    """The launcher recorded the failed cycle (for the injected rank) and started a replacement."""
    return check(JudgeContext.build(run, expected))


def _expected_local_rank(run: RunEvidence) -> int | None:
    """The marker rank as the launcher logs it (torchelastic and rank monitors use local ranks)."""
    marker = run.marker
    if marker is None or marker.rank is None:
        return None
    if marker.local_rank is not None:
        return marker.local_rank
    nproc = nproc_per_node(run)
    return marker.rank % nproc if nproc else marker.rank


def _rank_contradiction(ctx: JudgeContext) -> Verdict | None:
    """A marker whose rank and local_rank cannot both be true (every node runs the same number of
    ranks: rank = node * nproc_per_node + local_rank), quoted with the failure the launcher saw."""
    marker = ctx.run.marker
    nproc = nproc_per_node(ctx.run)
    if marker is None or marker.rank is None or marker.local_rank is None or not nproc:
        return None
    if marker.rank % nproc == marker.local_rank:
        return None
    seen = [
        e for e in ctx.timeline.failure_events if e.kind is LauncherEventKind.WORKER_FAILED
    ] or list(ctx.timeline.failure_events)
    launcher = (
        f"; the launcher recorded the failure of local_rank {seen[0].rank} (pid {seen[0].pid})"
        if seen and seen[0].rank is not None
        else ""
    )
    return failing(
        ID,
        f"the marker claims rank {marker.rank} with local_rank {marker.local_rank}, but with"
        f" {nproc} rank(s) per node rank {marker.rank} is local rank {marker.rank % nproc}:"
        f" the marker contradicts itself{launcher}",
        marker.ref("rank"),
        marker.ref("local_rank"),
        seen[0].ref if seen else None,
    )


def _world_size(run: RunEvidence) -> tuple[int | None, list[EvidenceRef]]:
    """Ranks the launcher ran: nproc_per_node x max_nodes from its launch configs."""
    launcher = run.launcher
    nproc = launcher.nproc_per_node
    nodes = launcher.config.get("max_nodes", "")
    if nproc is None or not is_ascii_number(nodes):
        return None, []
    refs = [
        launcher.config_refs[k]
        for k in ("nproc_per_node", "max_nodes")
        if k in launcher.config_refs
    ]
    return nproc * int(nodes), refs


@dataclass(frozen=True, slots=True)
class _FaultedRank:
    """The rank the marker names, as the launcher knows it on the faulted node: its local rank
    and pid, how verdicts name it, and the node's worker-failure and timeout records."""

    local: int | None
    pid: int | None
    text: str
    failed: list[LauncherEvent]
    timeouts: list[LauncherEvent]

    def matches(self, e: LauncherEvent) -> bool:
        """Could this record be the rank's own (same pid where both are known, same local rank)?"""
        if self.pid is not None and e.pid is not None and e.pid != self.pid:
            return False
        return self.local is None or e.rank is None or e.rank == self.local


def death_problem(ctx: JudgeContext) -> Verdict | None:
    """The failing verdict where the launcher's records, the marker and the rank's own lines
    disagree on which process died of the fault, or None: what a fault after which the job was
    rightly stopped (no replacement due) must still show."""
    death = _death(ctx)
    return death if isinstance(death, Verdict) else None


def _death(ctx: JudgeContext) -> tuple[str, str, list[EvidenceRef]] | Verdict:
    """The faulted rank as verdicts name it, how it failed and the proof, or the failing
    verdict where the records do not show it died of the fault."""
    run, timeline = ctx.run, ctx.timeline
    marker = run.marker
    if marker is None or not marker.ok:
        return failing(
            ID,
            "no usable injection marker: no injected failure to correlate with the launcher's"
            " records",
            marker_ref(run),
            [e.ref for e in run.launcher.events if e.kind is LauncherEventKind.WORKER_FAILED][:3],
        )
    if not run.cycle_infos.exists:
        return failing(
            ID,
            f"{run.cycle_infos.dir}/ is missing: the launcher recorded no cycles",
            absent(run.cycle_infos.dir),
        )
    if not timeline.failure_events:
        return failing(
            ID,
            "the launcher recorded no worker failure at or after the fault"
            f" ({clock(timeline.fault_time)})",
            marker.ref("time"),
            ctx.launcher_outcome,
        )
    world, world_refs = _world_size(run)
    if world is not None and marker.rank is not None and marker.rank >= world:
        return failing(
            ID,
            f"the marker claims rank {marker.rank}, but the launcher ran a world of {world}"
            " rank(s)",
            marker.ref("rank"),
            world_refs,
        )
    contradiction = _rank_contradiction(ctx)
    if contradiction is not None:
        return contradiction
    local = _expected_local_rank(run)
    rank_text = f"rank {marker.rank}" + (f" (local {local})" if local != marker.rank else "")
    # on several nodes local ranks repeat: only the faulted rank's node's records are its own
    on_node = on_faulted_node(run, timeline.failure_events)
    failed = [e for e in on_node if e.kind is LauncherEventKind.WORKER_FAILED]
    timeouts = [
        e
        for e in on_node
        if e.kind in (LauncherEventKind.SECTION_TIMEOUT, LauncherEventKind.HEARTBEAT_TIMEOUT)
    ]

    rank_pid = marker.rank_process
    faulted = _FaultedRank(local, rank_pid, rank_text, failed, timeouts)
    matches = faulted.matches

    proof: list[EvidenceRef] = []
    if ctx.observed_fault == "hang":
        matching = [e for e in timeouts if e.rank == local or (e.rank is None and local is None)]
        if not matching:
            if timeouts:
                reason = (
                    f"the section-timeout message names local rank {timeouts[0].rank}, but the"
                    f" marker claims {rank_text}"
                )
            else:
                reason = f"no section-timeout message for {rank_text}: the hang was not detected"
            return failing(ID, reason, [e.ref for e in timeouts[:2]], marker.ref("rank"))
        wrong_section = _section_mismatch(ctx, matching[0], rank_text)
        if wrong_section is not None:
            return wrong_section
        proof.append(matching[0].ref)
        how = f"timed out in section {matching[0].name!r}"
        proof += [e.ref for e in failed if matches(e)][:1]
    elif ctx.observed_fault in ("ckpt-worker", "exception"):
        # neither kills the rank with a signal of its own: each has its own reading of its end
        read = _rank_of_worker_failed if ctx.observed_fault == "ckpt-worker" else _exception_failure
        found = read(ctx, faulted)
        if isinstance(found, Verdict):
            return found
        how, refs = found
        proof += refs
    else:
        matching = [e for e in failed if matches(e)]
        peer = peer_named_first(ctx, local, failed) if not matching else None
        if isinstance(peer, tuple):
            how, refs = peer
            proof += refs
        elif not matching:
            if failed:
                e = failed[0]
                reason = (
                    f"the launcher recorded the failure of local_rank {e.rank} (pid {e.pid}), but"
                    f" the marker claims {rank_text} (pid {rank_pid})"
                )
                if peer is not None:
                    reason += f"; not a peer named for two deaths in one poll: {peer}"
                return failing(ID, reason, e.ref, marker.ref("rank"), marker.ref("pid"))
            return failing(
                ID,
                f"no worker-failure record for {rank_text}"
                f" (only: {timeline.failure_events[0].kind})",
                timeline.failure_events[0].ref,
                marker.ref("rank"),
            )
        else:
            hit = matching[0]
            signum = _SIGNAL_NUMBERS.get(marker.signal or "")
            if signum is not None and hit.exit_code is not None and hit.exit_code != -signum:
                return failing(
                    ID,
                    f"{rank_text} failed with exit code {hit.exit_code}, not the {-signum} that"
                    f" {marker.signal} gives: it did not die of the injected fault",
                    hit.ref,
                    marker.ref("signal"),
                )
            proof.append(hit.ref)
            how = f"failed with exit code {hit.exit_code}"
    disagreement = process_problem(ctx, local)
    if disagreement is not None:
        return failing(ID, disagreement.text, disagreement.refs, proof)
    return rank_text, how, proof


def check(ctx: JudgeContext) -> Verdict:
    run, timeline = ctx.run, ctx.timeline
    if ctx.expected.baseline:
        first = run.cycles[0].ref if run.cycles else None
        return not_applicable(
            ID,
            "baseline run has no failed cycle to replace (no-failure is judged by"
            " no_repeat_injection)",
            ctx.expected.ref,
            first,
        )
    death = _death(ctx)
    if isinstance(death, Verdict):
        return death
    rank_text, how, proof = death
    if timeline.detected is not None and timeline.detected.ref not in proof:
        proof.append(timeline.detected.ref)
    if timeline.restart_decision is None:
        return failing(
            ID,
            "the launcher recorded the failure but no decision to restart the worker group",
            proof,
            ctx.launcher_outcome,
        )
    proof.append(timeline.restart_decision.ref)
    cycles = ", ".join(str(r.cycle) for r in run.cycles) or "none"
    replacement = (
        run.cycle_infos.by_cycle(timeline.replacement_cycle)
        if timeline.replacement_cycle is not None
        else None
    )
    if replacement is None or (
        replacement.start is not None
        and timeline.fault_time is not None
        and replacement.start < timeline.fault_time
    ):
        return failing(
            ID,
            f"no replacement cycle record after the failure of cycle {timeline.failed_cycle}"
            f" ({run.cycle_infos.dir}/ has cycles: {cycles})",
            proof,
            [r.ref for r in run.cycles],
        )
    # the replacement's record is for timeline.replacement_cycle: its log is the context's
    log = ctx.replacement_log
    if log is None or not log.exists or log.line_count == 0 or log.first_line is None:
        name = log.file if log is not None else f"cycle {replacement.cycle} log"
        return failing(
            ID,
            f"replacement cycle {replacement.cycle} has no application log ({name} missing or"
            " empty): no replacement worker ran",
            replacement.ref,
            absent(name, "missing or empty"),
        )
    started = timeline.replacement_started
    return passing(
        ID,
        f"launcher recorded {rank_text} {how} in cycle {timeline.failed_cycle} and started"
        f" replacement cycle {replacement.cycle} at"
        f" {clock(started.time if started else replacement.start)}",
        proof,
        replacement.ref,
        started.ref if started else None,
        log.first_line,
    )


# The exception the injector raises for the ``exception`` fault (its last traceback line).
INJECTED_EXCEPTION = "InjectedFault"


def _exception_failure(
    ctx: JudgeContext, faulted: _FaultedRank
) -> tuple[str, list[EvidenceRef]] | Verdict:
    """An ``exception`` fault: the faulted cycle's log holds the rank's InjectedFault traceback,
    and the launcher recorded that rank's failure: its exit 1 (the status of an uncaught
    exception), or, when the rank was still shutting down, its rank monitor's timeout of the
    section the marker says was open (the rank raised inside it). Any other exit status of the
    rank is no death by the injected exception."""
    marker = ctx.run.marker
    assert marker is not None
    cycle = ctx.timeline.failed_cycle
    log = ctx.run.cycle_log(cycle) if cycle is not None else None
    errors = log.of_type(WorkloadError) if log is not None else ()
    raised = [
        e
        for e in errors
        if e.exception is not None and e.exception.split(":", 1)[0].endswith(INJECTED_EXCEPTION)
    ]
    # in the raising rank's own stream
    mine: list[WorkloadError | LoadFailed] = [
        e
        for e in raised
        if f"on rank {marker.rank} " in (e.exception or "") and rank_of(e.ref) == marker.rank
    ]
    if not mine and log is not None:
        # a workload that catches what its checkpoint load raises reports the injected
        # exception as its own load failure (the reference workload, in window restore)
        quoted = f"{INJECTED_EXCEPTION}('pytest-nvrx injected exception on rank {marker.rank} "
        mine = [e for e in log.of_type(LoadFailed) if quoted in e.ref.text]
    exited = [e for e in faulted.failed if faulted.matches(e)]
    if not mine:
        name = log.file if log is not None else f"cycle {cycle} log"
        other = f" (only for another rank: {raised[0].exception})" if raised else ""
        return failing(
            ID,
            f"{name} holds no {INJECTED_EXCEPTION} traceback of {faulted.text}{other}: the injected"
            " exception was not raised, or not left uncaught",
            raised[0].ref if raised else (log.last_line if log is not None else None),
            [e.ref for e in exited[:1]],
            marker.ref("fault"),
        )
    traceback = mine[0]
    if exited and exited[0].exit_code == EXCEPTION_EXIT_CODE:
        return (
            f"exited {EXCEPTION_EXIT_CODE} of the injected exception",
            [exited[0].ref, traceback.ref],
        )
    wanted = marker.section or "out_of_section"
    timed_out = [
        e for e in faulted.timeouts if e.rank == faulted.local and e.name in (None, wanted)
    ]
    if timed_out:
        t = timed_out[0]
        late = _after_it_raised(t.time, marker.time, ",")
        return (
            f"raised the injected exception and was still shutting down{late} when its rank"
            f" monitor timed it out in section {t.name or wanted!r} (the uncaught exception did"
            " not end the process in time)",
            [traceback.ref, t.ref, *[e.ref for e in exited[:1]]],
        )
    first = ctx.timeline.failure_events[0]
    if first.rank != faulted.local and first.kind in (
        LauncherEventKind.SECTION_TIMEOUT,
        LauncherEventKind.HEARTBEAT_TIMEOUT,
    ):
        # A peer's monitor acted first (the peer waits for the raising rank in a collective):
        # the raising rank had not exited by then, or its exit would be the first record.
        late = _after_it_raised(first.time, marker.time)
        return (
            f"raised the injected exception and had not exited{late}, when the rank monitor of"
            f" local rank {first.rank} timed out section {first.name!r} (its peer waited for it;"
            " the uncaught exception did not end the process in time)",
            [traceback.ref, first.ref, *[e.ref for e in exited[:1]]],
        )
    if exited:
        return failing(
            ID,
            f"{faulted.text} failed with exit code {exited[0].exit_code}, not the"
            f" {EXCEPTION_EXIT_CODE} of an uncaught exception, and no timeout of section"
            f" {wanted!r} of that rank was recorded: it did not fail of the injected exception",
            exited[0].ref,
            traceback.ref,
            marker.ref("fault"),
        )
    others = [e for e in faulted.failed if e.exit_code not in (None, 0)]
    peer = next((e for e in others if e is ctx.timeline.failure_events[0]), None)
    refusal = peer_failed_first(ctx, faulted.local, peer) if peer is not None else None
    if peer is not None and refusal is not None:
        return failing(
            ID,
            f"{faulted.text} raised the injected exception, but the launcher's first record,"
            f" the failure of local_rank {peer.rank} (pid {peer.pid}), is not its peer failing"
            f" with it: {refusal}",
            peer.ref,
            traceback.ref,
            marker.ref("rank"),
        )
    if peer is not None and _after_the_fault(peer.time, marker.time):
        # The raising rank unwinds (its atexit handlers, its process group's teardown) while a
        # peer's collective fails at once: torchelastic records the first exit it sees, the
        # peer's, after the fault; the rank's own traceback above says what it died of.
        late = _after_it_raised(peer.time, marker.time)
        return (
            f"raised the injected exception; the launcher recorded local_rank {peer.rank}'s exit"
            f" {peer.exit_code} first{late} (its peer failed with it, and torchelastic records the"
            " first exit it sees)",
            [traceback.ref, peer.ref],
        )
    return failing(
        ID,
        f"{faulted.text} raised the injected exception, but the launcher recorded neither its exit"
        f" nor a timeout of its section {wanted!r}"
        + (f" (only the failure of local_rank {others[0].rank})" if others else ""),
        traceback.ref,
        [e.ref for e in others[:1]],
        marker.ref("rank"),
    )


def _after_the_fault(when: datetime | None, fault: datetime | None) -> bool:
    """Whether a launcher record lies at or after the fault (the clocks' slack allowed)."""
    return when is not None and fault is not None and when >= fault - CLOCK_SLACK


def _after_it_raised(when: datetime | None, raised: datetime | None, then: str = "") -> str:
    """ " N.N s after it raised" (with ``then`` after it), or "" where a time is unknown."""
    if when is None or raised is None:
        return ""
    return f" {(when - raised).total_seconds():.1f} s after it raised{then}"


def _rank_of_worker_failed(
    ctx: JudgeContext, faulted: _FaultedRank
) -> tuple[str, list[EvidenceRef]] | Verdict:
    """A ``ckpt-worker`` fault kills the rank's checkpoint worker (the marker's ``pid``), which no
    launcher record names: the rank itself (``rank_pid``) must fail by itself in the faulted
    cycle, by any non-zero exit or a section timeout the rank monitor acts on."""
    marker = ctx.run.marker
    assert marker is not None
    mine = [e for e in faulted.timeouts if e.rank == faulted.local]
    exited = [e for e in faulted.failed if faulted.matches(e) and e.exit_code not in (None, 0)]
    if mine:
        return (
            f"timed out in section {mine[0].name!r} after its checkpoint worker (pid"
            f" {marker.pid}) was killed",
            [mine[0].ref, *[e.ref for e in exited[:1]]],
        )
    if exited:
        return (
            f"failed with exit code {exited[0].exit_code} after its checkpoint worker (pid"
            f" {marker.pid}) was killed",
            [exited[0].ref],
        )
    records = [e for e in faulted.failed if e.exit_code not in (None, 0)]
    return failing(
        ID,
        f"the checkpoint worker (pid {marker.pid}) of {faulted.text} (pid {marker.rank_process})"
        " was killed, but the launcher recorded no failure or section timeout of that rank"
        + (f" (only of local_rank {records[0].rank})" if records else ""),
        [e.ref for e in records[:1]],
        marker.ref("rank_pid"),
        marker.ref("pid"),
    )


def _section_mismatch(ctx: JudgeContext, timeout: LauncherEvent, rank_text: str) -> Verdict | None:
    """A schema-2 hang: the rank monitor timed out the section the marker says was open at the
    fault (``out_of_section`` when none was)."""
    marker = ctx.run.marker
    if marker is None or marker.window is None or marker.schema_version < 2:
        return None
    wanted = marker.section or "out_of_section"
    if timeout.name is None or timeout.name == wanted:
        return None
    return failing(
        ID,
        f"{rank_text} timed out in section {timeout.name!r}, but the marker says"
        f" {'section ' + repr(marker.section) if marker.section else 'no section'} was open when"
        " it hung",
        timeout.ref,
        marker.ref("section"),
    )
