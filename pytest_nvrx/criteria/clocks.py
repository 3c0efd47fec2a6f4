"""Clocks agree: the times of a run's lines, records and marker tell one story, or it cannot be
judged.

Each contradiction is a fatal :class:`~pytest_nvrx.evidence.refs.Problem` (``verify`` exits 2;
every criterion that would have passed says "cannot judge"), quoting the lines:

* every stamp a log line or cycle record carries is a usable time (1970..2199, a real date),
  and every iteration line carries one (both workloads stamp each one);
* the launcher log's lines never go back in time by more than :data:`CLOCK_SLACK`
  (:func:`_launcher_back_in_time`): on one node all of them, on several each launcher's own;
* within one cycle log, each rank's timestamped lines (iterations, saves, milestones, the
  tracker readings) never go back in time: one process prints them in order;
* no line of a cycle is stamped before the launcher's record of that cycle's start (less
  :data:`~pytest_nvrx.evidence.timeline.CLOCK_SLACK`: the nodes of a run share no clock), nor
  after its record's end or result.json's ``end_time`` (plus it: :func:`_after_its_cycle`);
* each profiling event's own UTC stamp (``Time: ... UTC``) is its line's stamp read in the
  launcher's zone (:func:`_profiling_disagrees`);
* a rank killed by the fault (``kill``, ``segv``) prints nothing stamped after the marker's time,
  which its own process took just before the signal (less :data:`DEATH_SLACK`), and a stopped
  one (``hang``) commits no iteration after it; neither prints an iteration below its fire line
  (every fault of a run: :func:`_faulted_rank_lines`);
* no iteration is stamped before a line of its cycle that says the restore completed
  (:func:`_trained_before_loaded`);
* the marker's time lies inside the launcher's record of the faulted cycle, and not after the
  launcher was told to stop (:func:`marker_after_stop`: a fault struck after the stop would
  have waited a negative time for it);
* the marker's time is not before the first line its own rank stamped in the faulted cycle
  (:func:`marker_before_its_rank`: one process took both; measured, the marker came 0.6 s or
  more after it in every committed run);
* nothing after the launcher's stop line says the run went on (:func:`went_on_after_stop`: a
  cycle's rendezvous or start, a restart decision, a finish): only its shutdown's records follow
  it, and the detections after it would otherwise be dropped as the stop's;
* a run result.json says our deadline stopped (``timed_out``) has that stop line
  (:func:`timed_out_without_stop`): without it the workers' -15 exits of the stop cannot be told
  from a fault's detection (every committed timed-out run has it);
* the records bracket each other (:func:`_records_out_of_order`): result.json's start is
  run.json's (both taken by the harness as it launches) and its end is that start plus its
  ``wall_s`` (the harness's monotonic clock); every launcher line (its earliest and latest
  stamp, glog lines included) and cycle record lies inside that launch; each cycle record
  starts after the launcher's first line, and after the previous cycle ended (consistency.py:
  and ends after it starts). A time zone rewritten on one record (``+23:59``) moves it a day
  away from the others;
* no recovery timing is negative: a downtime of -3592 s is no measurement.

Measured on every committed real run (tests/data, 80 run directories): no rank's lines go back,
none precede its cycle's start, and the killed rank's last line came 1.6-330 ms *before* the
marker.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pytest_nvrx.criteria.helpers import clock, launcher_words, stamp
from pytest_nvrx.evidence.cycle_log import CycleLog
from pytest_nvrx.evidence.launcher_log import LauncherEventKind
from pytest_nvrx.evidence.marker import Marker
from pytest_nvrx.evidence.refs import NO_INSTANT, EvidenceRef, Problem, split_rank_prefix
from pytest_nvrx.evidence.rundir import RunEvidence
from pytest_nvrx.evidence.timeline import CLOCK_SLACK, Timeline
from pytest_nvrx.evidence.workload import LoadCompleted, Milestone

#: How long after the marker's time a killed rank's own line may still be stamped: the injector
#: stamps the marker, writes it durably and signals; other threads of the rank may print in
#: between. Measured: the last line came before the marker in every committed run.
DEATH_SLACK = timedelta(milliseconds=100)
#: Faults that end the rank at the signal (exception and ckpt-worker leave it running; a
#: SIGTERM'd rank may run its handlers: Megatron's --exit-signal-handler finishes the iteration).
DEADLY_AT_ONCE = ("kill", "segv")
#: A stopped rank trains no further iteration: NVRx's SIGCONT before its SIGKILL may wake it for
#: a moment (its other threads may print), but the injector keeps the training thread blocked
#: (docs/injector.md). Measured: no committed hang run has an iteration line of any rank after
#: the marker.
STOPPED = ("hang",)

Timed = tuple[datetime, EvidenceRef]


def _timed(log: CycleLog) -> list[Timed]:
    """Every timestamped line of the log, in line order."""
    out: list[Timed] = []
    for item in (*log.events, *log.iterations, *log.injector):
        when = getattr(item, "time", None)
        if isinstance(when, datetime):
            out.append((when, item.ref))
    out.sort(key=lambda t: t[1].line or 0)
    return out


def clock_problems(run: RunEvidence, timeline: Timeline) -> tuple[Problem, ...]:
    """What the run's clocks say that cannot all be true (see the module doc)."""
    problems: list[Problem] = []
    marker = run.marker
    problems += _unusable_records(run)
    problems += reclaim_problems(run)
    problems += _profiling_disagrees(run)
    problems += _records_out_of_order(run)
    problems += _launcher_back_in_time(run)
    for log in run.cycle_logs:
        timed = _timed(log)
        problems += _unstamped(log) + _backwards(log, timed)
        record = run.cycle_infos.by_cycle(log.cycle)
        if record is not None and record.start is not None and timed:
            first = min(timed, key=lambda t: t[0])
            if first[0] < record.start - CLOCK_SLACK:
                problems.append(
                    Problem(
                        "fatal",
                        f"{first[1].location} is stamped {clock(first[0])}, before the launcher"
                        f" started cycle {log.cycle} at {clock(record.start)}"
                        f" ({record.ref.location}): the clocks disagree",
                        first[1],
                    )
                )
        problems += _after_its_cycle(run, log, timed)
    faults: list[tuple[Marker | None, int | None]] = [(marker, timeline.failed_cycle)]
    faults += [(m, m.restart_count) for _, m in run.later_markers]
    for fault, cycle in faults:
        problems += _faulted_rank_lines(run, fault, cycle)
    problems += _trained_before_loaded(run)
    problems += marker_outside_its_cycle(run, timeline)
    problems += marker_after_stop(run)
    problems += marker_before_its_rank(run, timeline)
    problems += went_on_after_stop(run)
    problems += timed_out_without_stop(run)
    return tuple(problems)


