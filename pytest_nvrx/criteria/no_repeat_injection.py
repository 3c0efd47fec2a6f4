"""Criterion 5: the launcher finished successfully after exactly one injected failure: no second
failure, no no-progress stop (EARLY TERMINATION / exit code 93); a baseline, in one cycle with
none at all."""

from __future__ import annotations

from pytest_nvrx.criteria.context import JudgeContext
from pytest_nvrx.criteria.expected import ExpectedFault
from pytest_nvrx.criteria.helpers import (
    launcher_words,
    marker_ref,
    timed_out_failure,
    workload_failures,
)
from pytest_nvrx.criteria.verdict import CriterionId, Verdict, failing, passing, unjudgeable
from pytest_nvrx.evidence.cycle_log import CycleLog
from pytest_nvrx.evidence.launcher_log import LauncherEventKind
from pytest_nvrx.evidence.refs import EvidenceRef
from pytest_nvrx.evidence.rundir import RunEvidence

ID: CriterionId = "no_repeat_injection"


def no_repeat_injection(run: RunEvidence, expected: ExpectedFault | None = None) -> Verdict:
    """The launcher finished successfully after exactly one injected failure: no second failure,
    no no-progress stop (EARLY TERMINATION / exit code 93)."""
    return check(JudgeContext.build(run, expected))


def _ran_after(run: RunEvidence, cycle: int) -> CycleLog | None:
    """The first log of a cycle after ``cycle`` whose workers printed a line: they ran again,
    whatever the launcher's records say."""
    return next(
        (g for g in run.cycle_logs if g.cycle > cycle and g.exists and g.first_line is not None),
        None,
    )


