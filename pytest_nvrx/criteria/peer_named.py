"""A kill or segv whose launcher record names a peer of the faulted rank's node in its place.

torch elastic logs one failure a poll, the earliest by a stamp in whole seconds (a rank killed
by a signal has no error file and gets the poll's time), so when the faulted rank and the peer
whose collective broke on its death both die before one poll, the lowest local rank is named
(tests/data/windows/cpu-tie: three real such runs). That record stands for the faulted rank's
death only when every piece of the run agrees with two deaths in one poll; otherwise it
contradicts the marker, and replaced_cycle says which piece disagreed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_nvrx.criteria.context import JudgeContext
from pytest_nvrx.criteria.helpers import (
    EXCEPTION_EXIT_CODE,
    SELF_FATAL,
    nproc_per_node,
    rank_lines,
    rank_of,
    same_host,
)
from pytest_nvrx.evidence.cycle_log import CycleLog
from pytest_nvrx.evidence.launcher_log import LauncherEvent, LauncherEventKind
from pytest_nvrx.evidence.marker import Marker
from pytest_nvrx.evidence.refs import EvidenceRef, split_rank_prefix
from pytest_nvrx.evidence.tracebacks import split_tag
from pytest_nvrx.evidence.workload import LoadFailed, ProcessExited, ProcessStarted, WorkloadError

# What a gloo collective raises on a rank whose peer's process is gone: the socket closed (EOF
# on read) or reset (ECONNRESET), which of the two depending on whether unread bytes were in
# flight when the kernel closed the dead peer's socket. gloo's transport names its source file
# in brackets; the traceback's innermost frame is torch's collective (distributed_c10d.py).
PEER_GONE = re.compile(
    r"RuntimeError(?:: |\(')\[[^\]\s]*gloo/transport/tcp/pair\.cc:\d+\] (?:Read error"
    r" \[[^\]\s]*\]:\d+: Connection reset by peer|Connection closed by peer \[[^\]\s]*\]:\d+)"
)
# A load failure names what the load raised after the path it could not read, as its repr
# ("load failed: cannot read PATH: RuntimeError('[.../pair.cc:561] Connection closed ...").
_RAISED = ": RuntimeError('"
_COLLECTIVES = "torch/distributed/distributed_c10d.py"
# The workload's own word before it re-raises (the reference workload's ``aborted <exception>``).
_ABORTED = " aborted "


@dataclass(frozen=True, slots=True)
class _Tie:
    """The record naming another local rank of the faulted node, that rank (local and global),
    the faulted rank's pids (its own, its checkpoint worker's) and the faulted cycle's log."""

    named: LauncherEvent
    local: int
    rank: int
    faulted: int
    ours: frozenset[int]
    marker: Marker
    log: CycleLog


def peer_named_first(
    ctx: JudgeContext, faulted_local: int | None, failed: Sequence[LauncherEvent]
) -> tuple[str, list[EvidenceRef]] | str | None:
    """The faulted rank's death, told as replaced_cycle tells a rank's failure, with its proof,
    where ``failed`` (the node's worker-failure records after the fault) names a peer in its
    place and all agrees; the reason where the first record names another local rank but not all
    agrees; None where it names none (the rank's own record is wanted)."""
    run = ctx.run
    marker = run.marker
    nproc = nproc_per_node(run)
    if not failed or ctx.observed_fault not in SELF_FATAL or marker is None or marker.rank is None:
        return None
    named = failed[0]
    if faulted_local is None or named.rank is None or named.rank == faulted_local:
        return None
    if not nproc or not 0 <= named.rank < nproc:
        return f"local_rank {named.rank} is no rank of a node of {nproc} rank(s)"
    log = _faulted_log(ctx)
    if log is None:
        return "the faulted cycle has no log"
    ours = _pids_of(marker)
    peer = marker.rank - faulted_local + named.rank
    tie = _Tie(named, named.rank, peer, marker.rank, ours, marker, log)
    refusal = _launcher_refusal(ctx, tie) or _process_refusal(tie)
    if refusal is not None:
        return refusal
    return _broken_collective(ctx, tie)


