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

from datetime import datetime

from pytest_nvrx.criteria.context import JudgeContext
from pytest_nvrx.criteria.helpers import (
    EXCEPTION_EXIT_CODE,
    SELF_FATAL,
    clock,
    clock_allowance,
    nproc_per_node,
    on_faulted_node,
    one_host,
    one_node,
    or_none,
    rank_lines,
    rank_of,
    same_host,
    same_launcher,
    until_restart,
)
from pytest_nvrx.criteria.peer_named import aborted_unlike_raised
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
    # every line its injector wrote in that cycle is its own process's
    other = next(
        (x for x in log.injector if x.rank == marker.rank and x.pid not in (None, rank_pid)),
        None,
    )
    if other is not None and rank_pid is not None:
        return Fact(
            f"rank {marker.rank}'s injector line {other.ref.location} names pid {other.pid}; the"
            f" marker says the rank was pid {rank_pid}",
            (other.ref, marker.ref(key)),
        )
    return (
        _beyond_the_world(ctx.run)
        or _recorded_before_the_fault(ctx)
        or _records_unlike_torch(ctx.run)
        or _after_its_fault(ctx, log, fired)
        or _records_of_one_failure(ctx)
        or _pids_nobody_printed(ctx, log)
        or _pid_started_again(ctx.run)
    )


def _beyond_the_world(run: RunEvidence) -> Fact | None:
    """A cycle log's line under the prefix of a rank the run's world does not have."""
    marker, manifest = run.marker, run.manifest
    world = marker.world_size if marker is not None else None
    if world is None and manifest is not None and manifest.world_size is not None:
        value = manifest.world_size.value
        world = value if isinstance(value, int) else None
    if not world:
        return None
    for log in run.cycle_logs:
        refs = [e.ref for e in log.events] + [e.ref for e in log.iterations]
        refs += [x.ref for x in log.injector]
        for ref in sorted(refs, key=lambda r: r.line or 0):
            rank = rank_of(ref)
            if rank is not None and rank >= world:
                return Fact(
                    f"{ref.location} is a line of rank {rank}, in a world of {world} ranks",
                    (ref,),
                )
    return None


def _recorded_before_the_fault(ctx: JudgeContext) -> Fact | None:
    """A launcher recorded a worker's failure before the marker's time (the injector stamps it
    before the fault), by the clock of its host: the faulted rank's shares it; another node's
    host has its own (:data:`CLOCK_SLACK`)."""
    run, fault, marker = ctx.run, ctx.timeline.fault_time, ctx.run.marker
    if fault is None or marker is None:
        return None
    nproc = nproc_per_node(run)
    own = _node_records(ctx)
    for e in ctx.timeline.failure_events:
        if e.kind is not LauncherEventKind.WORKER_FAILED or e.time is None:
            continue
        if e.node is None and not one_node(run):
            rank: int | None = marker.rank if e in own else None
        else:
            rank = (e.node or 0) * nproc if nproc else None
        if e.time < fault - clock_allowance(run, rank):
            return Fact(
                f"{e.ref.location} records a worker's failure at {clock(e.time)}, before the"
                f" fault at {clock(fault)} ({marker.ref('time').location}): it is not the"
                " fault's",
                (e.ref, marker.ref("time")),
            )
    return None


def _pids_nobody_printed(ctx: JudgeContext, log: CycleLog) -> Fact | None:
    """On one host, where every rank printed its pid at its start in the faulted cycle: each
    worker-failure record and closing signal of that cycle's stop names one of those pids,
    and a record's node and local rank are that pid's rank (torch records and signals only its
    own workers)."""
    run = ctx.run
    world = run.marker.world_size if run.marker is not None else None
    nproc = nproc_per_node(run)
    if not one_host(run) or not world or not nproc:
        return None
    rank_of_pid = {e.pid: rank_of(e.ref) for e in log.of_type(ProcessStarted) if e.pid is not None}
    if set(rank_of_pid.values()) != set(range(world)):
        return None
    failed = _node_records(ctx)
    if not failed:
        return None
    stop = [failed[0], *until_restart(run, failed[0].ref)]
    for e in stop:
        if e.kind not in (LauncherEventKind.WORKER_FAILED, LauncherEventKind.CLOSING_SIGNAL):
            continue
        if e.pid is None:
            continue
        if e.pid not in rank_of_pid:
            return Fact(
                f"{e.ref.location} names pid {e.pid}, which no rank of the faulted cycle"
                f" printed at its start ({log.file})",
                (e.ref,),
            )
        owner = rank_of_pid[e.pid]
        node = e.node if e.node is not None else (0 if one_node(run) else None)
        kind_ok = e.kind is LauncherEventKind.WORKER_FAILED
        if kind_ok and node is not None and e.rank is not None and owner != node * nproc + e.rank:
            return Fact(
                f"{e.ref.location} records local_rank {e.rank} of node {node} as pid"
                f" {e.pid}, which rank {owner} printed at its start",
                (e.ref,),
            )
    return None


