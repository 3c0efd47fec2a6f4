"""Problems no single parser can see: artifacts that contradict each other or themselves.

The parsers report a file that is missing, unreadable or of the wrong type; here the records are
compared with each other. A contradiction that leaves nothing to trust is fatal (the run cannot
be judged, ``verify`` exits 2); one that a criterion judges is a warning shown beside it. What a
parser found contradicting what its writer always writes is reported here, fatal: run.json
against itself (``Manifest.contradictions``), the cycle records against NVRx's
(``CycleInfos.contradictions``, and :func:`_last_cycle_unended`), a tracker holding no
iteration (:func:`_tracker_junk`), and a plant that acted in a run that names another or none
(:func:`_plant_records_problems`, issue #25).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pytest_nvrx.evidence.cycle_infos import unended
from pytest_nvrx.evidence.cycle_log import CycleLog
from pytest_nvrx.evidence.plant_records import read_plant_records
from pytest_nvrx.evidence.refs import EvidenceRef, Problem, is_ascii_number, split_rank_prefix
from pytest_nvrx.evidence.rundir import RunEvidence
from pytest_nvrx.evidence.workload import (
    LoadCompleted,
    Milestone,
    MilestoneLookalike,
    WorkloadLogAdapter,
    get_adapter,
    printed_by_rank_0_only,
    stated_rank,
)


def evidence_problems(run: RunEvidence) -> tuple[Problem, ...]:
    """What the run's artifacts say that cannot all be true."""
    problems: list[Problem] = []
    for record in run.cycles:
        if record.start is not None and record.end is not None and record.end < record.start:
            problems.append(
                Problem(
                    "fatal",
                    f"{record.ref.file}: cycle {record.cycle} ends before it starts"
                    f" ({record.end.isoformat()} < {record.start.isoformat()})",
                    record.end_ref or record.ref,
                )
            )
    if run.cycle_infos.exists:
        recorded = sorted({record.cycle for record in run.cycles})
        listed = ", ".join(map(str, recorded)) or "none"
        for log in run.cycle_logs:
            if log.exists and log.cycle not in recorded:
                # no_repeat_injection fails when such a log shows the job ran again
                problems.append(
                    Problem(
                        "warning",
                        f"{log.file} has no cycle record in {run.cycle_infos.dir}/ (the launcher"
                        f" recorded cycles {listed})",
                        log.first_line,
                    )
                )
    if run.manifest is not None:
        problems += run.manifest.contradictions
    problems += run.cycle_infos.contradictions
    problems += _tracker_junk(run)
    problems += _launch_config_blocks(run)
    problems += _last_cycle_unended(run)
    problems += _misattributed_lines(run)
    problems += _off_rank_0_lines(run)
    problems += _trained_after_finishing(run)
    problems += _finished_without_its_end(run)
    problems += _plant_records_problems(run)
    return tuple(problems)


def _launch_config_blocks(run: RunEvidence) -> list[Problem]:
    """One launch configuration per run: every node's launcher prints the block (the committed
    multi-node runs have one per node, differing only in whether the node hosts the rendezvous
    store), so a block more than the nodes, or one that says another value than the first
    (max_restarts 0, another run_id), is a launcher this run did not have: the settings the
    criteria read from the first block cannot be trusted."""
    launcher = run.launcher
    blocks = launcher.config_blocks
    out: list[Problem] = []
    if launcher.config_conflict is not None:
        later, first = launcher.config_conflict
        out.append(
            Problem(
                "fatal",
                f"{later.location}: a launch-configuration block says {later.text.strip()!r}"
                f" where the first block ({first.location}) says {first.text.strip()!r}: one"
                " launch has one configuration",
                later,
            )
        )
    nodes = launcher.config.get("max_nodes", "")
    if len(blocks) > 1 and is_ascii_number(nodes) and len(blocks) > int(nodes):
        out.append(
            Problem(
                "fatal",
                f"{launcher.file} holds {len(blocks)} launch-configuration blocks"
                f" ({', '.join(b.location for b in blocks[:4])}) in a run of at most {nodes}"
                " node(s), one launcher each: a block no launcher of this run printed",
                blocks[1],
            )
        )
    return out


