"""An adversarial review of the schedule timings, the run-timeout diagnosis, the feasibility check
and the Megatron first-use build: each test feeds a doctored copy of a committed run, a config or
a Megatron-shaped checkout that the code gets wrong today, and states what it must do instead.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import signal
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from pytest_nvrx.criteria import judge_run_dir
from pytest_nvrx.evidence.rundir import load_run
from pytest_nvrx.launch.prepare_megatron import prepare_checkout
from pytest_nvrx.layout import RunLayout
from pytest_nvrx.report import ScenarioReport
from pytest_nvrx.session.scenario_run import Limits, ScenarioRun
from pytest_nvrx.settings import ConfigError, RunConfig, SectionTimeouts, check_run_timeout
from pytest_nvrx.verify import verify_main
from tests.helpers.doctor import Doctor, copy_run
from tests.helpers.megatron_checkouts import (
    DATASETS,
    MAKEFILE_CORE,
    env_with_path,
    have_compiler,
    megatron_checkout,
    tool_bin,
)

DATA = Path(__file__).parent / "data"
TWO = DATA / "cpu-schedules" / "ref-kill-step+kill-restore"
BUDGET = DATA / "cpu-schedules" / "ref-budget-kill-step+kill-restore+kill-restore"
HANG_STEP_TIMED_OUT = DATA / "cpu-timeout" / "ref-timeout-hang-step"
LAUNCHER = "logs/launcher.log"
needs_compiler = pytest.mark.skipif(not have_compiler(), reason="no g++ and make on this host")


def _scenario_run(root: Path) -> ScenarioRun:
    judgement = judge_run_dir(root)
    return ScenarioRun(
        key=root.name,
        scenario=None,
        layout=RunLayout.for_run(root, judgement.checkpoint_dir),
        judgement=judgement,
    )


def _shift_marker(doc: Doctor, rel: str, seconds: float) -> None:
    data = doc.json(rel)
    data["time"] = (datetime.fromisoformat(data["time"]) + timedelta(seconds=seconds)).isoformat()
    doc.set_json(rel, **data)


# ----------------------------------------------------------------------------------------------
# Schedules and the run timeout


def test_a_timed_out_schedule_run_cannot_pass(tmp_path: Path) -> None:
    """result.json says our run timeout killed the run: a one-fault run fails no_repeat_injection,
    a schedule's whole-run criterion never reads it, so verify says PASSED (exit 0) while its own
    first cause says the run timeout ended the run, and the report says QUALIFIED where the
    console says NOT QUALIFIED."""
    doc = copy_run(TWO, tmp_path / "run")
    doc.set_json("result.json", timed_out=True)
    code = verify_main([str(doc.root)], stdout=io.StringIO(), stderr=io.StringIO())
    judgement = judge_run_dir(doc.root)
    report = ScenarioReport.from_judgement(load_run(doc.root), judgement)
    assert judgement.first_cause is not None and judgement.first_cause.run_timeout
    assert code == 1 and not judgement.passed
    assert report.outcome.startswith("NOT QUALIFIED")


def test_a_restore_fault_marker_before_its_cycle_started_is_no_measurement(tmp_path: Path) -> None:
    """Fault 2's marker (kill@restore) moved 5 s earlier: 0.4 s before its own cycle's workers
    started and 3 s before its rank logged that it started, within the cycle check's 1 s slack.
    The struck recovery's restore is then negative (-0.455 s), its phases longer than its
    downtime, yet verify passes and the gate passes a 5 s limit the real run (7.2 s) breaks."""
    real = _scenario_run(BUDGET)
    assert real.gate_failures(Limits(downtime_s=5.0, shared_gpu=True))  # the real run breaks it
    doc = copy_run(BUDGET, tmp_path / "run")
    _shift_marker(doc, "fault_injected_2.json", -5.0)
    run = _scenario_run(doc.root)
    struck = run.judgement.recoveries[0]
    assert struck.restoring_s is not None and struck.restoring_s < 0  # the contradiction
    assert run.gate_failures(Limits(downtime_s=5.0, shared_gpu=True))
    assert not run.judgement.passed


def test_a_stop_signal_line_in_a_run_that_went_on_cannot_pass(tmp_path: Path) -> None:
    """The launcher's 'Received 15 death signal, shutting down workers' before the first fault of
    a run that then recovered twice and finished (result.json: not timed out) contradicts the
    rest of the log; today it passes 6/6 and QUALIFIED, every detection after that line dropped
    from the timings (fault 1's timings are empty)."""
    doc = copy_run(TWO, tmp_path / "run")
    at = doc.lines(LAUNCHER)[doc.line_no(LAUNCHER, "Cycle: 0 Event: worker_start_completed") - 1]
    doc.insert_after(
        LAUNCHER,
        "Cycle: 0 Event: worker_start_completed",
        at[:23] + " [WARNING] [vm] [workload:?(?) infra:?(?)] launcher.py:571 Received 15 death"
        " signal, shutting down workers, timeout 1800 sec.",
    )
    judgement = judge_run_dir(doc.root)
    assert not judgement.passed


def test_the_run_timeout_cause_never_says_a_negative_wait(tmp_path: Path) -> None:
    """The launcher's stop line stamped 60 s earlier (before the hang's marker): the run stays
    judgeable and its first cause says the hang 'was still undetected -8.2 s later'."""
    doc = copy_run(HANG_STEP_TIMED_OUT, tmp_path / "run")
    n = doc.line_no(LAUNCHER, "death signal")
    lines = doc.lines(LAUNCHER)
    stamp = datetime.strptime(lines[n - 1][:23], "%Y-%m-%d %H:%M:%S,%f") - timedelta(seconds=60)
    lines[n - 1] = stamp.strftime("%Y-%m-%d %H:%M:%S,%f")[:23] + lines[n - 1][23:]
    doc.write_lines(LAUNCHER, lines)
    judgement = judge_run_dir(doc.root)
    cause = judgement.first_cause
    assert cause is not None
    assert not re.search(r"-\d+(?:\.\d+)? s later", cause.text), cause.text


TIMED_OUT = sorted(
    p.parent
    for p in DATA.glob("*/*/result.json")
    if '"timed_out": true' in p.read_text(encoding="utf-8")
)


@pytest.mark.parametrize("src", TIMED_OUT, ids=lambda p: p.name)
def test_a_timed_out_run_without_its_stop_line_cannot_be_judged(tmp_path: Path, src: Path) -> None:
    """Both of the launcher's stop lines deleted from a run result.json says our deadline
    stopped: the stop's -15 exits then read as a fault's detection ("detected ... but not
    recovered", a detection time). The launcher was signalled while running and always logs
    it, so its absence is a contradiction: cannot judge, no timing."""
    assert TIMED_OUT, "no committed timed-out run"
    doc = copy_run(src, tmp_path / "run")
    assert doc.delete(LAUNCHER, "death signal") and doc.delete(LAUNCHER, "got signal: 15")
    judgement = judge_run_dir(doc.root)
    assert not judgement.judgeable
    assert any("told to stop" in m for m in judgement.unjudgeable_reasons), judgement.problems


@pytest.mark.parametrize(
    "name",
    [BUDGET.name, "ref-no-progress-kill-step+3x-kill-restore"],
    ids=["budget", "no-progress"],
)
def test_a_timed_out_run_whose_stop_was_due_is_not_unrecovered(tmp_path: Path, name: str) -> None:
    """A schedule the launcher had to stop after fault 2 (its restart budget) or 4 (NVRx's
    no-progress limit), with result.json saying our run timeout ended it: no recovery was due
    after that fault, so its first cause must not say it was "detected but not recovered"."""
    doc = copy_run(DATA / "cpu-schedules" / name, tmp_path / "run")
    doc.set_json("result.json", timed_out=True)
    judgement = judge_run_dir(doc.root)
    cause = judgement.first_cause
    assert cause is not None and cause.run_timeout
    assert "not recovered" not in cause.text, cause.text
    assert "no recovery was due" in cause.text, cause.text
    assert not judgement.passed


# ----------------------------------------------------------------------------------------------
# Feasibility


def test_a_hang_no_nvrx_section_can_see_is_refused() -> None:
    """The reference workload with -- --no-ft never connects to NVRx's rank monitor, which checks
    section timeouts only for a connected rank (rank_monitor_server._periodic_rank_check): a hang
    is seen only by the peer's 600 s gloo timeout. A 60 s run timeout cannot fit it, yet the
    check counts the step section's 10 s and accepts."""
    config = RunConfig(
        work_dir=Path("/nonexistent-work"),
        run_id="r",
        workload="reference",
        gpus_per_node=2,
        fault_rank=1,
        train_iters=20,
        save_interval=5,
        fault="hang",
        window="step",
        section_timeouts=SectionTimeouts(setup=120, step=10, checkpointing=15),
        extra_args=("--no-ft",),
    )
    with pytest.raises(ConfigError):
        check_run_timeout(config, 60.0)


def test_a_refused_xdist_session_builds_nothing(tmp_path: Path) -> None:
    """Under xdist the feasibility refusal is stashed and reported per test, but gw0 still runs
    the Megatron checkout's first-use make: a refused session writes into the user's checkout
    (without xdist it writes nothing)."""
    pytest.importorskip("xdist")
    checkout = megatron_checkout(
        tmp_path / "checkout",
        makefile="OUT = helpers_data.py\n\ndefault: $(OUT)\n\n$(OUT): helpers.src\n\tcp $< $@\n",
        source="PIECES = []\n",
        source_name="helpers.src",
    )
    env = env_with_path(tool_bin(tmp_path / "bin", compiler=False) + os.pathsep + "/usr/bin:/bin")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "xdist", "-n", "1", "-p", "no:randomly", "-q",
         "--pyargs", "pytest_nvrx.suite", "-m", "gpu", "--nvrx-megatron-path", str(checkout),
         "--nvrx-run-timeout", "5", "--nvrx-work-dir", str(tmp_path / "work"), "-x"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert "cannot fit" in proc.stdout + proc.stderr
    assert not (checkout / DATASETS / "helpers_data.py").exists()


# ----------------------------------------------------------------------------------------------
# The Megatron first-use build


def test_run_make_is_bounded_when_a_recipe_leaves_a_process_on_its_output(tmp_path: Path) -> None:
    """A recipe that starts a process in a session of its own (a compiler server, a daemon)
    which keeps make's stdout: after the timeout run_make kills make's group, then waits without
    a bound for that process to close the pipe (here 20 s for a 1 s timeout; forever for a
    daemon). A make that exited 0 at once is reported as a timeout."""
    pidfile = tmp_path / "daemon.pid"
    (tmp_path / "Makefile").write_text(
        f"default:\n\tsetsid sh -c 'echo $$$$ > {pidfile}; exec sleep 20' &\n\techo started\n"
    )
    code = (
        "import subprocess, sys, time\n"
        "from pytest_nvrx.megatron.build import run_make\n"
        "t = time.monotonic()\n"
        "try:\n"
        f"    run_make('make', ['-C', {str(tmp_path)!r}], {{'PATH': '/usr/bin:/bin'}},"
        " timeout_s=1)\n"
        "except subprocess.TimeoutExpired:\n"
        "    pass\n"
        "print(round(time.monotonic() - t, 1))\n"
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
        waited = float(proc.stdout.strip().splitlines()[-1])
    finally:
        if pidfile.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pidfile.read_text()), signal.SIGKILL)
    assert waited < 10, f"run_make with a 1 s timeout returned after {waited} s"