def _faulted_rank_lines(
    run: RunEvidence, marker: Marker | None, cycle: int | None
) -> list[Problem]:
    """A rank the fault killed (``kill``, ``segv``) prints nothing stamped after the marker's time
    (less :data:`DEATH_SLACK`) and no iteration below its fire line; a stopped one (``hang``)
    commits no iteration after either. The injector prints its fire line, then signals its own
    process: an iteration that rank printed later in its cycle's log trained after its death.
    Checked for every fault of a run (a schedule's later ones in the cycle their marker's
    ``restart_count`` names). Measured on every committed run: no killed or stopped rank has an
    iteration line below its fire line."""
    if (
        marker is None
        or not marker.ok
        or marker.time is None
        or marker.fault not in (*DEADLY_AT_ONCE, *STOPPED)
        or marker.rank is None
        or cycle is None
    ):
        return []
    log = run.cycle_log(cycle)
    if log is None:
        return []
    hung = marker.fault in STOPPED
    timed = _timed(log)
    watched = [(e.time, e.ref) for e in log.iterations if e.time is not None] if hung else timed
    late = [
        t
        for t in watched
        if split_rank_prefix(t[1].text)[0] == marker.rank and t[0] > marker.time + DEATH_SLACK
    ]
    what = (
        "a stopped rank trained on after its SIGSTOP"
        if hung
        else "a killed rank printed after its death"
    )
    if late:
        return [
            Problem(
                "fatal",
                f"rank {marker.rank} was sent {marker.signal or marker.fault} at"
                f" {clock(marker.time)} ({marker.ref('time').location}) but"
                f" {late[0][1].location} of that rank is stamped {clock(late[0][0])}: {what}",
                late[0][1],
            )
        ]
    fired = [
        line.ref.line
        for line in log.injector
        if line.kind == "fired" and line.rank == marker.rank and line.ref.line is not None
    ]
    below = [
        e
        for e in log.iterations
        if fired
        and split_rank_prefix(e.ref.text)[0] == marker.rank
        and (e.ref.line or 0) > fired[0]
    ]
    if below:
        return [
            Problem(
                "fatal",
                f"{below[0].ref.location} is rank {marker.rank}'s iteration {below[0].iteration},"
                f" printed below its fire line ({log.file}:{fired[0]}) that sent it"
                f" {marker.signal or marker.fault}: {what}",
                below[0].ref,
            )
        ]
    return []


