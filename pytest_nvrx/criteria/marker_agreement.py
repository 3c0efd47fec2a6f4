"""The marker against the run's other records (#21, "judge from all the evidence").

fault_injected.json is the injector's claim; run.json, the launcher's records and the injector's
own lines (evidence/injector_log.py) say the same things in other words. A pass needs them all
to agree. Two kinds of disagreement here, each quoting both sides:

* :func:`marker_problems`, fatal (the run cannot be judged, exit 2): a marker of another run
  (its ``run_id``, its ``tracker`` path against run.json's checkpoint dir, compared as text and
  never opened), of another world (``world_size``), of a later cycle than the one it fired in
  (``restart_count``), or one that contradicts itself (a ``signal`` its fault never sends; a
  ``pid`` that is, or is not, its ``rank_pid`` against what its fault aims at); an ``argv``
  other than the workload's in run.json (its ``--script``/``--module``, then the options after
  the injector's ``--``); a ``host`` other than run.json's in a run of one node; a schema-2
  marker (only our injector writes one) whose rank left no fire line in the faulted cycle's log
  (:func:`_no_fire_line`: the injector writes it as it fires, before the fault); a ``plant``
  other than run.json's ``config.plant`` (:func:`_plant_disagreement`, issue #25: both none, or
  the same plant; a marker without the key names none), so that a planted run can never be
  judged as an unplanted one;
* :func:`where_problem`, for prior_checkpoint ("which fault happened where"): the rank run.json
  asked for, the legacy fire line's tracker and signal, the schema-2 fire line's probe and
  signal, the ``InjectedFault`` line's window and iterations;
* replaced_cycle's "which process died" is criteria/process_story.py's.
"""

from __future__ import annotations

import posixpath

from pytest_nvrx.criteria.context import JudgeContext
from pytest_nvrx.criteria.helpers import (
    or_none,
)
from pytest_nvrx.criteria.windows import Fact, faulted_logs, fire_line, stated_window_disagrees
from pytest_nvrx.evidence.cycle_log import CycleLog
from pytest_nvrx.evidence.injector_log import (
    MAX_INJECTOR_LINES,
    InjectorLine,
    parse_injected_exception,
)
from pytest_nvrx.evidence.manifest import Manifest
from pytest_nvrx.evidence.marker import Marker, marker_like_names
from pytest_nvrx.evidence.refs import Problem
from pytest_nvrx.evidence.rundir import RunEvidence
from pytest_nvrx.evidence.timeline import Timeline
from pytest_nvrx.evidence.workload import (
    WorkloadError,
)
from pytest_nvrx.layout import (
    FAULT_SIGNAL_NAMES,
    LATER_MARKER_PATTERN,
    MARKER_NAME,
    TRACKER_NAME,
)


def stray_markers(run: RunEvidence) -> tuple[Problem, ...]:
    """A file named like a marker that is none this run's injector writes (fatal): beside a run
    of one fault's ``fault_injected.json`` any other (``fault_injected_2.json`` is a schedule's
    second fault); in a fault schedule's run a name :func:`~pytest_nvrx.layout.marker_name` never
    spells (``fault_injected_02.json``). A schedule's marker past its faults is judged there
    (criteria/schedule_recoveries.py: a fault injected beyond the schedule fails the whole run).
    Each marker present must be a fault the run asked for; an unknown one may record a fault that
    happened and that no criterion then reads."""
    manifest = run.manifest
    scheduled = bool(manifest.scheduled_faults) if manifest is not None else False
    stray = [
        name
        for name in marker_like_names(run.run_dir)
        if name != MARKER_NAME and not (scheduled and _schedule_marker_name(name))
    ]
    if not stray:
        return ()
    shown = stray[0] if len(stray[0]) <= 60 else f"{stray[0][:40]}...{stray[0][-12:]}"
    more = f" (and {len(stray) - 1} more)" if len(stray) > 1 else ""
    if scheduled and manifest is not None and manifest.schedule is not None:
        asked = f"the fault schedule of {manifest.schedule.ref.location}"
    elif manifest is not None and manifest.fault is not None:
        what = "no fault" if manifest.fault.value == "none" else "one fault"
        asked = f"{what} ({manifest.fault.ref.location})"
    else:
        asked = "one fault"
    return (
        Problem(
            "fatal",
            f"{shown}{more} lies in the run dir, named like a marker, but the run asked for"
            f" {asked}, whose injector writes no such file: a fault it did not ask for, or a"
            " file that is not what its name says",
        ),
    )


