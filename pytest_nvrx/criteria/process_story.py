"""Which process died, for replaced_cycle: the marker, the launcher's records and what the
processes printed of their own lives tell one story, or the record does not show the fault's
death (a :class:`~pytest_nvrx.criteria.windows.Fact` quoting both sides).

* the pid the launcher recorded failing for the rank, the pid the fire line signalled and the
  pid that wrote it, the pid the rank printed at its start in the faulted cycle;
* every worker-failure record and closing signal written by a launcher of the run (a pid its
  profiling events name), one record per launcher before its workers restart, and no launcher on
  the faulted rank's host signalling or recording the pid its own SIGKILL/SIGSEGV killed;
* no rank's end printed, or stamped, before the fault; no stamped end of a rank its own signal
  killed after its fire line; a rank that raised the injected exception exits only 1 and trains
  or restores no more;
* on one host, no pid of an ended cycle starts a rank again.
"""

from __future__ import annotations

from pytest_nvrx.criteria.context import JudgeContext
from pytest_nvrx.criteria.helpers import (
    EXCEPTION_EXIT_CODE,
    SELF_FATAL,
    clock,
    clock_allowance,
    on_faulted_node,
    one_host,
    or_none,
    rank_lines,
    rank_of,
    same_host,
    same_launcher,
    until_restart,
)
from pytest_nvrx.criteria.windows import Fact, faulted_logs, fire_line
from pytest_nvrx.evidence.cycle_log import CycleLog
from pytest_nvrx.evidence.injector_log import InjectorLine
from pytest_nvrx.evidence.launcher_log import LauncherEvent, LauncherEventKind
from pytest_nvrx.evidence.refs import EvidenceRef
from pytest_nvrx.evidence.rundir import RunEvidence
from pytest_nvrx.evidence.workload import (
    LoadCompleted,
    LoadFailed,
    LoadStarted,
    ProcessExited,
    ProcessStarted,
    WorkloadError,
)


def process_problem(ctx: JudgeContext, local: int | None) -> Fact | None:
    """Where replaced_cycle's records disagree on which process died (module doc); ``local`` is
    the marker's rank as the launcher names it."""
    marker = ctx.run.marker
    if marker is None or not marker.ok:
        return None
    stranger = _written_by_no_launcher(ctx.run)
    if stranger is not None:
        return stranger
    rank_pid = marker.rank_process
    key = "rank_pid" if marker.rank_pid is not None else "pid"
    failed = [
        e
        for e in on_faulted_node(ctx.run, ctx.timeline.failure_events)
        if e.kind is LauncherEventKind.WORKER_FAILED and e.rank == local and e.pid is not None
    ]
    if rank_pid is not None and failed and all(e.pid != rank_pid for e in failed):
        pids = ", ".join(str(e.pid) for e in failed)
        return Fact(
            f"the launcher recorded the failure of local_rank {local} as pid {pids}, but the"
            f" marker says the rank was pid {rank_pid}",
            (failed[0].ref, marker.ref(key)),
        )
    fired = fire_line(faulted_logs(ctx.run, ctx.timeline), marker)
    if fired is None:
        return None
    if fired.target_pid is not None and marker.pid is not None and fired.target_pid != marker.pid:
        return Fact(
            f"the injector's fire line sent {or_none(fired.signal)} to pid {fired.target_pid}; the"
            f" marker says pid {marker.pid}",
            (fired.ref, marker.ref("pid")),
        )
    # the rank writes its own fire line ("rank R pid P: ..."; ckpt-worker's also says "rank pid")
    for writer in (fired.pid, fired.rank_pid):
        if rank_pid is not None and writer is not None and writer != rank_pid:
            return Fact(
                f"the injector's fire line names the rank's pid {writer}; the marker says the"
                f" rank was pid {rank_pid}",
                (fired.ref, marker.ref(key)),
            )
    # the log the fault fired in
    log = next((log for log in ctx.run.cycle_logs if log.file == fired.ref.file), None)
    if log is None:
        return _records_of_one_failure(ctx)
    # and, where the workload prints it, its pid at its start in that cycle
    started = [
        e
        for e in log.of_type(ProcessStarted)
        if e.pid is not None and rank_of(e.ref) == marker.rank
    ]
    if rank_pid is not None and any(e.pid != rank_pid for e in started):
        wrong = next(e for e in started if e.pid != rank_pid)
        return Fact(
            f"rank {marker.rank} printed pid {wrong.pid} at its start in the faulted cycle; the"
            f" marker says the rank was pid {rank_pid}",
            (wrong.ref, marker.ref(key)),
        )
    return (
        _after_its_fault(ctx, log, fired)
        or _records_of_one_failure(ctx)
        or _pid_started_again(ctx.run)
    )