def _trained_before_loaded(run: RunEvidence) -> list[Problem]:
    """An iteration stamped before a line of its cycle that says the restore completed (a rank's
    load line, Megatron's ``setup_done``/``training_start``): a step needs every rank, each done
    loading, so no rank's step ends before any rank's load. On one node the ranks share a clock
    (no slack); on several, :data:`CLOCK_SLACK`. Measured on every committed run: the first
    iteration came 0.21 s or more after the last such line."""
    manifest = run.manifest
    nodes = manifest.nnodes.value if manifest is not None and manifest.nnodes is not None else 1
    slack = CLOCK_SLACK if isinstance(nodes, int) and nodes > 1 else timedelta(0)
    for log in run.cycle_logs:
        done = [(e.time, e.ref) for e in log.of_type(LoadCompleted) if e.time is not None]
        done += [
            (e.time, e.ref)
            for e in log.of_type(Milestone)
            if e.time is not None and e.name in ("setup_done", "training_start")
        ]
        stamped = [(e.time, e) for e in log.iterations if e.time is not None]
        if not done or not stamped:
            continue
        loaded, ref = max(done, key=lambda d: d[0])
        first, it = min(stamped, key=lambda s: s[0])
        if first < loaded - slack:
            return [
                Problem(
                    "fatal",
                    f"{it.ref.location}: iteration {it.iteration} is stamped {clock(first)},"
                    f" before {ref.location} ({clock(loaded)}) says the restore of its cycle"
                    f" {log.cycle} completed: no rank steps before every rank loaded, the"
                    " clocks disagree",
                    it.ref,
                )
            ]
    return []


def _after_its_cycle(run: RunEvidence, log: CycleLog, timed: list[Timed]) -> list[Problem]:
    """A cycle's line stamped after the launcher ended that cycle, or after the launch ended
    (result.json), each more than :data:`CLOCK_SLACK` later: the launcher records a cycle's end
    once its workers are stopped, so nothing of theirs can come later. Measured on every
    committed real run: the last line of each cycle came 46 ms or more before its record's end.
    """
    if not timed:
        return []
    last = max(timed, key=lambda t: t[0])
    record = run.cycle_infos.by_cycle(log.cycle)
    bounds: list[tuple[datetime, str]] = []
    if record is not None and record.end is not None and record.end_ref is not None:
        bounds.append(
            (record.end, f"the launcher ended cycle {log.cycle} at {record.end_ref.location}")
        )
    manifest = run.manifest
    ended = manifest.end if manifest is not None else NO_INSTANT
    if ended.time is not None and ended.ref is not None:
        bounds.append((ended.time, f"the launch ended at {ended.ref.location}"))
    for end, what in bounds:
        if last[0] > end + CLOCK_SLACK:
            return [
                Problem(
                    "fatal",
                    f"{last[1].location} is stamped {stamp(last[0])}, after {what}"
                    f" ({stamp(end)}): the clocks disagree",
                    last[1],
                )
            ]
    return []