def _plant_records_problems(run: RunEvidence) -> list[Problem]:
    """A plant's records (``plant-records/``, written by the worker that planted) in a run whose
    run.json names no plant, or names another: a recovery bug acted in a run that claims
    otherwise, so no verdict over it means what it says (fatal); records that cannot be read (a
    ``plant-records/`` linked out of the run, a record that is no record) are fatal in any run,
    planted or not: what a plant did is unknown. A run without run.json claims
    nothing and is judged as its marker names it. The self-test's outcome reads the same records
    (pytest_nvrx.criteria.selftest_outcome), for whether its plant acted at all."""
    manifest = run.manifest
    if manifest is None:
        return []
    records = read_plant_records(run.run_dir)
    claimed = manifest.planted
    where = (
        f"{manifest.plant.ref.location} (config.plant)"
        if manifest.plant is not None
        else f"{manifest.file} (no config.plant)"
    )
    if records.problems:
        first = records.problems[0]
        why = (
            "only a planted run's workers write plant records"
            if claimed is None
            else "what the plant did is unknown"
        )
        named = "no plant" if claimed is None else f"plant {claimed!r}"
        return [
            Problem(
                "fatal",
                f"{first.message}, in a run whose {where} names {named}: {why}",
                first.ref,
            )
        ]
    stranger = next((r for r in records.records if r.plant != claimed), None)
    if stranger is None:
        return []
    named = "no plant" if claimed is None else f"plant {claimed!r}"
    return [
        Problem(
            "fatal",
            f"{stranger.ref.location} records plant {stranger.plant!r} ({stranger.action}),"
            f" but {where} names {named}: a recovery bug acted in a run that claims otherwise",
            stranger.ref,
        )
    ]


def _tracker_junk(run: RunEvidence) -> list[Problem]:
    """The checkpoint tracker holds text that is no iteration (``twenty``, ``-20``): Megatron and
    the reference workload write a non-negative integer (or ``release``), so the file is not
    theirs and which checkpoint the run ended on is unknown. (Empty stays a warning: a write cut
    short by the fault leaves it so.)"""
    tracker = run.tracker
    if not tracker.junk:
        return []
    return [
        Problem(
            "fatal",
            f"checkpoint tracker {tracker.ref.location if tracker.ref else tracker.file} is"
            f" {tracker.error}: the workload writes a non-negative iteration there, so the run's"
            " last checkpoint is unknown",
            tracker.ref,
        )
    ]


def _last_cycle_unended(run: RunEvidence) -> list[Problem]:
    """The last cycle's record holds no end while result.json says the launcher exited on its
    own: NVRx records the open cycle's end as its launcher shuts down (``CycleInfoWriter
    .shutdown``, in the launcher's ``finally``). Only a launcher that was killed (a negative
    exit code, our deadline) leaves it open."""
    manifest = run.manifest
    records = run.cycle_infos.records
    if manifest is None or manifest.exit_code is None or not records:
        return []
    code, last = manifest.exit_code, records[-1]
    timed_out = manifest.timed_out is not None and manifest.timed_out.value is True
    if not unended(last) or not isinstance(code.value, int) or code.value < 0 or timed_out:
        return []
    return [
        Problem(
            "fatal",
            f"{last.ref.file} has no cycle_end_time, but {code.ref.location} says the launcher"
            f" exited with code {code.value}: NVRx records the last cycle's end as its launcher"
            " shuts down",
            last.ref,
        )
    ]


def _first_in_logs[Found](
    run: RunEvidence,
    find: Callable[[CycleLog], Sequence[Found]],
    say: Callable[[Found], tuple[str, EvidenceRef]],
) -> list[Problem]:
    """The first finding of ``find`` over the cycle logs in cycle order, as one fatal problem
    (``say`` gives its message and the line it quotes)."""
    for log in run.cycle_logs:
        found = find(log)
        if found:
            message, ref = say(found[0])
            return [Problem("fatal", message, ref)]
    return []


def _misattributed_lines(run: RunEvidence) -> list[Problem]:
    """A workload that states its rank inside its lines (``stated_rank``) contradicts a line
    under another rank's NVRx prefix: then no rank's lines can be told apart from another's, and
    what "every rank loaded" means is lost (fatal). Only the lines that are evidence are read."""
    adapter = get_adapter(run.workload)

    def say(wrong: tuple[EvidenceRef, int, int]) -> tuple[str, EvidenceRef]:
        ref, prefix, said = wrong
        return (
            f"{ref.location} is prefixed as rank {prefix}'s line but says rank {said}:"
            " the log does not tell which rank printed what",
            ref,
        )

    return _first_in_logs(run, lambda log: misattributed_lines(log, adapter), say)


