"""Required evidence, declared: the lines a criterion needs, derived from what the run says it did.

A criterion that finds nothing to compare must not read that as "nothing to judge". What has to be
in a run directory follows from the run's own statements, and each requirement here says which
statement makes it one:

* the iterations a cycle trained (:func:`trained_through`): the marker's in-flight save and
  tracker reading (the fault struck that cycle), the saves the cycle scheduled or finalized, the
  lines it printed; the workload's print rule (``progress_past_restore.print_rule``) then says
  which of them it printed (:func:`printed_by_rule`), and a missing one is named
  (:func:`unprinted`). training_continuity needs the failed cycle's lines of what the replacement
  trained again; every cycle, the lines it printed before a save it finalized
  (:func:`unprinted_problems`).
* the ranks of the world (:func:`world_ranks`: run.json's world size, else the marker's): a
  workload whose every rank prints where it starts (``loads_on_every_rank``: the reference
  workload's ``load checkpoint`` or ``no checkpoint found`` on each rank) prints it on every rank
  the world size names, in every cycle that trained (:func:`required_problems` for a fresh
  start, optimizer_state_load for a restore). Which ranks print what differs by workload:
  Megatron prints its load lines on rank 0 and its iteration lines on the last rank only; the
  reference workload its iterations on rank 0 and its start on every rank.

* the clean exit of every rank (``exits_on_every_rank``: the reference workload's ``exit code
  0``, its last line) in the last cycle of a run whose launcher exited 0 on its own
  (:func:`unexited`): a rank without one had its last lines cut off.

* the settings a cycle started with (``dumps_settings``: Megatron's argument dump, printed by
  rank 0 before it loads, saves or trains): a cycle that trained, loaded or saved without one
  (:func:`undumped`) leaves resume_settings and manifest_agreement nothing to compare (a
  replacement started with ``--no-load-rng`` would pass), so the run cannot be judged.

* the lines only a cross-check reads (:func:`cross_check_lines`), each by what the run says of
  them: every rank's ``started`` line of a cycle that trained (``starts_on_every_rank``), the
  versions a cycle printed when another cycle of the run printed them (one build) or run.json's
  stack records a release that prints them in every process (``versions_printed``:
  Megatron-Core 0.19 on), the fresh start of a cycle that trained and loaded nothing (both
  workloads print one: the reference workload ``no checkpoint found``, Megatron ``could not
  find the metadata file``), and rank 0's injector lines about the tracker in every cycle that
  trained: its announcement (``reading checkpoint tracker ...``) where run.json's
  ``tracker_readings`` or another cycle's announcement says the injector makes one, and a
  reading (``checkpoint tracker reads N``) in such a cycle that loaded or finalized a
  checkpoint where a reading, an announcement or run.json says the injector logs them.

A requirement nobody can check (no world size recorded, a middle of a huge log the parser did not
keep) is no requirement: absence of a statement claims nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from pytest_nvrx.criteria.consistency import clean_exit_last_log
from pytest_nvrx.criteria.helpers import or_none
from pytest_nvrx.criteria.progress_past_restore import print_rule
from pytest_nvrx.evidence.cycle_log import ITERATIONS_KEPT, CycleLog
from pytest_nvrx.evidence.refs import EvidenceRef, Problem, split_rank_prefix
from pytest_nvrx.evidence.rundir import RunEvidence
from pytest_nvrx.evidence.sequence import PrintRule
from pytest_nvrx.evidence.workload import (
    LOAD_FAILURES,
    LoadCompleted,
    LoadStarted,
    ProcessExited,
    ProcessStarted,
    SaveCompleted,
    SaveScheduled,
    StartedFromScratch,
    VersionReported,
    WorkloadLogAdapter,
    dumps_settings,
    exits_on_every_rank,
    get_adapter,
    loads_on_every_rank,
    starts_on_every_rank,
    versions_printed,
)


@dataclass(frozen=True, slots=True)
class Trained:
    """The highest iteration a cycle is proven to have trained, and the statement that proves
    it (``why`` reads after "although": ``the marker says the save of 10 was in flight``)."""

    iteration: int
    why: str
    ref: EvidenceRef | None


def trained_through(run: RunEvidence, log: CycleLog, *, struck: bool) -> Trained | None:
    """The highest iteration ``log``'s cycle trained by what the run says; None: nothing says.

    ``struck``: the run's marker records the fault that ended this cycle, so its in-flight save
    (submitted after its iteration was trained, on every rank) and its tracker reading (a
    finalized checkpoint) count. A save the cycle scheduled or finalized is one of an iteration
    it trained; so is a line it printed."""
    proofs: list[Trained] = []
    marker = run.marker
    if struck and marker is not None and marker.ok:
        if marker.in_flight_iteration is not None:
            proofs.append(
                Trained(
                    marker.in_flight_iteration,
                    f"the marker says the save of {marker.in_flight_iteration} was in flight at"
                    " the fault",
                    marker.ref("in_flight_iteration"),
                )
            )
        if marker.tracker_iteration is not None:
            proofs.append(
                Trained(
                    marker.tracker_iteration,
                    f"the marker read the tracker at {marker.tracker_iteration}",
                    marker.ref("tracker_iteration"),
                )
            )
    for event in log.events:
        if isinstance(event, SaveScheduled | SaveCompleted):
            verb = "scheduled" if isinstance(event, SaveScheduled) else "finalized"
            proofs.append(
                Trained(event.iteration, f"it {verb} the save of {event.iteration}", event.ref)
            )
    top = log.max_iteration
    if top is not None:
        proofs.append(Trained(top.iteration, f"it printed iteration {top.iteration}", top.ref))
    # the highest; of equal ones the first found (the marker's, then the log's own)
    return max(proofs, key=lambda p: p.iteration, default=None)


def process_start(log: CycleLog) -> int:
    """The iteration a cycle's process resumed from: its restore, 0 for a fresh start (or when
    it says neither: a restore it never printed cannot be required of it)."""
    loads = log.of_type(LoadCompleted)
    return loads[0].iteration if loads else 0


def printed_by_rule(rule: PrintRule, start: int, low: int, high: int) -> list[int]:
    """The iterations in ``(low, high]`` that a process resumed from ``start`` prints by
    ``rule``: its first, then every multiple of the log interval not skipped."""
    out: list[int] = []
    if high <= low:
        return out
    it = rule.first_after(start)
    while it <= high:
        if it > low:
            out.append(it)
        it = rule.next_after(it)
    return out


def unprinted(log: CycleLog, iterations: Iterable[int]) -> list[int]:
    """Those of ``iterations`` that ``log`` has no line of. The middle of a log the parser did
    not keep (more than twice ITERATIONS_KEPT lines) is not looked at: it is not missing."""
    its = log.iterations
    printed = {e.iteration for e in its}
    dropped: tuple[int, int] | None = None
    if log.iterations_not_kept > 0 and len(its) > ITERATIONS_KEPT:
        head, tail = its[:ITERATIONS_KEPT], its[ITERATIONS_KEPT:]
        dropped = (max(e.iteration for e in head), min(e.iteration for e in tail))
    return [
        i
        for i in iterations
        if i not in printed and not (dropped is not None and dropped[0] < i < dropped[1])
    ]


def spans(iterations: Sequence[int]) -> str:
    """``6..10``, ``6..8, 10``: sorted iterations as runs of consecutive numbers."""
    out: list[str] = []
    ordered = sorted(iterations)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}..{ordered[j]}")
        i = j + 1
    return ", ".join(out)


def world_ranks(run: RunEvidence) -> tuple[tuple[int, ...], EvidenceRef] | None:
    """The ranks the run's world size names, with the line that says it: run.json's
    ``world_size``, else the marker's, else a single node's ranks per node (the launcher's
    launch configs, for runs recorded before run.json named the world size); None when nothing
    records one."""
    manifest = run.manifest
    if manifest is not None and manifest.world_size is not None:
        size = manifest.world_size.value
        if isinstance(size, int) and not isinstance(size, bool) and size > 0:
            return tuple(range(size)), manifest.world_size.ref
    marker = run.marker
    if marker is not None and marker.ok and marker.world_size is not None and marker.world_size > 0:
        return tuple(range(marker.world_size)), marker.ref("world_size")
    launcher = run.launcher
    per_node, ref = launcher.nproc_per_node, launcher.config_refs.get("nproc_per_node")
    one_node = launcher.config.get("min_nodes") == launcher.config.get("max_nodes") == "1"
    if per_node and ref is not None and one_node:
        return tuple(range(per_node)), ref
    return None


def unprinted_problems(run: RunEvidence) -> tuple[Problem, ...]:
    """The run cannot be judged when a cycle finalized the save of N but lacks an iteration line
    its print rule says it printed before that save: the finalization line comes after those
    lines (an async save finalizes iterations after it was scheduled), so a SIGKILL that cuts a
    log's last lines cannot explain them. From the cycle's first iteration line on, where it
    printed one (an iteration sequence that jumps is progress_past_restore's to judge), else
    from its start. Asked of every cycle, not only of the one a replacement trained again
    (training_continuity): a schedule the launcher stopped judges no recovery, and its first
    cycle's lines are still the evidence of what it trained."""
    out: list[Problem] = []
    for log in run.cycle_logs:
        finalized = log.of_type(SaveCompleted)
        if not finalized:
            continue
        top = max(finalized, key=lambda e: e.iteration)
        start = process_start(log)
        # from its first line on where it printed any: a cycle that went on past another
        # iteration than its restore's next is progress_past_restore's to judge
        first = log.first_iteration
        low = start if first is None else max(start, first.iteration - 1)
        wanted = printed_by_rule(print_rule(log, run), start, low, top.iteration)
        missing = unprinted(log, wanted)
        if not missing:
            continue
        out.append(
            Problem(
                "fatal",
                f"{log.file}: cycle {log.cycle} finalized the save of {top.iteration}"
                f" ({top.ref.location}) but printed no line of iteration"
                f" {spans(missing)}, which the {run.workload} workload prints before it"
                " schedules that save: the cycle's iteration lines are missing",
                top.ref,
            )
        )
    return tuple(out)


def _rank(ref: EvidenceRef) -> int | None:
    return split_rank_prefix(ref.text)[0]


def required_problems(run: RunEvidence) -> tuple[Problem, ...]:
    """The run cannot be judged when a line its workload prints on every rank is missing on a
    rank the world size names: a cycle that trained from scratch where some rank never said so
    (what that rank trained from is unknown). A cycle that restored, or failed to, is
    optimizer_state_load's to judge (a rank without its load line did not load)."""
    try:
        adapter = get_adapter(run.workload)
    except KeyError:
        return ()
    out: list[Problem] = undumped(run) if dumps_settings(adapter) else []
    out += cross_check_lines(run, adapter)
    out += unexited(run, adapter)
    world = world_ranks(run)
    if world is None or not loads_on_every_rank(adapter):
        return tuple(out)
    ranks, size_ref = world
    for log in run.cycle_logs:
        said = log.of_type(StartedFromScratch)
        restoring = any(isinstance(e, (LoadCompleted, *LOAD_FAILURES)) for e in log.events)
        if not log.iterations or not said or restoring:
            continue
        told = {_rank(e.ref) for e in said}
        silent = [r for r in ranks if r not in told]
        if not silent:
            continue
        out.append(
            Problem(
                "fatal",
                f"{log.file}: rank {silent[0]} of the {len(ranks)} {size_ref.location} names"
                f" printed no start (no checkpoint load, no fresh start) while rank"
                f" {or_none(_rank(said[0].ref))} did ({said[0].ref.location}), and cycle"
                f" {log.cycle} trained: the {run.workload} workload prints one on every rank"
                " before it trains, so what that rank trained from is unknown",
                said[0].ref,
            )
        )
    return tuple(out)


def unexited(run: RunEvidence, adapter: WorkloadLogAdapter) -> list[Problem]:
    """The last cycle of a run whose launcher exited 0 on its own, where the workload prints its
    clean exit on every rank (``exits_on_every_rank``: the reference workload's ``exit code
    0``, after ``training finished``), without that line from a rank that printed in it: the log
    was cut after the milestone, and what that rank's last lines said is unknown. (A last log
    without the milestone is consistency's to refuse.)"""
    if not exits_on_every_rank(adapter):
        return []
    found = clean_exit_last_log(run)
    world = world_ranks(run)
    if found is None or world is None:
        return []
    last, exit_ref = found
    ranks, size_ref = world
    exited = {_rank(e.ref) for e in last.of_type(ProcessExited)}
    silent = [r for r in ranks if r in last.ranks and r not in exited]
    if not silent:
        return []
    ends = last.last_line or exit_ref
    return [
        Problem(
            "fatal",
            f"{exit_ref.location} says the launcher exited 0, but {last.file}, the"
            f" last cycle's log, holds no 'exit code 0' line of rank {silent[0]} of the"
            f" {len(ranks)} {size_ref.location} names (it ends at {ends.location}): the"
            f" {run.workload} workload prints one on every rank as its last line, so the log is"
            " cut short and what that rank did last is unknown",
            ends,
        )
    ]


_LOADED = (LoadStarted, LoadCompleted, *LOAD_FAILURES)
_DUMPED_BEFORE = (
    LoadStarted,
    LoadCompleted,
    *LOAD_FAILURES,
    StartedFromScratch,
    SaveScheduled,
    SaveCompleted,
)


def undumped(run: RunEvidence) -> list[Problem]:
    """A cycle of a workload that dumps its settings (:func:`dumps_settings`) that trained,
    loaded or saved and printed no setting: every committed Megatron cycle that did any of it
    printed its whole dump first, so a missing one is a log cut or edited, and what the cycle
    was started with (no_load_rng, another lr) cannot be compared."""
    out: list[Problem] = []
    for log in run.cycle_logs:
        if not log.exists or log.settings:
            continue
        deeds = [e.ref for e in log.events if isinstance(e, _DUMPED_BEFORE)][:1]
        if log.first_iteration is not None:
            deeds.append(log.first_iteration.ref)
        if not deeds:
            continue
        did = min(deeds, key=lambda ref: ref.line or 0)
        out.append(
            Problem(
                "fatal",
                f"{log.file}: cycle {log.cycle} trained, loaded or saved ({did.location}) but"
                f" printed no argument dump: the {run.workload} workload prints every setting"
                " before it does any of it, so what this cycle was started with (no_load_rng,"
                " its load path, its learning rate) cannot be compared",
                did,
            )
        )
    return out


def cross_check_lines(run: RunEvidence, adapter: WorkloadLogAdapter) -> list[Problem]:
    """The lines a cross-check reads, missing where the run says they were printed (module
    doc): without them manifest_agreement (started, versions), durability (tracker readings)
    and the load checks (fresh start) compare nothing. Measured: every committed run has each
    of them wherever it is asked here. Only cycles that trained are asked (a cycle stopped
    before its first step may have printed none)."""
    logs = [log for log in run.cycle_logs if log.exists and not log.read_error]
    trained = [log for log in logs if log.iteration_lines > 0]
    out: list[Problem] = []

    def missing(log: CycleLog, what: str, why: str) -> None:
        at = log.first_iteration.ref if log.first_iteration is not None else log.first_line
        out.append(
            Problem(
                "fatal",
                f"{log.file}: cycle {log.cycle} trained"
                f"{f' ({at.location})' if at is not None else ''} but holds no {what}: {why}",
                at,
            )
        )

    world = world_ranks(run)
    if world is not None and starts_on_every_rank(adapter):
        ranks, size_ref = world
        for log in trained:
            told = {_rank(e.ref) for e in log.of_type(ProcessStarted)}
            # a rank that printed no line at all in a restoring cycle did not load: that is
            # optimizer_state_load's FAIL (a fresh start's is required_problems' below)
            silent = [r for r in ranks if r not in told and r in log.ranks]
            if silent:
                missing(
                    log,
                    f"'started ... world_size' line of rank {silent[0]}",
                    f"the {run.workload} workload prints one on every rank of the"
                    f" {len(ranks)} {size_ref.location} names before it trains",
                )
    # every component a cycle printed the version of, with the first line that printed it;
    # those a release run.json records prints in every process, with that record's line
    printed: dict[str, EvidenceRef] = {}
    for log in logs:
        for event in log.of_type(VersionReported):
            printed.setdefault(event.component, event.ref)
    release = _release_printing_versions(run, adapter)
    stated: dict[str, str] = {}
    if release is not None:
        version, ref, components = release
        for name in components:
            if name not in printed:
                printed[name] = ref
                stated[name] = f"{run.workload} {version}"
    for log in trained if printed else ():
        have = {event.component for event in log.of_type(VersionReported)}
        # a release prints them on rank 0 (Megatron's print_rank_0): not in another node's log
        lacking = [
            name for name in printed if name not in have and (name not in stated or 0 in log.ranks)
        ]
        if not lacking:
            continue
        shown = printed[lacking[0]]
        if lacking[0] in stated:
            missing(
                log,
                f"version line of {lacking[0]}",
                f"{shown.location} records {stated[lacking[0]]}, which prints its versions first"
                " thing in every process",
            )
        else:
            missing(
                log,
                f"version line of {lacking[0]} ('{shown.text.split(': ', 1)[-1][:40]}...')",
                f"{shown.location} printed it and every cycle runs the same build, which"
                " prints its versions at start",
            )
    for log in trained:
        loaded = any(
            isinstance(e, (LoadStarted, LoadCompleted, *LOAD_FAILURES)) for e in log.events
        )
        if not loaded and not log.of_type(StartedFromScratch):
            missing(
                log,
                "checkpoint load and no fresh start",
                f"the {run.workload} workload prints one or the other before it trains, so"
                " what this cycle trained from is unknown",
            )
    _tracker_lines(run, logs, trained, missing)
    return out


def _release_printing_versions(
    run: RunEvidence, adapter: WorkloadLogAdapter
) -> tuple[str, EvidenceRef, tuple[str, ...]] | None:
    """The release of the workload run.json's stack records, its line and the components whose
    versions that release prints in every process (:func:`versions_printed`); None: no stack,
    a workload or release that prints none (core_v0.18.2)."""
    manifest = run.manifest
    if manifest is None:
        return None
    version = manifest.stack.get(adapter.name)
    ref = manifest.stack_refs.get(adapter.name)
    components = versions_printed(adapter, version)
    if not components or ref is None or not isinstance(version, str):
        return None
    return version, ref, components


def _tracker_lines(
    run: RunEvidence,
    logs: Sequence[CycleLog],
    trained: Sequence[CycleLog],
    missing: Callable[[CycleLog, str, str], None],
) -> None:
    """Rank 0's injector lines about the tracker (module doc), each required where the run says
    it was printed: the announcement (``reading checkpoint tracker ...``) in every cycle that
    trained where rank 0 printed a line, when run.json's ``tracker_readings`` or another cycle's
    announcement says the injector makes one; a reading (``checkpoint tracker reads N``) in
    every such cycle that loaded or finalized a checkpoint (the tracker then named one while rank
    0's probes ran), when a reading, an announcement or run.json says the injector logs them.
    Runs recorded before the injector announced its readings say neither, so in them every
    reading deleted at once is not seen."""
    manifest = run.manifest
    flag = manifest.tracker_readings if manifest is not None else None
    recorded = flag.ref if flag is not None and flag.value is True else None
    lines = [line for log in logs for line in log.injector]
    announced = next((x.ref for x in lines if x.kind == "observing"), recorded)
    read = next((x.ref for x in lines if x.kind == "tracker"), announced)
    if read is None:
        return
    for log in trained:
        if 0 not in log.ranks:
            continue  # another node's log: rank 0 printed nowhere here
        kinds = {x.kind for x in log.injector if x.rank == 0}
        if announced is not None and "observing" not in kinds:
            missing(
                log,
                "announcement of rank 0's tracker readings ('reading checkpoint tracker ...')",
                f"this run's injector makes it on rank 0 as every process starts"
                f" ({announced.location})",
            )
        tracked = any(isinstance(e, (*_LOADED, SaveCompleted)) for e in log.events)
        if tracked and "tracker" not in kinds:
            missing(
                log,
                "checkpoint tracker reading of the injector ('checkpoint tracker reads N')",
                f"this run's injector reads the tracker on rank 0 in every cycle"
                f" ({read.location}) and this cycle loaded or finalized a checkpoint;"
                " durability compares the readings with the finalizations",
            )