def check(ctx: JudgeContext) -> Verdict:
    run, timeline = ctx.run, ctx.timeline
    launcher = run.launcher
    manifest = run.manifest
    exit_code = manifest.exit_code if manifest is not None else None
    stops = launcher.of_kind(
        LauncherEventKind.EARLY_TERMINATION,
        LauncherEventKind.NO_RESTART,
        LauncherEventKind.RUN_FAILED,
    )
    bad_exits = [
        e for e in launcher.of_kind(LauncherEventKind.AGENT_EXIT) if e.exit_code not in (None, 0)
    ]
    if stops or bad_exits:
        first = (stops or tuple(bad_exits))[0]
        what = (
            "no-progress stop"
            if first.kind is LauncherEventKind.EARLY_TERMINATION
            else "failed run"
        )
        return failing(
            ID,
            f"launcher stopped ({what}): {launcher_words(first.ref)}",
            [e.ref for e in (*stops, *bad_exits)][:4],
            exit_code.ref if exit_code else None,
        )
    timed = timed_out_failure(ID, run, "finish")
    if timed is not None:
        return timed
    if exit_code is not None and exit_code.value != 0:
        why = " (no-progress stop)" if exit_code.value == 93 else ""
        return failing(
            ID,
            f"launcher exited with code {exit_code.value}{why}",
            exit_code.ref,
            ctx.launcher_outcome,
        )
    finished = launcher.of_kind(LauncherEventKind.RUN_OK, LauncherEventKind.GROUP_SUCCEEDED)
    clean_exits = [e for e in launcher.of_kind(LauncherEventKind.AGENT_EXIT) if e.exit_code == 0]
    successes = (*finished, *clean_exits)
    if not successes and exit_code is None:
        return failing(ID, "the launcher recorded no successful finish", ctx.launcher_outcome)
    if not successes and exit_code is not None and launcher.exists:
        # ft_launcher prints these on every successful exit: its log was cut before its end,
        # so what the launcher did last is unknown (result.json alone is not its record)
        return unjudgeable(
            ID,
            f"{exit_code.ref.location} says the launcher exited 0, but {launcher.file} ends"
            f" ({launcher.last.ref.location if launcher.last.ref else 'empty'}) before the lines"
            " ft_launcher prints on every successful exit ('worker group successfully"
            " finished', 'Agent .run() is OK'): its log is cut short",
            exit_code.ref,
            launcher.last.ref,
        )
    success_refs = [e.ref for e in successes][-1:] + ([exit_code.ref] if exit_code else [])
    marker = run.marker
    if ctx.expected.baseline:
        failures = [*timeline.failure_events, *timeline.other_failures]
        if marker is not None:
            return failing(ID, "baseline run (fault=none) has an injection marker", marker.ref())
        if failures:
            return failing(
                ID,
                f"baseline run recorded a worker failure: {failures[0].ref.text.strip()}",
                [e.ref for e in failures[:3]],
            )
        if len(run.cycles) > 1:
            return failing(
                ID,
                f"baseline run needed {len(run.cycles)} cycles: it was restarted",
                [r.ref for r in run.cycles],
            )
        # a later cycle's log, recorded or not: the workers ran again all the same
        log = _ran_after(run, min((r.cycle for r in run.cycles), default=0))
        if log is not None:
            return failing(
                ID,
                f"{log.file} shows cycle {log.cycle} ran (the launcher's records have"
                f" {len(run.cycles)} cycle(s)): the baseline was restarted",
                log.first_line,
                log.last_line,
                [r.ref for r in run.cycles][:2],
            )
        reported = workload_failures(run, None)
        if reported:
            return failing(
                ID,
                f"baseline run's workload reported a failure: {reported[0].text.strip()}",
                reported[:3],
                success_refs,
            )
        unrecorded = _unrecorded_baseline(run, bool(finished or clean_exits))
        if unrecorded is not None:
            return unrecorded
        return passing(
            ID,
            "baseline finished successfully in one cycle with no injection and no failure",
            success_refs,
            ctx.expected.ref,
            run.cycles[0].ref if run.cycles else None,
        )
    if marker is None:
        return failing(
            ID,
            "no injection happened (no marker): exactly one was requested",
            marker_ref(run),
            success_refs,
        )
    if not marker.ok:
        return failing(ID, f"injection marker unusable: {marker.error}", marker.ref())
    started = timeline.replacement_started
    if timeline.other_failures:
        e = timeline.other_failures[0]
        when = (
            "after the replacement started"
            if started is not None
            and e.ref.line is not None
            and started.ref.line is not None
            and e.ref.line > started.ref.line
            else "besides the injected one"
        )
        return failing(
            ID,
            f"a second failure {when}: {launcher_words(e.ref)}",
            [x.ref for x in timeline.other_failures[:3]],
            started.ref if started else None,
        )
    fired = [line for log in run.cycle_logs for line in log.injector if line.kind == "fired"]
    if len(fired) > 1:
        # the marker's O_EXCL claim lets one rank inject once: a second fire line means it did not
        return failing(
            ID,
            f"the injector fired {len(fired)} times: {fired[1].ref.location} after"
            f" {fired[0].ref.location}",
            [line.ref for line in fired[:3]],
            marker.ref("time"),
        )
    replacement = timeline.replacement_cycle
    extra = [r for r in run.cycles if replacement is not None and r.cycle > replacement]
    if extra:
        return failing(
            ID,
            f"the launcher started cycle {extra[0].cycle} after the replacement cycle"
            f" {replacement}: the job failed again",
            [r.ref for r in extra[:2]],
        )
    # a later cycle's log without a cycle record: the workers ran again all the same
    log = _ran_after(run, replacement) if replacement is not None else None
    if log is not None:
        return failing(
            ID,
            f"{log.file} shows cycle {log.cycle} ran after the replacement cycle {replacement}"
            " (the launcher's records have no such cycle): the job ran again",
            log.first_line,
            log.last_line,
        )
    reported = workload_failures(run, replacement) if replacement is not None else []
    if reported:
        # the launcher saw no second failure, but the workload says it failed again
        return failing(
            ID,
            "the workload reported a failure after the replacement started:"
            f" {reported[0].text.strip()}",
            reported[:3],
            started.ref if started else None,
            success_refs,
        )
    return passing(
        ID,
        f"launcher finished successfully after exactly one injected {marker.fault}; no later"
        " failure, no no-progress stop",
        success_refs,
        marker.ref("time"),
        started.ref if started else None,
    )


def _unrecorded_baseline(run: RunEvidence, launcher_finished: bool) -> Verdict | None:
    """A baseline passes on the launcher's own record: "one cycle, no failure" is read from
    launcher.log and the cycle records, which ft_launcher writes for every run (every committed
    baseline, by hand or by the harness, has both: its finish line and ``cycle_info..0.0``).
    result.json's exit code says how the launch ended, not how many cycles ran or which failed:
    without them nothing proves the run was not restarted."""
    launcher = run.launcher
    if not launcher_finished:
        if not launcher.exists:
            missing = EvidenceRef(launcher.file, None, "(absent)")
            why = f"{launcher.file} is missing"
        else:
            missing, why = None, f"{launcher.file} records no successful finish"
        return failing(
            ID,
            f"baseline run: {why}: the launcher writes its finish and every failure and"
            " restart there, and an exit code alone does not say the run ran in one cycle"
            " without a failure",
            missing,
            run.manifest.exit_code.ref
            if run.manifest is not None and run.manifest.exit_code is not None
            else None,
        )
    if not run.cycles:
        return failing(
            ID,
            f"baseline run: no launcher cycle record ({run.cycle_infos.dir}/): ft_launcher"
            " records every cycle it starts, so nothing says in how many cycles the run ran",
            EvidenceRef(run.cycle_infos.dir, None, "(no cycle record)"),
        )
    return None
