"""The marker agrees with the run's other records (#21, "judge from all the evidence"): one-field
edits of committed real passing runs, each a contradiction between fault_injected.json and
run.json, the launcher's records or the injector's own lines, fail the criterion that owns it or
cannot be judged (exit 2); none passes.

Who owns what: prior_checkpoint "which fault happened where" (the requested rank, the window's
probe and section, the tracker and in-flight iteration the injector's lines state),
replaced_cycle "which process died" (the pid the launcher recorded failing, the pid the fire line
signalled). A marker of another run, world or cycle, or one that contradicts itself (its signal
and its fault, its pid and rank_pid), leaves nothing to trust: the run cannot be judged.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from pytest_nvrx.criteria import Judgement, judge_run_dir
from pytest_nvrx.layout import FAULT_SIGNAL_NAMES, INJECTED_FAULTS
from pytest_nvrx.verify import verify_main
from pytest_nvrx.worker import injector
from tests.helpers.doctor import CYCLE0, MARKER, Doctor, copy_run, set_injector_option

DATA = Path(__file__).parents[1] / "data"
REF_KILL_SAVE = DATA / "windows" / "cpu" / "ref-kill-save"
CKPT_WORKER = DATA / "gpu-one" / "ckpt-worker-finalize"
EXCEPTION_STEP = DATA / "gpu-one" / "exception-step"
HANG_FINALIZE = DATA / "windows" / "gpu" / "g2-hang-finalize"
TERM_FINALIZE = DATA / "windows" / "gpu" / "g2-term-finalize"
G2_KILL = DATA / "gpu-continuity" / "g2-kill-30"
ALL = (REF_KILL_SAVE, CKPT_WORKER, EXCEPTION_STEP, HANG_FINALIZE, TERM_FINALIZE, G2_KILL)


def _copy(tmp_path: Path, src: Path) -> Doctor:
    return copy_run(src, tmp_path / src.name)


def _at(run: Doctor, rel: str, needle: str) -> str:
    """``rel:N``, N the line of ``rel`` holding ``needle``."""
    return f"{rel}:{run.line_no(rel, needle)}"


def _exit_code(run: Doctor) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = verify_main([str(run.root)], out, err)
    return code, out.getvalue() + err.getvalue()


def _fails(run: Doctor, criterion: str, *said: str, at: tuple[str, ...] = ()) -> Judgement:
    """The run fails ``criterion`` with a reason containing each of ``said``, quoting the lines
    ``at`` first (exit 1)."""
    judgement = judge_run_dir(run.root)
    verdict = judgement.verdict(criterion)
    assert not verdict.passed, verdict.reason
    for text in said:
        assert text in verdict.reason
    assert [e.location for e in verdict.evidence[: len(at)]] == list(at)
    assert judgement.judgeable, judgement.unjudgeable_reasons
    assert _exit_code(run)[0] == 1
    return judgement


def _cannot_judge(run: Doctor, *said: str) -> str:
    """The run cannot be judged (exit 2), the error naming each of ``said``."""
    judgement = judge_run_dir(run.root)
    assert not judgement.judgeable and not judgement.passed
    assert all(not v.passed or v.not_applicable for v in judgement.verdicts)
    code, text = _exit_code(run)
    assert code == 2, text
    for part in said:
        assert part in text
    return text


@pytest.mark.parametrize("src", ALL, ids=lambda p: p.name)
def test_the_unchanged_runs_pass(src: Path) -> None:
    assert judge_run_dir(src).passed


def test_one_map_of_fault_signals() -> None:
    assert set(FAULT_SIGNAL_NAMES) == set(INJECTED_FAULTS)
    for fault in INJECTED_FAULTS:
        sig = injector.FAULT_SIGNALS.get(fault)
        assert FAULT_SIGNAL_NAMES[fault] == (sig.name if sig is not None else None)


# -- C. the marker against run.json and the launcher --


def test_a_fault_requested_on_another_rank_than_the_marker_names_fails(tmp_path: Path) -> None:
    run = _copy(tmp_path, REF_KILL_SAVE)
    run.replace("run.json", '"fault_rank": 1', '"fault_rank": 0')
    set_injector_option(run, "--fault-rank", 0)  # run.json asked it of rank 0 throughout
    _fails(
        run,
        "prior_checkpoint",
        "the fault was requested on rank 0 (run.json config.fault_rank) but the marker records"
        " rank 1: the requested fault never happened on the requested rank",
        at=(_at(run, "run.json", '"fault_rank"'), _at(run, MARKER, '"rank":')),
    )


def test_a_marker_of_another_run_id_cannot_be_judged(tmp_path: Path) -> None:
    run = _copy(tmp_path, REF_KILL_SAVE)
    run.replace(MARKER, '"run_id": "ks1"', '"run_id": "zz9"')
    _cannot_judge(run, "fault_injected.json:19 records run id 'zz9'", "run.json:", "'ks1'")


def test_a_marker_watching_another_runs_tracker_cannot_be_judged(tmp_path: Path) -> None:
    run = _copy(tmp_path, REF_KILL_SAVE)
    run.replace(MARKER, '"tracker": "/tmp/wt/runs/ks1/', '"tracker": "/tmp/wt/runs/OTHER/')
    _cannot_judge(
        run,
        "fault_injected.json:24 records tracker /tmp/wt/runs/OTHER/checkpoints/",
        "/tmp/wt/runs/ks1/checkpoints/latest_checkpointed_iteration.txt",
    )


def test_a_marker_of_another_world_size_cannot_be_judged(tmp_path: Path) -> None:
    run = _copy(tmp_path, REF_KILL_SAVE)
    run.replace(MARKER, '"world_size": 2', '"world_size": 4')
    _cannot_judge(run, "fault_injected.json:28 records world size 4", "run.json:", "ran 2")


def test_a_marker_restart_count_past_its_cycle_cannot_be_judged(tmp_path: Path) -> None:
    run = _copy(tmp_path, REF_KILL_SAVE)
    run.replace(MARKER, '"restart_count": 0', '"restart_count": 1')
    _cannot_judge(run, "fault_injected.json:18 records restart count 1", "in cycle 0 (cycle_infos/")


def test_a_section_the_trigger_cannot_have_open_fails(tmp_path: Path) -> None:
    run = _copy(tmp_path, REF_KILL_SAVE)
    run.replace(MARKER, '"section": "checkpointing"', '"section": "step"')
    _fails(
        run,
        "prior_checkpoint",
        "the marker says section step was open when save submit fired, but that probe records"
        " section checkpointing or none",
        at=(_at(run, MARKER, '"section"'), _at(run, MARKER, '"trigger"')),
    )


def test_a_ckpt_worker_rank_pid_the_launcher_never_saw_fail_fails(tmp_path: Path) -> None:
    run = _copy(tmp_path, CKPT_WORKER)
    run.replace(MARKER, '"rank_pid": 1813', '"rank_pid": 1814')
    _fails(
        run,
        "replaced_cycle",
        "the launcher recorded the failure of local_rank 0 as pid 1813, but the marker says"
        " the rank was pid 1814",
        at=("logs/launcher.log:40", _at(run, MARKER, '"rank_pid"')),
    )


def test_an_exception_rank_pid_the_launcher_never_saw_fail_fails(tmp_path: Path) -> None:
    """rank_pid 1039 also contradicts the marker's own pid 1038: cannot be judged, and
    replaced_cycle names the launcher's pid."""
    run = _copy(tmp_path, EXCEPTION_STEP)
    run.replace(MARKER, '"rank_pid": 1038', '"rank_pid": 1039')
    _cannot_judge(run, "pid 1038 and rank_pid 1039", "exception is raised by the rank itself")
    c2 = judge_run_dir(run.root).verdict("replaced_cycle")
    assert not c2.passed
    assert "recorded the failure of local_rank 0 as pid 1038" in c2.reason