def _profiling_disagrees(run: RunEvidence) -> list[Problem]:
    """A profiling event whose own UTC stamp (``Time: ... UTC``) is not its line's stamp: NVRx
    takes both at once, and the line's stamp is read in the launcher host's zone
    (``LauncherLog.utc_offset``, from the other profiling lines). Measured on every committed
    real run: they differ by 5 ms at most."""
    launcher = run.launcher
    for event in launcher.events:
        if event.utc is None or event.time is None:
            continue
        if abs(event.time - event.utc) > CLOCK_SLACK:
            offset = launcher.utc_offset
            zone = f"UTC{_offset(offset)}" if offset is not None else "UTC"
            return [
                Problem(
                    "fatal",
                    f"{event.ref.location}: the {event.name} event says it happened at"
                    f" {stamp(event.utc)} UTC, but its line is stamped {stamp(event.time)} UTC"
                    f" (read in {zone}, the launcher's zone by its other profiling lines):"
                    " the clocks disagree",
                    event.ref,
                )
            ]
    return []


def _launcher_back_in_time(run: RunEvidence) -> list[Problem]:
    """A launcher line stamped before a line above it of the same writer (one node: any; several:
    that launcher's own, ``LauncherLog.back_step``) by more than :data:`CLOCK_SLACK`: a record
    that is not where its time says, so what it records (a failure before the fault) cannot be
    placed. Measured on every committed real run: lines of one node went back 2 ms at most (two
    rank monitors logging at once), each launcher's own never."""
    step = run.launcher.back_step
    if step is None or step.by <= CLOCK_SLACK:
        return []
    return [
        Problem(
            "fatal",
            f"{step.later.location} is stamped {stamp(step.later_time)},"
            f" {step.by.total_seconds():.3f} s before {step.earlier.location} above it"
            f" ({stamp(step.earlier_time)}): the launcher's lines went back in time,"
            " the clocks disagree",
            step.later,
        )
    ]


def _offset(offset: timedelta) -> str:
    sign = "-" if offset < timedelta(0) else "+"
    minutes = int(abs(offset).total_seconds()) // 60
    return f"{sign}{minutes // 60:02d}:{minutes % 60:02d}"


def _unusable_records(run: RunEvidence) -> list[Problem]:
    """A launcher line or a cycle record whose time is no time: what the clocks are checked
    against (the cycles' starts, the recovery milestones) is then unknown."""
    found = [
        (run.launcher.bad_stamp, "is stamped with no usable time"),
        *((r.bad_time, "holds no usable time") for r in run.cycle_infos.records),
    ]
    return [
        Problem(
            "fatal",
            f"{ref.location} {what} (impossible, or outside the years a run's clock can read):"
            " the clocks cannot be checked",
            ref,
        )
        for ref, what in found
        if ref is not None
    ]