def _schedule_marker_name(name: str) -> bool:
    """``fault_injected_<k>.json`` as a schedule's injector spells it: k >= 2, no leading 0."""
    m = LATER_MARKER_PATTERN.fullmatch(name)
    return m is not None and m["k"][0] != "0" and m["k"] != "1"


def marker_problems(run: RunEvidence, timeline: Timeline) -> tuple[Problem, ...]:
    """The fatal disagreements of the module doc (none without a usable marker)."""
    marker = run.marker
    if marker is None or not marker.ok:
        return ()
    found: list[tuple[str, Problem]] = []

    def fatal(key: str, text: str) -> None:
        found.append((key, Problem("fatal", text, marker.ref(key))))

    manifest = run.manifest
    if manifest is not None:
        named = manifest.run_id
        if marker.run_id is not None and named is not None and named.value != marker.run_id:
            fatal(
                "run_id",
                f"{marker.ref('run_id').location} records run id {marker.run_id!r}, but"
                f" {named.ref.location} names this run {named.value!r}: the marker of another run",
            )
        ckpt = manifest.checkpoint_dir
        if marker.tracker is not None and ckpt is not None and isinstance(ckpt.value, str):
            tracker = posixpath.join(ckpt.value, TRACKER_NAME)
            if posixpath.normpath(marker.tracker) != posixpath.normpath(tracker):
                fatal(
                    "tracker",
                    f"{marker.ref('tracker').location} records tracker {marker.tracker}, but this"
                    f" run's tracker is {tracker} ({ckpt.ref.location}, its checkpoint dir): the"
                    " marker watched another run's checkpoints",
                )
        world = manifest.world_size
        if marker.world_size is not None and world is not None and world.value != marker.world_size:
            fatal(
                "world_size",
                f"{marker.ref('world_size').location} records world size {marker.world_size},"
                f" but run.json ({world.ref.location}) ran {world.value} rank(s): the marker of"
                " another world",
            )
        argv = manifest.workload_argv_ref
        if marker.argv is not None and argv is not None:
            ran = (
                (manifest.workload_entry, *manifest.workload_argv)
                if manifest.workload_entry is not None
                else None
            )
            if (ran is not None and marker.argv != ran) or (
                ran is None and marker.argv[1:] != manifest.workload_argv
            ):
                fatal(
                    "argv",
                    f"{marker.ref('argv').location} records the workload's argv as"
                    f" {_argv(marker.argv)}, but run.json ({argv.location}) ran"
                    f" {_argv(ran or manifest.workload_argv)}: the marker of another workload",
                )
        plant = _plant_disagreement(marker, manifest)
        if plant is not None:
            found.append(("plant", plant))
        host, nnodes = manifest.host, manifest.nnodes
        single = nnodes is not None and nnodes.value == 1 and manifest.node_index is None
        if single and host is not None and marker.host is not None and host.value != marker.host:
            fatal(
                "host",
                f"{marker.ref('host').location} records host {marker.host!r}, but run.json"
                f" ({host.ref.location}) ran on {host.value!r} alone"
                f" ({nnodes.ref.location if nnodes is not None else 'run.json'}: one node):"
                " the marker of another host",
            )
    hosts = run.launcher.hosts
    if marker.host is not None and hosts and marker.host not in hosts:
        fatal(
            "host",
            f"{marker.ref('host').location} records host {marker.host!r}, but the launcher's lines"
            f" ({run.launcher.file}) name only {', '.join(map(repr, sorted(hosts)))}: the marker"
            " of another host",
        )
    cycle = timeline.failed_cycle
    record = run.cycle_infos.by_cycle(cycle) if cycle is not None else None
    if marker.restart_count is not None and cycle is not None and marker.restart_count > cycle:
        where = f" ({record.ref.location})" if record is not None else ""
        fatal(
            "restart_count",
            f"{marker.ref('restart_count').location} records restart count"
            f" {marker.restart_count}, but it fired in cycle {cycle}{where}: every restart begins"
            " a new cycle, so no cycle has restarted more often than its index",
        )
    problems = [problem for _, problem in found]
    problems += _self_contradictions(marker)
    problems += _no_fire_line(run, timeline, marker)
    problems += _injector_lines_missing(run, marker)
    problems += _baseline_disagrees(run, timeline, marker)
    return tuple(problems)