def _launcher_refusal(ctx: JudgeContext, tie: _Tie) -> str | None:
    """What the launcher's records say against the tie: the record's time and exit, a pid of the
    faulted rank, a closing signal to either process."""
    named, fault_time = tie.named, ctx.timeline.fault_time
    if fault_time is None or named.time is None or named.time < fault_time:
        return "that record is not after the fault"
    if named.exit_code != EXCEPTION_EXIT_CODE:
        return (
            f"its exit code {named.exit_code} is not the {EXCEPTION_EXIT_CODE} of a rank whose"
            " collective broke (an uncaught exception)"
        )
    if named.pid is None or named.pid in tie.ours:
        return f"its pid {named.pid} is not another process than the faulted rank's"
    # (a second record before the workers restart: process_story.process_problem, for all)
    closing = _closing_signals(ctx, tie.ours | {named.pid}, named)
    if closing:
        return (
            f"the launcher sent a closing signal to pid {closing[0].pid}"
            f" ({closing[0].ref.location}): it signals only workers still running"
        )
    return None


def _process_refusal(tie: _Tie) -> str | None:
    """Where the pids the two ranks printed in the faulted cycle are not the marker's and the
    record's."""
    return _pid_refusal(tie.log, tie.faulted, tie.ours, "the marker's") or _pid_refusal(
        tie.log, tie.rank, frozenset({tie.named.pid}), "the launcher's record's"
    )


def _pid_refusal(log: CycleLog, rank: int, pids: frozenset[int | None], whose: str) -> str | None:
    """Where ``rank`` did not print, in ``log``, one start line (where the workload prints one)
    and injector lines naming only ``pids``: every rank runs under the injector, which prints
    its pid."""
    started = [e for e in log.of_type(ProcessStarted) if rank_of(e.ref) == rank]
    if len(started) > 1:
        return f"rank {rank} printed {len(started)} start lines in {log.file}, not one"
    printed = [(e.pid, e.ref) for e in started if e.pid is not None]
    printed += [(line.pid, line.ref) for line in log.injector if line.rank == rank]
    if not printed:
        return f"rank {rank} printed no pid in {log.file}"
    for pid, ref in printed:
        if pid not in pids:
            return f"rank {rank} printed pid {pid} ({ref.location}), not {whose}"
    return None


def peer_failed_first(
    ctx: JudgeContext, faulted_local: int | None, peer: LauncherEvent
) -> str | None:
    """Why the launcher's first record, a peer's exit after an ``exception`` fault, is not that
    peer failing with the raising rank (which still unwinds: its atexit handlers, its process
    group's teardown, while the peer's collective fails at once), or None where all agrees: the
    peer is another local rank of the node that exited 1 (an uncaught exception), with the pid
    it printed in the faulted cycle, after printing an error of its own there after the fire
    line, and the launcher sent it no closing signal."""
    run = ctx.run
    marker = run.marker
    nproc = nproc_per_node(run)
    if marker is None or marker.rank is None or faulted_local is None or peer.rank is None:
        return "the record names no rank"
    if peer.rank == faulted_local or not nproc or not 0 <= peer.rank < nproc:
        return f"local_rank {peer.rank} is no peer on a node of {nproc} rank(s)"
    if peer.exit_code != EXCEPTION_EXIT_CODE:
        return f"its exit code {peer.exit_code} is not the {EXCEPTION_EXIT_CODE} of a failed peer"
    if peer.pid is None or peer.pid in _pids_of(marker):
        return f"its pid {peer.pid} is not another process than the faulted rank's"
    log = _faulted_log(ctx)
    if log is None:
        return "the faulted cycle has no log"
    rank = marker.rank - faulted_local + peer.rank
    refusal = _pid_refusal(log, rank, frozenset({peer.pid}), "the launcher's record's")
    if refusal is not None:
        return refusal
    after = _fire_line_no(log, marker.rank)
    if after is None:
        return f"{log.file} holds no fire line of rank {marker.rank}"
    proof = peer_gone(ctx, log, rank, after, peer)
    if isinstance(proof, str):
        return proof
    closing = _closing_signals(ctx, frozenset({peer.pid}), peer)
    if closing:
        return (
            f"the launcher sent a closing signal to pid {peer.pid} ({closing[0].ref.location}):"
            " it was still running"
        )
    return None