def _records_out_of_order(run: RunEvidence) -> list[Problem]:
    """The harness's, the launcher's and the cycle records' times that cannot all be true.

    Measured on every committed real run with result.json (67): result.json's start came 0-5 ms
    after run.json's, ``end - start`` matched ``wall_s`` within 6 ms, the launcher's first line
    came 1.7-6.5 s after the launch and its last 4.1-5.9 s before the end, cycle 0 started
    0.08-2.8 s after the launcher's first line and each later cycle 2.3-53 s after the previous
    one ended. Every bound below allows :data:`CLOCK_SLACK` (the nodes of a run share no clock).
    """
    problems: list[Problem] = []

    def say(ref: EvidenceRef, text: str) -> None:
        problems.append(Problem("fatal", f"{text}: the clocks disagree", ref))

    manifest = run.manifest
    launch: tuple[datetime, datetime, EvidenceRef, EvidenceRef] | None = None
    if manifest is not None and manifest.result_start.time is not None:
        begun, begun_ref = manifest.result_start.time, manifest.result_start.ref
        assert begun_ref is not None
        written = manifest.start
        if written.time is not None and written.ref is not None:
            gap = begun - written.time
            if not -CLOCK_SLACK <= gap <= CLOCK_SLACK:
                say(
                    begun_ref,
                    f"{begun_ref.location} says the launch began at {stamp(begun)} but"
                    f" {written.ref.location}, written as it began, says"
                    f" {stamp(written.time)}",
                )
        end, end_ref = manifest.end.time, manifest.end.ref
        if end is not None and end_ref is not None:
            wall = manifest.wall_s
            if end < begun - CLOCK_SLACK:
                say(
                    end_ref,
                    f"{end_ref.location}: the launch ended at {stamp(end)}, before it"
                    f" began at {stamp(begun)} ({begun_ref.location})",
                )
            elif wall is not None and abs((end - begun).total_seconds() - wall.value) > (
                CLOCK_SLACK.total_seconds()
            ):
                say(
                    end_ref,
                    f"{begun_ref.location}..{end_ref.location} span"
                    f" {(end - begun).total_seconds():.3f} s but the harness timed the launch at"
                    f" {wall.value:.3f} s ({wall.ref.location})",
                )
            else:
                launch = (begun, end, begun_ref, end_ref)
    launcher = run.launcher
    stamps: list[tuple[datetime, EvidenceRef, str]] = []
    for at, what in ((launcher.first, "first line"), (launcher.last, "last line")):
        if at.time is not None and at.ref is not None:
            stamps.append((at.time, at.ref, f"the launcher's {what}"))
    # every launcher line (each event's included) lies between its earliest and latest stamp
    for at, what in ((launcher.earliest, "earliest stamp"), (launcher.latest, "latest stamp")):
        if at.time is not None and at.ref is not None and at.ref not in (s[1] for s in stamps):
            stamps.append((at.time, at.ref, f"the launcher's {what}"))
    previous_end: tuple[datetime, EvidenceRef] | None = None
    for record in run.cycle_infos.records:
        name = f"cycle {record.cycle}'s record"
        if record.start is not None:
            stamps.append((record.start, record.ref, f"{name} start"))
            first, first_ref = launcher.first.time, launcher.first.ref
            if first is not None and first_ref is not None and record.start < first - CLOCK_SLACK:
                say(
                    record.ref,
                    f"{record.ref.location}: cycle {record.cycle} started at"
                    f" {stamp(record.start)}, before the launcher's first line"
                    f" {first_ref.location} at {stamp(first)}",
                )
            if previous_end is not None and record.start < previous_end[0] - CLOCK_SLACK:
                say(
                    record.ref,
                    f"{record.ref.location}: cycle {record.cycle} started at"
                    f" {stamp(record.start)}, before the previous cycle ended at"
                    f" {stamp(previous_end[0])} ({previous_end[1].location})",
                )
        if record.end is not None and record.end_ref is not None:
            stamps.append((record.end, record.end_ref, f"{name} end"))
            previous_end = (record.end, record.end_ref)
    if launch is not None:
        begun, end, begun_ref, end_ref = launch
        for when, ref, what in stamps:
            if when < begun - CLOCK_SLACK or when > end + CLOCK_SLACK:
                say(
                    ref,
                    f"{ref.location} ({what}) is stamped {stamp(when)}, outside the launch"
                    f" {stamp(begun)}..{stamp(end)} ({begun_ref.location}, {end_ref.location})",
                )
    return problems


def _unstamped(log: CycleLog) -> list[Problem]:
    """A line whose stamp is no time (impossible, or outside the years a run's clock can read:
    refs.TIME_RANGE): any stamp the parser read (``CycleLog.bad_stamp``), and an iteration line
    without one (both workloads stamp every iteration line)."""
    blank = log.bad_stamp
    if blank is None:
        blank = next((e.ref for e in log.iterations if e.time is None), None)
    if blank is None:
        return []
    return [
        Problem(
            "fatal",
            f"{blank.location} is stamped with no usable time (impossible, or outside the"
            " years a run's clock can read): the clocks cannot be checked",
            blank,
        )
    ]


def _backwards(log: CycleLog, timed: list[Timed]) -> list[Problem]:
    last: dict[int | None, Timed] = {}
    for when, ref in timed:
        rank = split_rank_prefix(ref.text)[0]
        before = last.get(rank)
        if before is not None and when < before[0]:
            who = f"rank {rank}" if rank is not None else "unprefixed lines"
            return [
                Problem(
                    "fatal",
                    f"{log.file}: {who} went back in time: {ref.location} is stamped"
                    f" {clock(when)} after {before[1].location} at {clock(before[0])}",
                    ref,
                )
            ]
        if before is None or when >= before[0]:
            last[rank] = (when, ref)
    return []