def _baseline_disagrees(run: RunEvidence, timeline: Timeline, marker: Marker) -> list[Problem]:
    """The marker's ``baseline_iteration`` against the injector's own start line of that rank in
    the faulted cycle (``watching ... (baseline B) to inject ...``): one process wrote both."""
    cycle = timeline.failed_cycle
    log = run.cycle_log(cycle) if cycle is not None else None
    if log is None or marker.baseline_iteration is None:
        return []
    said = [
        line
        for line in log.injector
        if line.kind == "watching"
        and line.rank == marker.rank
        and line.baseline_iteration is not None
        and (marker.rank_process is None or line.pid == marker.rank_process)
    ]
    if not said or said[-1].baseline_iteration == marker.baseline_iteration:
        return []
    line = said[-1]
    return [
        Problem(
            "fatal",
            f"{marker.ref('baseline_iteration').location} records baseline iteration"
            f" {marker.baseline_iteration}, but the injector of rank {marker.rank} said it watched"
            f" from baseline {line.baseline_iteration} ({line.ref.location})",
            marker.ref("baseline_iteration"),
        )
    ]


def _plant_disagreement(marker: Marker, manifest: Manifest) -> Problem | None:
    """run.json and the marker name different plants (none counts as one), quoting both lines.

    The workers planted what their environment named (the marker records it as they fired);
    run.json says what the run was launched as. Either way round, one of them is wrong about
    whether a known recovery bug ran, and a verdict would be about an unknown run."""
    claimed = manifest.planted
    if marker.plant == claimed:
        return None

    def named(plant: str | None) -> str:
        return "no plant" if plant is None else f"plant {plant!r}"

    at = marker.ref("plant")
    said = (
        f"{at.location} records {named(marker.plant)}"
        if at.line is not None
        else f"{marker.file} records no plant (no 'plant' key)"
    )
    where = (
        f"{manifest.plant.ref.location} (config.plant)"
        if manifest.plant is not None
        else f"{manifest.file} (no config.plant)"
    )
    return Problem(
        "fatal",
        f"{said}, but {where} names {named(claimed)}: the workers and run.json disagree on"
        " whether a recovery bug was planted",
        at if at.line is not None else (manifest.plant.ref if manifest.plant else at),
    )


def _argv(argv: tuple[str, ...]) -> str:
    text = " ".join(argv)
    return repr(text if len(text) <= 120 else text[:119] + "…")


def _no_fire_line(run: RunEvidence, timeline: Timeline, marker: Marker) -> list[Problem]:
    """A schema-2 marker (our injector's: it fired) whose rank wrote no fire line in the logs
    of the faulted cycle: the injector writes that line as it writes the marker, before the
    fault, and the rank's stderr reaches the cycle log. Measured: every committed schema-2 run
    has it. Only logs read whole are asked (a missing or unreadable log is reported as such)."""
    if marker.schema_version < 2 and not _ours(run, marker):
        return []
    logs = faulted_logs(run, timeline)
    if (
        not logs
        or any(not log.exists or log.read_error for log in logs)
        or any(len(log.injector) >= MAX_INJECTOR_LINES for log in logs)
        or fire_line(logs, marker) is not None
    ):
        return []
    shown = ", ".join(log.file for log in logs)
    return [
        Problem(
            "fatal",
            f"{marker.ref('schema_version').location}: the injector's schema-2 marker says it"
            f" fired on rank {or_none(marker.rank)} ({marker.fault}), but {shown}"
            f" {'holds' if len(logs) == 1 else 'hold'} no fire"
            f" line of that rank ('[pytest-nvrx injector] rank {or_none(marker.rank)} pid P:"
            f" window ...; marker ... written; ...'): the injector writes it as it fires",
            marker.ref("schema_version"),
        )
    ]