def _broken_collective(ctx: JudgeContext, tie: _Tie) -> tuple[str, list[EvidenceRef]] | str:
    """The faulted cycle's lines that show the named rank died of its vanished peer: after the
    faulted rank's fire line it printed nothing more, and the named rank printed only its
    collective broken by the vanished peer (each of its errors gloo's, in its own stream, stamped
    between the fault and the record), then nothing but that traceback; else why not."""
    marker, log, named = tie.marker, tie.log, tie.named
    after = _fire_line_no(log, tie.faulted)
    if after is None:
        return f"{log.file} holds no fire line of rank {tie.faulted}"
    # (an unstamped traceback under its prefix without torch's ``[rankN]:`` tag of the rank's
    # own process may be a process it started, such as an async checkpoint worker, printing
    # after it died: gpu-faults/g2-segv-30:1072)
    unstamped = {
        e.ref
        for e in log.of_type(WorkloadError)
        if e.time is None and not split_tag(split_rank_prefix(e.ref.text)[1])[0]
    }
    late = [r for r in rank_lines(log, tie.faulted) if (r.line or 0) > after and r not in unstamped]
    if late:
        return f"rank {tie.faulted} printed after its fire line ({late[0].location})"
    proof = peer_gone(ctx, log, tie.rank, after, named)
    if isinstance(proof, str):
        return proof
    broken = proof
    return (
        f"failed, named as local_rank {tie.local} (exit {named.exit_code}) in its place: it"
        f" died of its own {marker.signal} (the marker, written before it) and local_rank"
        f" {tie.local}'s collective broke when its peer vanished ({broken.location});"
        " torch elastic names the lowest local rank when two deaths land in one poll",
        [marker.ref("signal"), named.ref, broken],
    )


def peer_gone(
    ctx: JudgeContext, log: CycleLog, rank: int, after: int, record: LauncherEvent
) -> EvidenceRef | str:
    """The line where ``rank`` says its collective broke because its peer's process was gone,
    or why its lines in ``log`` after the fire line (line ``after``) do not say that it failed
    of that and of nothing else: each error it printed there is gloo's broken connection (a
    traceback, its own ``aborted`` word or a load it could not finish; in its own stream, a
    traceback's innermost frame torch's collective) or its exit line with the record's exit
    code; it never exits cleanly nor goes on after its first error; its stamped errors (at least
    one) lie between the fault and the launcher's ``record``."""
    fault_time = ctx.timeline.fault_time
    mine = rank_lines(log, rank)
    lines = [r for r in mine if (r.line or 0) > after]
    errors = {e.ref: e for e in log.of_type(WorkloadError)}
    loads = {e.ref for e in log.of_type(LoadFailed)}
    before = [r for r in mine if (r.line or 0) <= after and (r in errors or r in loads)]
    if before:
        return f"rank {rank} failed before the fault ({before[0].location})"
    broken: EvidenceRef | None = None
    exit_line: EvidenceRef | None = None
    stamped = 0
    for ref in lines:
        if exit_line is not None:
            return f"rank {rank} went on after its exit line ({exit_line.location})"
        error = errors.get(ref)
        if error is None and ref not in loads:
            if broken is not None:
                return f"rank {rank} went on after its broken collective ({ref.location})"
            continue  # it had not learned of its peer's death yet
        if error is not None and error.exit_code is not None:
            exit_line = ref
            if error.exit_code != record.exit_code:
                return (
                    f"rank {rank} printed exit code {error.exit_code} ({ref.location}), not the"
                    f" launcher's {record.exit_code}"
                )
        elif not _says_peer_gone(ref, error, rank):
            return f"{ref.location} is no collective of rank {rank} broken by a vanished peer"
        elif broken is None:
            broken = ref
        when = error.time if error is not None else None
        if when is not None:
            stamped += 1
            if (fault_time is not None and when < fault_time) or (
                record.time is not None and when > record.time
            ):
                return f"{ref.location} is not stamped between the fault and the record"
    mismatch = aborted_unlike_raised([errors[r] for r in lines if r in errors])
    if mismatch is not None:
        return mismatch
    exited = [e.ref for e in log.of_type(ProcessExited) if e.ref in lines]
    if exited:
        return f"rank {rank} exited cleanly ({exited[0].location})"
    if broken is None:
        return f"rank {rank} printed no collective broken by a vanished peer after the fault"
    if not stamped:
        return f"rank {rank} stamped none of its errors after the fault"
    return broken