def test_an_exception_marker_whose_pid_is_not_its_rank_pid_cannot_be_judged(
    tmp_path: Path,
) -> None:
    run = _copy(tmp_path, EXCEPTION_STEP)
    run.replace(MARKER, '"pid": 1038', '"pid": 1039')
    _cannot_judge(run, "fault_injected.json:", "pid 1039 and rank_pid 1038")


def test_a_ckpt_worker_marker_aimed_at_the_rank_itself_cannot_be_judged(tmp_path: Path) -> None:
    run = _copy(tmp_path, CKPT_WORKER)
    run.replace(MARKER, '"pid": 1897', '"pid": 1813')
    _cannot_judge(run, "pid 1813 and rank_pid 1813", "the checkpoint worker is not the rank")


@pytest.mark.parametrize(
    ("src", "recorded", "doctored", "wanted"),
    [
        (HANG_FINALIZE, "SIGSTOP", "SIGKILL", "SIGSTOP"),
        (TERM_FINALIZE, "SIGTERM", "SIGINT", "SIGTERM"),
    ],
    ids=["hang-SIGKILL", "term-SIGINT"],
)
def test_a_signal_its_fault_never_sends_cannot_be_judged(
    tmp_path: Path, src: Path, recorded: str, doctored: str, wanted: str
) -> None:
    run = _copy(tmp_path, src)
    run.replace(MARKER, f'"signal": "{recorded}"', f'"signal": "{doctored}"')
    _cannot_judge(run, f"records signal {doctored}", f"sends {wanted}")


def test_an_exception_marker_with_a_signal_cannot_be_judged(tmp_path: Path) -> None:
    run = _copy(tmp_path, EXCEPTION_STEP)
    run.replace(MARKER, '"signal": null', '"signal": "SIGKILL"')
    _cannot_judge(run, "records signal SIGKILL", "sends none")