def _ours(run: RunEvidence, marker: Marker) -> bool:
    """Whether our injector wrote the marker: schema 2 is ours alone; a schema-1 marker is ours
    when it records what only ours adds (the tracker path it watched) or a log holds our
    injector's start line (the walkthrough's wrapper writes neither, nor any line of ours)."""
    return (
        marker.schema_version >= 2
        or marker.tracker is not None
        or any(line.kind == "watching" for log in run.cycle_logs for line in log.injector)
    )


def _injector_lines_missing(run: RunEvidence, marker: Marker) -> list[Problem]:
    """Our injector starts on the fault rank of every cycle: it prints that it watches (before
    it fires: a fire line without one is a log edited), and once the marker exists every later
    cycle's says the fault was already injected (or, a schedule's next fault, fires it).
    Measured: every committed run with a marker has both in every cycle log. Only logs read
    whole are asked."""
    if not _ours(run, marker):
        return []
    logs = [log for log in run.cycle_logs if log.exists and not log.read_error]
    if any(len(log.injector) >= MAX_INJECTOR_LINES for log in logs):
        return []
    out: list[Problem] = []
    fired_in: CycleLog | None = None
    for log in logs:
        kinds = {line.kind for line in log.injector}
        fire = next((line for line in log.injector if line.kind == "fired"), None)
        if fire is not None and not any(
            line.kind == "watching" and line.rank == fire.rank
            for line in log.injector
            if (line.ref.line or 0) < (fire.ref.line or 0)
        ):
            out.append(
                Problem(
                    "fatal",
                    f"{fire.ref.location}: the injector's fire line of rank {fire.rank} follows no"
                    f" start line of that rank in {log.file} ('[pytest-nvrx injector] rank"
                    f" {fire.rank} pid P: watching ...'): the injector prints it as it starts,"
                    " before it can fire",
                    fire.ref,
                )
            )
        # the fault rank silent for the whole cycle (no line of it) is the criteria's to judge:
        # it did not load, did not train
        spoke = marker.rank is None or marker.rank in log.ranks
        if fired_in is not None and not kinds & {"fired", "skipped"} and spoke:
            out.append(
                Problem(
                    "fatal",
                    f"{log.file}: cycle {log.cycle} holds no line of the injector saying the"
                    f" fault was already injected ('marker ... exists: fault already injected'),"
                    f" though the marker was written in cycle {fired_in.cycle}"
                    f" ({marker.ref().location}): the injector prints it as each later cycle"
                    " starts",
                    log.first_line or marker.ref(),
                )
            )
        if fire is not None and fired_in is None:
            fired_in = log
    return out


def _self_contradictions(marker: Marker) -> list[Problem]:
    """A marker whose fields cannot all be true: its signal against its fault, its pid against
    its rank_pid (the rank itself is the target of every fault but ckpt-worker's)."""
    out: list[Problem] = []
    fault = marker.fault or ""
    if fault in FAULT_SIGNAL_NAMES:
        sends = FAULT_SIGNAL_NAMES[fault]
        # null means "not recorded" except for exception, which must send none
        if marker.signal != sends and (marker.signal is not None or sends is None):
            out.append(
                Problem(
                    "fatal",
                    f"{marker.ref('signal').location} records signal {or_none(marker.signal)}, but"
                    f" fault {fault} ({marker.ref('fault').location}) sends {or_none(sends)}: the"
                    " marker contradicts itself",
                    marker.ref("signal"),
                )
            )
    if marker.pid is not None and marker.rank_pid is not None:
        worker = fault == "ckpt-worker"
        if (marker.pid == marker.rank_pid) == worker:
            why = (
                "the checkpoint worker is not the rank"
                if worker
                else "an exception is raised by the rank itself"
                if fault == "exception"
                else f"{fault}'s signal goes to the rank itself"
            )
            out.append(
                Problem(
                    "fatal",
                    f"{marker.ref('pid').location}, {marker.ref('rank_pid').location}: the marker"
                    f" records pid {marker.pid} and rank_pid {marker.rank_pid}, but {why}: the"
                    " marker contradicts itself",
                    marker.ref("pid"),
                )
            )
    return out