def _off_rank_0_lines(run: RunEvidence) -> list[Problem]:
    """A line the workload prints on rank 0 alone (a save, a load, an FT deadline: see
    ``printed_by_rank_0_only``) under another rank's prefix: rank 0's record of it is missing,
    and the rank that has it never prints one, so what the run saved or loaded is unknown
    (fatal)."""
    adapter = get_adapter(run.workload)

    def say(off: tuple[EvidenceRef, int]) -> tuple[str, EvidenceRef]:
        ref, prefix = off
        return (
            f"{ref.location} is rank {prefix}'s line, but the {run.workload} workload"
            " prints this line on rank 0 alone: rank 0's is missing and this one no"
            " rank of the workload printed",
            ref,
        )

    return _first_in_logs(run, lambda log: off_rank_0_lines(log, adapter), say)


def _trained_after_finishing(run: RunEvidence) -> list[Problem]:
    """A process prints its ``training finished`` milestone after its last iteration: an
    iteration line of the same rank after it says the process trained on after it finished
    (or the lines were reordered), so which iteration it ended at is unknown (fatal)."""

    def say(later: tuple[EvidenceRef, EvidenceRef]) -> tuple[str, EvidenceRef]:
        done, it = later
        return (
            f"{it.location} is an iteration line after {done.location} said the same"
            " rank finished training: a process finishes after its last iteration",
            it,
        )

    return _first_in_logs(run, iterations_after_finish, say)


def clean_exit_last_log(run: RunEvidence) -> tuple[CycleLog, EvidenceRef] | None:
    """The last cycle log of a run whose result.json says the launcher exited 0 and did not
    time out, with the result.json line that says so: the last cycle the launcher recorded
    (every cycle where there is no cycle_infos/; a later log without a record is flagged
    apart), read; None for any other run."""
    manifest = run.manifest
    if manifest is None or manifest.exit_code is None:
        return None
    timed_out = manifest.timed_out is not None and manifest.timed_out.value is True
    if manifest.exit_code.value != 0 or timed_out:
        return None
    recorded = {record.cycle for record in run.cycles}
    logs = [log for log in run.cycle_logs if log.exists and log.read_error is None]
    last = max(
        (log for log in logs if log.cycle in recorded or not run.cycle_infos.exists),
        key=lambda log: log.cycle,
        default=None,
    )
    return None if last is None else (last, manifest.exit_code.ref)


def _finished_without_its_end(run: RunEvidence) -> list[Problem]:
    """result.json says the launcher exited 0 on its own, so the last cycle's workers finished
    training, and every workload prints its ``training finished`` milestone before it exits 0
    (the reference workload's ``training finished iteration N``, Megatron's ``[after training
    is done] datetime: ...``). A last cycle log without it was cut before its end: where
    training ended is unknown, and what the cut lines said (fatal). Only the line as the
    workload prints it counts (see :func:`not_the_end`): a line that is almost it is named."""
    found = clean_exit_last_log(run)
    if found is None:
        return []
    last, code = found
    almost = not_the_end(run, last)
    if almost is None:
        return []
    ends = f"ends at {last.last_line.location}" if last.last_line else "is empty"
    head = f"{code.location} says the launcher exited 0, but {last.file}, the last cycle's log,"
    if not almost:
        return [
            Problem(
                "fatal",
                f"{head} {ends} without the workload's 'training finished' line, which it prints"
                " before every clean exit: the log is cut short, so where training ended is"
                " unknown",
                last.last_line or code,
            )
        ]
    ref, why = almost[0]
    return [
        Problem(
            "fatal",
            f"{head} {ends} without the workload's 'training finished' line as it prints it"
            f" before every clean exit: {ref.location} is almost it, but {why}; a line that is"
            " almost the milestone is not it, so where training ended is unknown",
            ref,
        )
    ]