def test_a_term_fault_on_the_ckpt_worker_probe_fails(tmp_path: Path) -> None:
    run = _copy(tmp_path, TERM_FINALIZE)
    run.replace(
        MARKER,
        '"trigger": "start_section(checkpointing)"',
        '"trigger": "end_section(checkpointing)"',
    )
    _fails(
        run,
        "prior_checkpoint",
        "end_section(checkpointing) fires only ckpt-worker, not term",
        at=(_at(run, MARKER, '"trigger"'), _at(run, MARKER, '"fault"')),
    )


# -- D. the injector's own lines against the marker --


def test_a_legacy_fire_line_naming_another_tracker_fails(tmp_path: Path) -> None:
    run = _copy(tmp_path, G2_KILL)
    run.replace(CYCLE0, "advanced 0 -> 5; marker", "advanced 0 -> 10; marker")
    _fails(
        run,
        "prior_checkpoint",
        "the injector's fire line says the tracker advanced 0 -> 10 and it sent SIGKILL; the"
        " marker says baseline 0, tracker 5, signal SIGKILL",
        at=(f"{CYCLE0}:1056", _at(run, MARKER, '"tracker_iteration"')),
    )


def test_a_legacy_fire_line_signalling_another_pid_fails(tmp_path: Path) -> None:
    run = _copy(tmp_path, G2_KILL)
    run.replace(CYCLE0, "sending SIGKILL to pid 1460", "sending SIGKILL to pid 1461")
    _fails(
        run,
        "replaced_cycle",
        "the injector's fire line sent SIGKILL to pid 1461; the marker says pid 1460",
        at=(f"{CYCLE0}:1056", _at(run, MARKER, '"pid"')),
    )


@pytest.mark.parametrize("pid", ["538", "77777"])  # the peer's, a pid nobody else printed
def test_a_start_line_of_the_faulted_rank_naming_another_pid_fails(
    tmp_path: Path, pid: str
) -> None:
    run = _copy(tmp_path, REF_KILL_SAVE)
    run.replace(CYCLE0, "rank 1 started pid 539 ", f"rank 1 started pid {pid} ")
    _fails(
        run,
        "replaced_cycle",
        f"rank 1 printed pid {pid} at its start in the faulted cycle; the marker says the rank"
        " was pid 539",
        at=(f"{CYCLE0}:2", _at(run, MARKER, '"rank_pid"')),
    )


def test_a_fire_line_killing_another_checkpoint_worker_fails(tmp_path: Path) -> None:
    run = _copy(tmp_path, CKPT_WORKER)
    run.replace(CYCLE0, "checkpoint worker pid 1897", "checkpoint worker pid 1999")
    _fails(
        run,
        "replaced_cycle",
        "the injector's fire line sent SIGKILL to pid 1999; the marker says pid 1897",
        at=(f"{CYCLE0}:1068", _at(run, MARKER, '"pid"')),
    )


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        (
            "(in-flight iteration 10, tracker 5)",
            "(in-flight iteration 15, tracker 10)",
            "window step, in-flight iteration 15, tracker 10",
        ),
        ("on rank 0 in window step", "on rank 0 in window save", "window save, in-flight"),
    ],
    ids=["iterations", "window"],
)
def test_an_injected_exception_naming_another_window_fails(
    tmp_path: Path, old: str, new: str, said: str
) -> None:
    run = _copy(tmp_path, EXCEPTION_STEP)
    line = run.line_no(CYCLE0, "InjectedFault: pytest-nvrx injected exception")
    run.replace(CYCLE0, old, new)
    _fails(
        run,
        "prior_checkpoint",
        f"the InjectedFault raised says {said}",
        "the marker says window step, in-flight iteration 10, tracker 5",
        at=(f"{CYCLE0}:{line}", _at(run, MARKER, '"window"')),
    )


@pytest.mark.parametrize(
    ("old", "new", "said", "key"),
    [
        (
            "window finalize (start_section(checkpointing))",
            "window finalize (end_section(checkpointing))",
            "the injector's fire line says end_section(checkpointing) fired; the marker says"
            " start_section(checkpointing)",
            '"trigger"',
        ),
        (
            "sending SIGTERM to pid 1198",
            "sending SIGINT to pid 1198",
            "the injector's fire line sent SIGINT; the marker says signal SIGTERM",
            '"signal"',
        ),
    ],
    ids=["probe", "signal"],
)
def test_a_fire_line_of_another_probe_or_signal_fails(
    tmp_path: Path, old: str, new: str, said: str, key: str
) -> None:
    run = _copy(tmp_path, TERM_FINALIZE)
    run.replace(CYCLE0, old, new)
    _fails(run, "prior_checkpoint", said, at=(f"{CYCLE0}:1063", _at(run, MARKER, key)))