def where_problem(ctx: JudgeContext) -> Fact | None:
    """Where prior_checkpoint's records disagree on which fault happened where (module doc)."""
    run, marker = ctx.run, ctx.run.marker
    if marker is None or not marker.ok:
        return None
    asked = run.manifest.fault_rank if run.manifest is not None else None
    if asked is not None and marker.rank is not None and asked.value != marker.rank:
        return Fact(
            f"the fault was requested on rank {asked.value} (run.json config.fault_rank) but the"
            f" marker records rank {marker.rank}: the requested fault never happened on the"
            " requested rank",
            (asked.ref, marker.ref("rank")),
        )
    logs = faulted_logs(run, ctx.timeline)
    fired = fire_line(logs, marker)
    if fired is not None:
        disagreement = _fire_line_disagrees(fired, marker)
        if disagreement is not None:
            return disagreement
    if marker.fault == "exception":
        return _exception_disagrees(ctx, marker)
    return None


def _fire_line_disagrees(fired: InjectorLine, marker: Marker) -> Fact | None:
    if fired.legacy:
        said = (fired.baseline_iteration, fired.tracker_iteration, fired.signal)
        if said != (marker.baseline_iteration, marker.tracker_iteration, marker.signal):
            return Fact(
                f"the injector's fire line says the tracker advanced {fired.baseline_iteration}"
                f" -> {fired.tracker_iteration} and it sent {or_none(fired.signal)}; the marker"
                f" says baseline {or_none(marker.baseline_iteration)}, tracker"
                f" {or_none(marker.tracker_iteration)}, signal {or_none(marker.signal)}",
                (fired.ref, marker.ref("tracker_iteration"), marker.ref("signal")),
            )
        return None
    # window, in-flight and tracker are judged with the window (criteria/windows.py)
    if marker.trigger is not None and fired.trigger != marker.trigger:
        return Fact(
            f"the injector's fire line says {fired.trigger} fired; the marker says"
            f" {marker.trigger}",
            (fired.ref, marker.ref("trigger")),
        )
    if fired.signal is not None and fired.signal != marker.signal:
        return Fact(
            f"the injector's fire line sent {fired.signal}; the marker says signal"
            f" {or_none(marker.signal)}",
            (fired.ref, marker.ref("signal")),
        )
    if fired.raises != (marker.fault == "exception"):
        return Fact(
            f"the injector's fire line {'raised' if fired.raises else 'raised no'} InjectedFault;"
            f" the marker says fault {marker.fault}",
            (fired.ref, marker.ref("fault")),
        )
    return None


def _exception_disagrees(ctx: JudgeContext, marker: Marker) -> Fact | None:
    """The InjectedFault line of the marker's rank in the faulted cycle states the marker's
    window and iterations (the injector raises it with them)."""
    cycle = ctx.timeline.failed_cycle
    log = ctx.run.cycle_log(cycle) if cycle is not None else None
    if log is None:
        return None
    for error in log.of_type(WorkloadError):
        stated = parse_injected_exception(error.exception or "")
        if stated is None or stated.rank != marker.rank:
            continue
        said = (stated.window, stated.in_flight_iteration, stated.tracker_iteration)
        disagrees = stated_window_disagrees("the InjectedFault raised", said, error.ref, marker)
        if disagrees is not None:
            return disagrees
    return None