@needs_compiler
def test_sources_in_a_subdirectory_are_not_refused(tmp_path: Path) -> None:
    """make -C builds it in place (Megatron's own first-use build succeeds), but the build runs on
    a copy of the directory's regular files only: src/helpers.cpp is missing there and the
    checkout is refused, with a hint to install pybind11 (make's own 'No rule to make target'
    is passed over)."""
    checkout = megatron_checkout(
        tmp_path / "checkout",
        makefile=MAKEFILE_CORE.replace("SRC = helpers.cpp", "SRC = src/helpers.cpp"),
        source_name="src/helpers.cpp",
    )
    env = env_with_path(tool_bin(tmp_path / "bin"))
    shutil.copytree(checkout, tmp_path / "copy")
    in_place = subprocess.run(
        ["make", "-C", str(tmp_path / "copy" / DATASETS)], env=env, capture_output=True, check=False
    )
    assert in_place.returncode == 0  # Megatron's own make builds it in place
    prepared = prepare_checkout(checkout, who="test", environ=env)
    assert prepared.builds


@needs_compiler
def test_a_symlinked_build_directory_is_prepared(tmp_path: Path) -> None:
    """megatron/core is a link to a tree elsewhere: Megatron's compile_helpers runs make in
    dirname(__file__) all the same, but the walk does not follow the link, so nothing is
    prepared (no line, no build) and the jobs race on the first-use build again."""
    real = megatron_checkout(tmp_path / "elsewhere")
    checkout = tmp_path / "checkout"
    (checkout / "megatron").mkdir(parents=True)
    (checkout / "pretrain_gpt.py").write_text("raise SystemExit('not a real Megatron')\n")
    (checkout / "megatron" / "__init__.py").write_text("")
    (checkout / "megatron" / "core").symlink_to(real / "megatron" / "core")
    env = env_with_path(tool_bin(tmp_path / "bin"))
    prepared = prepare_checkout(checkout, who="test", environ=env)
    assert prepared.builds