def _pid_started_again(run: RunEvidence) -> Fact | None:
    """A pid a rank printed at its start in one cycle, printed again at a start in a later one:
    the launcher ends every worker of a cycle before it starts the next, and a host gives an
    ended process's pid to a new one only after it has counted through ``pid_max``, not within
    seconds. On one host only: on several the same number names another host's process."""
    if not one_host(run):
        return None
    seen: dict[int, tuple[int, EvidenceRef]] = {}
    for log in sorted(run.cycle_logs, key=lambda c: c.cycle):
        started = [(e.pid, e.ref) for e in log.of_type(ProcessStarted) if e.pid is not None]
        for pid, ref in started:
            earlier = seen.get(pid)
            if earlier is not None and earlier[0] < log.cycle:
                return Fact(
                    f"{ref.location} starts a rank as pid {pid}, the pid a rank of cycle"
                    f" {earlier[0]} started as ({earlier[1].location}): that process ended"
                    " before this cycle began, and a host does not reuse a pid within seconds",
                    (ref, earlier[1]),
                )
        for pid, ref in started:
            seen.setdefault(pid, (log.cycle, ref))
    return None


def _written_by_no_launcher(run: RunEvidence) -> Fact | None:
    """A worker-failure record or closing signal whose writer's pid is none of the launchers
    the log's profiling events name: no launcher of this run wrote it."""
    launchers = run.launcher.launchers
    if not launchers:
        return None
    for e in run.launcher.of_kind(
        LauncherEventKind.WORKER_FAILED, LauncherEventKind.CLOSING_SIGNAL
    ):
        if e.launcher_pid is not None and e.launcher_pid not in launchers:
            named = ", ".join(map(str, sorted(launchers)))
            return Fact(
                f"{e.ref.location} was written by pid {e.launcher_pid}, none of the run's"
                f" launchers (the profiling events name {named})",
                (e.ref,),
            )
    return None


def _after_its_fault(ctx: JudgeContext, log: CycleLog, fired: InjectorLine) -> Fact | None:
    """What the faulted rank or the launcher says of it after the fire line that its fault
    rules out: a rank killed by its own SIGKILL or SIGSEGV is never sent the launcher's closing
    signal (torch signals only the workers still running); a rank that raised the injected
    exception exits 1, never cleanly."""
    marker = ctx.run.marker
    assert marker is not None and marker.rank is not None
    if fired.ref.line is None:
        return None
    failed_first = _failed_before_the_fault(ctx, log, fired)
    if failed_first is not None:
        return failed_first
    if ctx.observed_fault in SELF_FATAL:
        # its own process's last words (the workload's stamped error or exit line; what the
        # processes it started print under its prefix carries no stamp of the workload's)
        at = fired.ref.line or 0
        last_words = [(e.time, e.ref) for e in log.of_type(WorkloadError)]
        last_words += [(e.time, e.ref) for e in log.of_type(ProcessExited)]
        spoke = sorted(
            (
                ref
                for when, ref in last_words
                if when is not None and rank_of(ref) == marker.rank and (ref.line or 0) > at
            ),
            key=lambda r: r.line or 0,
        )
        if spoke:
            return Fact(
                f"rank {marker.rank} printed its end ({spoke[0].location}) after its own"
                f" {or_none(marker.signal)} had killed it ({fired.ref.location})",
                (spoke[0], fired.ref),
            )
        # pids are unique on a host: a closing signal from another host's launcher, writing
        # the same log, may name the same number
        own = _node_records(ctx)
        named = [
            e
            for e in ctx.run.launcher.events
            if e.pid == marker.rank_process and (not own or same_host(ctx.run, e, own[0]))
        ]
        closing = [e for e in named if e.kind is LauncherEventKind.CLOSING_SIGNAL]
        if closing:
            return Fact(
                f"the launcher sent a closing signal to pid {closing[0].pid}, the rank its own"
                f" {or_none(marker.signal)} had killed: it signals only workers still running",
                (closing[0].ref, fired.ref),
            )
        # a launcher records only its own workers' failures
        foreign = [
            e
            for e in named
            if e.kind is LauncherEventKind.WORKER_FAILED
            and own
            and not same_launcher(ctx.run, e, own[0])
        ]
        if foreign:
            return Fact(
                f"{foreign[0].ref.location} records pid {foreign[0].pid}, the faulted rank's"
                f" process on this host, as a worker of another launcher than the one that ran"
                f" it ({own[0].ref.location})",
                (foreign[0].ref, own[0].ref),
            )
    if ctx.observed_fault == "exception":
        # (what a self-killed rank's prefix shows after its fire line proves nothing: the
        # processes it started, such as an async checkpoint worker, print under it after it died)
        at = fired.ref.line or 0
        after = [r for r in rank_lines(log, marker.rank) if (r.line or 0) > at]
        ended = [e.ref for e in log.of_type(ProcessExited) if e.ref in after]
        ended += [
            e.ref
            for e in log.of_type(WorkloadError)
            if e.ref in after and e.exit_code not in (None, EXCEPTION_EXIT_CODE)
        ]
        if ended:
            return Fact(
                f"rank {marker.rank} raised the injected exception, yet printed its exit"
                f" ({ended[0].location}) as other than the {EXCEPTION_EXIT_CODE} of an uncaught"
                " exception",
                (ended[0], fired.ref),
            )
        # the exception unwinds the training thread: it trains and restores no more
        went_on = [e.ref for e in log.iterations]
        went_on += [e.ref for e in log.of_type(LoadStarted)]
        went_on += [e.ref for e in log.of_type(LoadCompleted)]
        on = sorted((r for r in went_on if r in after), key=lambda r: r.line or 0)
        if on:
            return Fact(
                f"rank {marker.rank} raised the injected exception ({fired.ref.location}), yet"
                f" went on training or restoring ({on[0].location})",
                (on[0], fired.ref),
            )
    return None