def marker_outside_its_cycle(run: RunEvidence, timeline: Timeline) -> list[Problem]:
    marker = run.marker
    if marker is None or not marker.ok or marker.time is None or not run.cycles:
        return []
    cycle = timeline.failed_cycle
    record = run.cycle_infos.by_cycle(cycle) if cycle is not None else None
    if record is None or record.start is None:
        return []
    end = record.end
    if marker.time < record.start - CLOCK_SLACK or (
        end is not None and marker.time > end + CLOCK_SLACK
    ):
        span = f"{clock(record.start)}..{clock(end) if end is not None else 'its end'}"
        return [
            Problem(
                "fatal",
                f"the marker's time {clock(marker.time)} lies outside the launcher's record of"
                f" the faulted cycle {cycle} ({span}, {record.ref.location})",
                marker.ref("time"),
            )
        ]
    return []


def marker_before_its_rank(run: RunEvidence, timeline: Timeline) -> list[Problem]:
    """A marker stamped before the first line its rank stamped in the cycle it faulted (less
    :data:`DEATH_SLACK`): the process that took the marker's time had not started. Every
    marker of a schedule, each in its own cycle."""
    faults: list[tuple[Marker | None, int | None]] = [(run.marker, timeline.failed_cycle)]
    faults += [(m, m.restart_count) for _, m in run.later_markers]
    problems: list[Problem] = []
    for marker, cycle in faults:
        problems += _marker_before_its_rank(run, marker, cycle)
    return problems


def _marker_before_its_rank(
    run: RunEvidence, marker: Marker | None, cycle: int | None
) -> list[Problem]:
    if marker is None or not marker.ok or marker.time is None or marker.rank is None:
        return []
    log = run.cycle_log(cycle) if cycle is not None else None
    if log is None:
        return []
    own = [t for t in _timed(log) if split_rank_prefix(t[1].text)[0] == marker.rank]
    if not own:
        return []
    first = min(own, key=lambda t: t[0])
    if marker.time >= first[0] - DEATH_SLACK:
        return []
    return [
        Problem(
            "fatal",
            f"the marker's time {clock(marker.time)} ({marker.ref('time').location}) is before"
            f" rank {marker.rank}'s first line of cycle {cycle}, {first[1].location}, stamped"
            f" {clock(first[0])}: the fault cannot precede the process that took it",
            marker.ref("time"),
        )
    ]


def marker_after_stop(run: RunEvidence) -> list[Problem]:
    """The marker stamped after the launcher's line saying it was told to stop (our run timeout,
    a stop signal; less :data:`CLOCK_SLACK`): the workers it stops inject nothing after it, so
    one of the two clocks is wrong and no wait from the fault to the stop can be measured."""
    marker = run.marker
    stop = run.launcher.signalled()
    if marker is None or not marker.ok or marker.time is None or stop is None or stop.time is None:
        return []
    if marker.time <= stop.time + CLOCK_SLACK:
        return []
    return [
        Problem(
            "fatal",
            f"the marker's time {clock(marker.time)} ({marker.ref('time').location}) is after"
            f" the launcher was told to stop at {clock(stop.time)} ({stop.ref.location}): the"
            " clocks disagree",
            marker.ref("time"),
        )
    ]


#: Launcher records of a run going on: a rendezvous, a cycle's workers starting, a restart
#: decision, a finish. The launcher told to stop writes none of them: only its shutdown's
#: (the workers' -15 exits, its SignalException, the sections left open), as every committed
#: timed-out run shows.
_GOING_ON = (
    LauncherEventKind.WORKERS_STARTING,
    LauncherEventKind.GROUP_FAILED,
    LauncherEventKind.GROUP_SUCCEEDED,
    LauncherEventKind.RUN_OK,
    LauncherEventKind.PROGRESS,
    LauncherEventKind.NO_PROGRESS,
)
_GOING_ON_PROFILING = ("rendezvous_started", "rendezvous_completed", "worker_start_started")