def not_the_end(run: RunEvidence, log: CycleLog) -> list[tuple[EvidenceRef, str]] | None:
    """None when ``log`` holds the workload's ``training_done`` milestone exactly as it prints
    it: its whole line (the adapter reads no other as a Milestone), under the NVRx rank prefix
    of the rank that prints it (rank 0 where the workload prints it there alone), naming the
    iteration the log's process finished at where the line names one (see _final_iteration).
    Else the lines that are almost it, each with why it is not, first line first (empty: no
    line is)."""
    adapter = get_adapter(run.workload)
    final = _final_iteration(run, log)
    almost: list[tuple[EvidenceRef, str]] = []
    for event in log.events:
        why: str | None
        if isinstance(event, MilestoneLookalike) and event.name == "training_done":
            why = event.why
        elif isinstance(event, Milestone) and event.name == "training_done":
            why = _why_not_the_end(adapter, event, final)
            if why is None:
                return None
        else:
            continue
        almost.append((event.ref, why))
    return sorted(almost, key=lambda a: a[0].line or 0)


def _why_not_the_end(
    adapter: WorkloadLogAdapter, done: Milestone, final: tuple[int, EvidenceRef] | None
) -> str | None:
    rank = split_rank_prefix(done.ref.text)[0]
    if rank is None:
        return "it has no rank prefix, which the launcher puts on every line a rank prints"
    if not done.ref.text.startswith(f"{rank}: "):
        return f"its rank prefix is not the launcher's '{rank}: '"
    if rank != 0 and printed_by_rank_0_only(adapter, done):
        return f"it is rank {rank}'s line and the workload prints it on rank 0 alone"
    if done.iteration is not None and final is not None and done.iteration != final[0]:
        return (
            f"it names iteration {done.iteration}, and the process finished at iteration"
            f" {final[0]} ({final[1].location})"
        )
    return None


def _final_iteration(run: RunEvidence, log: CycleLog) -> tuple[int, EvidenceRef] | None:
    """The iteration the workload finished at in ``log``, the number its milestone names: the
    last iteration line's (printed at the loop's end), else rank 0's load (a process restored at
    its end trains none), else run.json's train_iters; None where none says."""
    it = log.last_iteration
    if it is not None:
        return it.iteration, it.ref
    loads = [e for e in log.of_type(LoadCompleted) if split_rank_prefix(e.ref.text)[0] == 0]
    if loads:
        return loads[-1].iteration, loads[-1].ref
    told = run.manifest.train_iters if run.manifest is not None else None
    if told is not None and isinstance(told.value, int) and not isinstance(told.value, bool):
        return told.value, told.ref
    return None


def iterations_after_finish(log: CycleLog) -> list[tuple[EvidenceRef, EvidenceRef]]:
    """The iteration lines of ``log`` printed after the ``training_done`` milestone of the same
    rank's stream (the milestone, the iteration), first milestone first."""
    out = []
    for done in log.events:
        if not isinstance(done, Milestone) or done.name != "training_done":
            continue
        rank, line = split_rank_prefix(done.ref.text)[0], done.ref.line or 0
        out += [
            (done.ref, it.ref)
            for it in log.iterations
            if (it.ref.line or 0) > line and split_rank_prefix(it.ref.text)[0] == rank
        ][:1]
    return out


def off_rank_0_lines(log: CycleLog, adapter: WorkloadLogAdapter) -> list[tuple[EvidenceRef, int]]:
    """The lines of ``log`` the workload prints on rank 0 alone found under another rank's
    prefix (the reference, the prefix), first line first."""
    off = [
        (event.ref, prefix)
        for event in log.events
        if printed_by_rank_0_only(adapter, event)
        and (prefix := split_rank_prefix(event.ref.text)[0]) is not None
        and prefix != 0
    ]
    return sorted(off, key=lambda o: o[0].line or 0)


def misattributed_lines(
    log: CycleLog, adapter: WorkloadLogAdapter
) -> list[tuple[EvidenceRef, int, int]]:
    """The lines of ``log`` whose NVRx prefix names another rank than the line states (the
    reference, the prefix, the stated rank), first line first. The fault injector states its
    rank in every line whatever the workload: one of its lines under another rank's prefix (a
    fire line in the stream of a rank it did not kill) is the same contradiction."""
    wrong = [
        (line.ref, prefix, line.rank)
        for line in log.injector
        if (prefix := split_rank_prefix(line.ref.text)[0]) is not None and prefix != line.rank
    ]
    if getattr(adapter, "stated_rank", None) is not None:
        wrong += [
            (event.ref, prefix, said)
            for event in (*log.iterations, *log.events)
            for prefix, text in (split_rank_prefix(event.ref.text),)
            if prefix is not None
            and (said := stated_rank(adapter, text)) is not None
            and said != prefix
        ]
    return sorted(wrong, key=lambda w: w[0].line or 0)