def _records_unlike_torch(run: RunEvidence) -> Fact | None:
    """Worker-failure records torch elastic does not write: an exit of 0 (it records only a
    failed worker), a local rank beyond the node's ranks; and a closing signal to a worker
    whose failure its host's launcher had already recorded (it signals only the workers still
    running)."""
    nproc = nproc_per_node(run)
    records = run.launcher.of_kind(LauncherEventKind.WORKER_FAILED)
    for e in records:
        if e.exit_code == 0:
            return Fact(f"{e.ref.location} records a worker failed with exit code 0", (e.ref,))
        if nproc and e.rank is not None and e.rank >= nproc:
            return Fact(
                f"{e.ref.location} records local_rank {e.rank}, but a node runs {nproc}",
                (e.ref,),
            )
        for later in until_restart(run, e.ref):
            if (
                later.kind is LauncherEventKind.CLOSING_SIGNAL
                and later.pid is not None
                and later.pid == e.pid
                and same_host(run, later, e)
            ):
                return Fact(
                    f"{later.ref.location} sends a closing signal to pid {later.pid}, whose"
                    f" failure {e.ref.location} had recorded: torch signals only the workers"
                    " still running",
                    (later.ref, e.ref),
                )
    return None


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
        ranks: dict[int, EvidenceRef] = {}
        for pid, ref in started:
            twin = ranks.get(pid)
            if twin is not None and rank_of(twin) != rank_of(ref):
                return Fact(
                    f"{ref.location} and {twin.location} start two ranks as one pid {pid}",
                    (ref, twin),
                )
            ranks.setdefault(pid, ref)
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
        spoke = sorted(
            (r for r in _stamped_ends(log) if rank_of(r) == marker.rank and (r.line or 0) > at),
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
        errors = {e.ref: e for e in log.of_type(WorkloadError)}
        mismatch = aborted_unlike_raised([errors[r] for r in after if r in errors])
        if mismatch is not None:
            return Fact(f"rank {marker.rank}: {mismatch}", (fired.ref,))
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
    fault = ctx.timeline.fault_time
    stamps = _stamped_ends(log)
    ended = [e.ref for e in log.of_type(WorkloadError)] + [e.ref for e in log.of_type(LoadFailed)]
    ended += [e.ref for e in log.of_type(ProcessExited)]

    def after_by_its_stamp(ref: EvidenceRef) -> bool:
        # ranks' lines reach the log in the order they arrive: a line stamped after the fault
        # may stand above the fire line (its stamp is judged below)
        when = stamps.get(ref)
        return when is not None and fault is not None and when >= fault

    early = sorted(
        (r for r in ended if (r.line or 0) < at and not after_by_its_stamp(r)),
        key=lambda r: r.line or 0,
    )
    if early:
        return Fact(
            f"{early[0].location} shows a rank's end before the fault fired ({fired.ref.location}):"
            " the failure the launcher recorded need not be the fault's",
            (early[0], fired.ref),
        )
    if fault is None:
        return None
    for ref, when in sorted(stamps.items(), key=lambda t: t[0].line or 0):
        if when < fault - clock_allowance(ctx.run, rank_of(ref)):
            return Fact(
                f"{ref.location} shows a rank's end stamped {clock(when)}, before the fault at"
                f" {clock(fault)} ({fired.ref.location}): the failure the launcher recorded need"
                " not be the fault's",
                (ref, fired.ref),
            )
    return None


def _stamped_ends(log: CycleLog) -> dict[EvidenceRef, datetime]:
    """The workload's own stamped end lines in ``log`` (its error or exit line; a traceback
    carries no stamp), with their stamps."""
    ends = {e.ref: e.time for e in log.of_type(WorkloadError) if e.time is not None}
    ends.update({e.ref: e.time for e in log.of_type(ProcessExited) if e.time is not None})
    return ends


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