def went_on_after_stop(run: RunEvidence) -> list[Problem]:
    """A record of the run going on after the launcher's line saying it was told to stop: the
    log contradicts itself (its detections after that line cannot be told from the stop's)."""
    launcher = run.launcher
    stop = launcher.signalled()
    if stop is None:
        return []
    for event in launcher.events:
        going_on = (
            event.kind in _GOING_ON
            or (event.kind is LauncherEventKind.PROFILING and event.name in _GOING_ON_PROFILING)
            or (event.kind is LauncherEventKind.AGENT_EXIT and event.exit_code == 0)
        )
        if going_on and _later(event.ref, event.time, stop.ref, stop.time):
            return [
                Problem(
                    "fatal",
                    f"the launcher was told to stop ({stop.ref.location}), yet {event.ref.location}"
                    f" says the run went on: {launcher_words(event.ref)}",
                    event.ref,
                )
            ]
    return []


def timed_out_without_stop(run: RunEvidence) -> list[Problem]:
    """result.json says our deadline stopped the run, but the launcher log has no line saying it
    was told to stop: the harness signals a launcher still running its workers, and every
    committed timed-out run's launcher logged it (one whose workers had all finished may not).
    Without it the workers' -15 exits of that stop read as a fault's detection and the wait
    for it cannot be measured."""
    manifest = run.manifest
    timed_out = manifest.timed_out if manifest is not None else None
    if timed_out is None or timed_out.value is not True or run.launcher.signalled() is not None:
        return []
    if run.launcher.of_kind(LauncherEventKind.RUN_OK, LauncherEventKind.GROUP_SUCCEEDED):
        # the workers had finished and the launcher hung on its way out: a signal then finds no
        # agent loop to log it, and no exit of the stop can pass for a detection
        return []
    return [
        Problem(
            "fatal",
            f"{timed_out.ref.location} says the run timeout stopped the run, yet"
            f" {run.launcher.file}"
            " has no line saying the launcher was told to stop: the workers' exits of that stop"
            " cannot be told from a fault's detection",
            timed_out.ref,
        )
    ]


def _later(
    ref: EvidenceRef, time: datetime | None, anchor: EvidenceRef, anchor_time: datetime | None
) -> bool:
    """Whether a record comes after ``anchor``: a later line of the same file, else a later
    time (beyond :data:`CLOCK_SLACK`: the nodes of a run share no clock)."""
    if ref.file == anchor.file and ref.line is not None and anchor.line is not None:
        return ref.line > anchor.line
    return time is not None and anchor_time is not None and time > anchor_time + CLOCK_SLACK


def timing_problems(timings: dict[str, float]) -> tuple[Problem, ...]:
    """A negative recovery timing is no measurement, nor a wait for the GPUs' memory longer
    than the span that holds it (detected -> replacement start): the run cannot be judged by
    them."""
    problems = [
        Problem(
            "fatal",
            f"impossible timing: {name[:-2].replace('_', ' ')} is {value:.3f} s (negative)",
        )
        for name, value in timings.items()
        if value < 0
    ]
    reclaim = timings.get("gpu_memory_reclaim_s")
    span = timings.get("detected_to_replacement_start_s")
    # NVRx logs the wait in whole seconds, truncated: it may read up to a second short, never long
    if reclaim is not None and span is not None and reclaim > span + CLOCK_SLACK.total_seconds():
        problems.append(
            Problem(
                "fatal",
                f"impossible timing: NVRx waited {reclaim:.0f} s for the GPUs' memory within a"
                f" detected -> replacement start of {span:.3f} s",
            )
        )
    return tuple(problems)


def reclaim_problems(run: RunEvidence) -> list[Problem]:
    """A launcher line about the GPUs' memory whose wait is no number: the recovery's phases
    cannot be told apart without it."""
    return [
        Problem(
            "fatal",
            f"{e.ref.location} says NVRx waited for the GPUs' memory but gives no wait it can"
            " read: the recovery's phases cannot be measured",
            e.ref,
        )
        for e in run.launcher.events
        if e.kind is LauncherEventKind.GPU_RECLAIM and e.name == "unreadable"
    ]