def _failed_before_the_fault(ctx: JudgeContext, log: CycleLog, fired: InjectorLine) -> Fact | None:
    """A rank of the faulted cycle that printed its end (an error, a load it could not finish,
    its exit) before the fault fired, by its place above the fire line or by its stamp before
    the marker's time (less the clocks' allowance of its host): the failure the launcher
    recorded may be that one."""
    at = fired.ref.line or 0
    ended = [e.ref for e in log.of_type(WorkloadError)] + [e.ref for e in log.of_type(LoadFailed)]
    ended += [e.ref for e in log.of_type(ProcessExited)]
    early = sorted((r for r in ended if (r.line or 0) < at), key=lambda r: r.line or 0)
    if early:
        return Fact(
            f"{early[0].location} shows a rank's end before the fault fired ({fired.ref.location}):"
            " the failure the launcher recorded need not be the fault's",
            (early[0], fired.ref),
        )
    fault = ctx.timeline.fault_time
    if fault is None:
        return None
    stamped = [(e.time, e.ref) for e in log.of_type(WorkloadError) if e.time is not None]
    stamped += [(e.time, e.ref) for e in log.of_type(ProcessExited) if e.time is not None]
    for when, ref in sorted(stamped, key=lambda t: t[1].line or 0):
        if when < fault - clock_allowance(ctx.run, rank_of(ref)):
            return Fact(
                f"{ref.location} shows a rank's end stamped {clock(when)}, before the fault at"
                f" {clock(fault)} ({fired.ref.location}): the failure the launcher recorded need"
                " not be the fault's",
                (ref, fired.ref),
            )
    return None


def _node_records(ctx: JudgeContext) -> list[LauncherEvent]:
    """The faulted node's worker-failure records at or after the fault."""
    return [
        e
        for e in on_faulted_node(ctx.run, ctx.timeline.failure_events)
        if e.kind is LauncherEventKind.WORKER_FAILED
    ]


def _records_of_one_failure(ctx: JudgeContext) -> Fact | None:
    """torch elastic logs one worker failure a poll and then stops the group: a second record on
    the faulted node before its workers start again contradicts the first."""
    failed = _node_records(ctx)
    if not failed:
        return None
    again = [
        e
        for e in until_restart(ctx.run, failed[0].ref)
        if e.kind is LauncherEventKind.WORKER_FAILED
        and e in failed
        and same_launcher(ctx.run, e, failed[0])
    ]
    if again:
        return Fact(
            f"the launcher recorded a second worker failure ({again[0].ref.location}) before"
            f" the workers restarted: it records one, then stops the group",
            (again[0].ref, failed[0].ref),
        )
    return None