SCHEDULES = sorted(p.parent for p in DATA.glob("**/fault_injected_2.json"))
_ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+[+-]\d\d:\d\d")


def _first_own_stamp(text: str, rank: int) -> datetime | None:
    """The earliest ISO stamp with an offset on any line of ``rank`` (read from the text, not by
    the parser under test: the reference workload's lines, the injector's)."""
    stamps = [
        datetime.fromisoformat(m.group(0))
        for line in text.splitlines()
        if line.startswith(f"{rank}: ") and (m := _ISO.search(line))
    ]
    return min(stamps, default=None)


@pytest.mark.parametrize("src", SCHEDULES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_later_marker_before_its_rank_started_cannot_be_judged(tmp_path: Path, src: Path) -> None:
    """Each later marker of a schedule re-stamped 0.5 s before the first line its rank stamped in
    the cycle it faulted (the reference workload's "rank N started", inside the 1 s slack the
    marker has against its cycle's start): the process that took the marker's time had not
    started; the run cannot be judged. Passed on ref-kill-step+kill-restore until the started
    line's stamp was read."""
    assert SCHEDULES, "no committed schedule run"
    doc = copy_run(src, tmp_path / "run")
    moved = 0
    for position in range(2, 10):
        name = f"fault_injected_{position}.json"
        if not doc.path(name).exists():
            break
        data = doc.json(name)
        log = doc.path(f"logs/train_cycle{data['restart_count']}.log")
        first = _first_own_stamp(log.read_text(encoding="utf-8"), data["rank"])
        assert first is not None, f"{name}: no stamped line of rank {data['rank']} in {log.name}"
        data["time"] = (first - timedelta(seconds=0.5)).isoformat()
        doc.set_json(name, **data)
        moved += 1
    assert moved
    judgement = judge_run_dir(doc.root)
    assert not judgement.judgeable
    assert any("cannot precede the process" in m for m in judgement.unjudgeable_reasons)