def aborted_unlike_raised(errors: list[WorkloadError]) -> str | None:
    """The workload's ``aborted <type>: <first line>`` names the exception it then re-raises,
    whose traceback ends in that type and line: why the two differ, None where they agree (or
    one of them is missing)."""
    aborted = [e for e in errors if e.exception is None and _ABORTED in e.ref.text]
    raised = [e for e in errors if e.exception is not None]
    if not aborted or not raised:
        return None
    said = aborted[0].ref.text.split(_ABORTED, 1)[1].strip()
    final = (raised[-1].exception or "").strip()
    name, _, message = said.partition(": ")
    qualified, _, text = final.partition(": ")
    shorter = min(len(message), len(text))
    if qualified.rsplit(".", 1)[-1] != name or message[:shorter] != text[:shorter]:
        return (
            f"{aborted[0].ref.location} says it aborted on another exception than the traceback"
            f" it raised ({raised[-1].ref.location})"
        )
    return None


def _pids_of(marker: Marker) -> frozenset[int]:
    """The faulted rank's processes the marker names: the one signalled and the rank."""
    return frozenset(p for p in (marker.pid, marker.rank_pid) if p is not None)


def _faulted_log(ctx: JudgeContext) -> CycleLog | None:
    cycle = ctx.timeline.failed_cycle
    return ctx.run.cycle_log(cycle) if cycle is not None else None


def _fire_line_no(log: CycleLog, rank: int) -> int | None:
    """The line of ``rank``'s first fire line in ``log`` (None: it has none)."""
    fire = next((x for x in log.injector if x.kind == "fired" and x.rank == rank), None)
    return fire.ref.line if fire is not None else None


def _closing_signals(
    ctx: JudgeContext, pids: frozenset[int | None], record: LauncherEvent
) -> list[LauncherEvent]:
    """The closing signals a launcher on ``record``'s host sent to any of ``pids``."""
    return [
        e
        for e in ctx.run.launcher.events
        if e.kind is LauncherEventKind.CLOSING_SIGNAL
        and e.pid in pids
        and same_host(ctx.run, e, record)
    ]


def _says_peer_gone(ref: EvidenceRef, error: WorkloadError | None, rank: int) -> bool:
    """Whether the error line (``error``; None: a load failure) is gloo's broken connection of
    ``rank``'s own stream."""
    tag, said = split_tag(split_rank_prefix(ref.text)[1])
    if tag not in ("", f"[rank{rank}]:"):
        return False
    if error is None:
        return _RAISED in said and PEER_GONE.match(said, said.index(_RAISED) + 2) is not None
    if error.exception is not None:
        said = error.exception
    elif _ABORTED in said:
        said = said.split(_ABORTED, 1)[1]
    frame = error.innermost
    if error.exception is not None and frame is None:
        return False  # Python prints no traceback without a frame
    return PEER_GONE.match(said) is not None and (frame is None or frame.short_path == _COLLECTIVES)
