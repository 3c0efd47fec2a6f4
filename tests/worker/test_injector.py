"""The once-only fault injector, run as ft_launcher would run it: a plain script in a subprocess.

The workload is tests/helpers/injector_trainer.py, which advances a tracker on demand. Every
process is started in its own session; the ``launcher`` fixture kills each process group at
teardown, whatever happened.
"""

from __future__ import annotations

import concurrent.futures
import faulthandler
import json
import multiprocessing
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from pytest_nvrx.layout import MARKER_NAME
from pytest_nvrx.worker import injector
from pytest_nvrx.worker.injector import (
    AdvanceDetector,
    Firing,
    MarkerPathError,
    TrackerRead,
    TrackerState,
    build_marker_record,
    claim_marker,
    marker_exists,
    read_tracker,
)
from tests.helpers.injector_launcher import (
    HELPERS,
    INJECTOR,
    MARKER_KEYS,
    REPO,
    TRAINER,
    WAIT_S,
    Launcher,
    Run,
    Scenario,
    Windows,
    kill_group,
    proc_state,
)


def _wait_for(predicate: Any, what: str, run: Run, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if run.proc.poll() is not None:
            pytest.fail(
                f"injector exited {run.proc.returncode} waiting for {what}\n{run.describe()}"
            )
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}\n{run.describe()}")
        time.sleep(0.02)


def _assert_full_marker(record: dict[str, Any], *, fault: str, signal_name: str) -> None:
    assert set(record) >= MARKER_KEYS
    assert record["fault"] == fault
    assert record["signal"] == signal_name
    assert record["rank"] == 1
    assert record["host"]
    assert datetime.fromisoformat(record["time"]).utcoffset() is not None


# --- processes: the injector as ft_launcher runs it -------------------------------------------


def test_kill_injects_once_after_the_tracker_advances(launcher: Launcher, sc: Scenario) -> None:
    run = launcher.start(
        sc,
        trainer=["--values", "1,2,3", "--delay", "0.2", "--interval", "0.5", "--hold", "20"],
        extra_env={"NVRX_RUN_ID": "run-42", "LOCAL_RANK": "1", "TORCHELASTIC_RESTART_COUNT": "0"},
    )
    assert run.wait() == -signal.SIGKILL, run.describe()
    record = sc.marker_record()
    _assert_full_marker(record, fault="kill", signal_name="SIGKILL")
    assert record["pid"] == run.proc.pid
    assert record["baseline_iteration"] == 0
    assert record["tracker_iteration"] in (1, 2, 3)
    assert record["tracker_iteration"] > record["baseline_iteration"]
    assert (record["run_id"], record["local_rank"], record["restart_count"]) == ("run-42", 1, 0)
    assert record["argv"] == [str(TRAINER), *run.cmd[run.cmd.index("--") + 1 :]]
    assert record["tracker"] == str(sc.tracker)
    assert not sc.finished.exists()
    assert "sending SIGKILL" in run.stderr


def test_a_single_fault_marker_has_exactly_the_schema_2_keys(
    launcher: Launcher, sc: Scenario
) -> None:
    """A plain --fault run records no schedule keys: its marker is the same as before schedules
    existed, and the only marker it writes is --fault-marker itself."""
    run = launcher.start(sc, trainer=["--values", "1", "--delay", "0.2", "--hold", "20"])
    assert run.wait() == -signal.SIGKILL, run.describe()
    record = sc.marker_record()
    assert set(record) == MARKER_KEYS
    assert record["schema_version"] == 2
    assert sorted(p.name for p in sc.run_dir.iterdir()) == [MARKER_NAME]
    assert "schedule" not in run.stderr


def test_hang_stops_the_process(launcher: Launcher, sc: Scenario) -> None:
    run = launcher.start(
        sc, fault="hang", trainer=["--values", "1", "--delay", "0.2", "--hold", "20"]
    )
    _wait_for(lambda: proc_state(run.proc.pid) in "Tt", "the process to stop", run)
    assert run.proc.poll() is None
    record = sc.marker_record()
    _assert_full_marker(record, fault="hang", signal_name="SIGSTOP")
    assert record["tracker_iteration"] == 1
    assert "sending SIGSTOP" in run.stderr
    # NVRx's rank monitor sends SIGCONT before its termination signal: a hang stays a hang.
    # Fired from the watcher thread, the process stops itself again; the trainer never ends.
    os.kill(run.proc.pid, signal.SIGCONT)
    _wait_for(lambda: proc_state(run.proc.pid) in "Tt", "the process to stop again", run)
    time.sleep(0.5)
    assert proc_state(run.proc.pid) in "Tt" and run.proc.poll() is None
    os.killpg(run.proc.pid, signal.SIGKILL)
    assert run.wait() == -signal.SIGKILL
    assert not sc.finished.exists()


HANG_ON_THE_TRAINING_THREAD = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from tests.helpers.injector_launcher import Windows
w = Windows(Path(sys.argv[1]), "finalize", fault="hang")
w.complete(5)
w.save(10)
w.probes.section_started("checkpointing")  # finalizing 10: the hang fires here, on this thread
(w.tmp / "went-on").write_text("the hung rank finalized")
"""


def test_a_hang_continued_by_sigcont_stays_hung_on_the_training_thread(tmp_path: Path) -> None:
    """The rank monitor's SIGCONT (sent before its SIGKILL) must not let the rank finish the
    collective it hung in: it logs that it was continued and blocks until it is killed."""
    err = tmp_path / "err"
    with err.open("wb") as fe:
        proc = subprocess.Popen(
            [sys.executable, "-c", HANG_ON_THE_TRAINING_THREAD, str(tmp_path), str(REPO)],
            stdin=subprocess.DEVNULL,
            stderr=fe,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + WAIT_S
        while proc_state(proc.pid) not in "Tt":
            assert proc.poll() is None, err.read_text()
            assert time.monotonic() < deadline, "the hang never stopped the process"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGCONT)
        deadline = time.monotonic() + WAIT_S
        while "continued after SIGSTOP" not in err.read_text():
            assert proc.poll() is None, err.read_text()
            assert time.monotonic() < deadline, err.read_text()
            time.sleep(0.02)
        time.sleep(0.5)
        assert proc.poll() is None, err.read_text()
        assert not (tmp_path / "went-on").exists()
        assert json.loads((tmp_path / MARKER_NAME).read_text())["signal"] == "SIGSTOP"
    finally:
        kill_group(proc)
    assert proc.returncode == -signal.SIGKILL
    assert not (tmp_path / "went-on").exists()


@pytest.mark.parametrize(
    ("fault", "sig", "env"),
    [
        ("term", signal.SIGTERM, {}),
        ("segv", signal.SIGSEGV, {}),
        # A workload with faulthandler on: it dumps the stacks, re-raises, and the rank still dies.
        ("segv", signal.SIGSEGV, {"PYTHONFAULTHANDLER": "1"}),
    ],
    ids=["term", "segv", "segv-faulthandler"],
)
def test_signal_faults_end_the_process_with_their_signal(
    launcher: Launcher, sc: Scenario, fault: str, sig: signal.Signals, env: dict[str, str]
) -> None:
    run = launcher.start(
        sc,
        fault=fault,
        trainer=["--values", "1", "--delay", "0.2", "--hold", "20"],
        extra_env=env,
    )
    assert run.wait() == -sig, run.describe()
    record = sc.marker_record()
    _assert_full_marker(record, fault=fault, signal_name=sig.name)
    assert record["pid"] == run.proc.pid
    assert record["tracker_iteration"] == 1
    assert f"to inject {fault} ({sig.name}) in window step" in run.stderr
    assert "window step (tracker poll): in-flight iteration none, tracker 1" in run.stderr
    assert f"sending {sig.name} to pid {run.proc.pid}" in run.stderr
    assert "core dumps stay enabled" not in run.stderr
    assert "still running after" not in run.stderr
    assert ("Fatal Python error: Segmentation fault" in run.stderr) == bool(env)
    assert not sc.finished.exists()


@pytest.mark.parametrize(("fault", "sig"), [("term", signal.SIGTERM), ("segv", signal.SIGSEGV)])
def test_signal_inherited_as_ignored_exits_2_before_training(
    sc: Scenario,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    fault: str,
    sig: signal.Signals,
) -> None:
    monkeypatch.setenv("RANK", "1")
    argv = _argv(sc)
    argv[argv.index("--fault") + 1] = fault
    previous = signal.signal(sig, signal.SIG_IGN)
    try:
        assert injector.main(argv) == injector.EXIT_USAGE
    finally:
        signal.signal(sig, previous)
    err = capfd.readouterr().err
    assert f"{sig.name} is ignored in this process" in err
    assert f"the {fault} fault could not end it" in err
    assert not sc.started.exists()
    assert not sc.marker.exists()


def test_disable_core_dumps_lowers_only_the_soft_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    if hard == 0:
        pytest.skip("the hard core-file limit is already 0: nothing to lower")
    resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))
    try:
        assert injector.disable_core_dumps() is None
        assert resource.getrlimit(resource.RLIMIT_CORE) == (0, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_CORE, (soft, hard))


def test_fault_none_never_injects(launcher: Launcher, sc: Scenario) -> None:
    run = launcher.start(
        sc, fault="none", trainer=["--values", "1,2", "--interval", "0.2", "--hold", "0.3"]
    )
    assert run.wait() == 0, run.describe()
    assert not sc.marker.exists()
    assert sc.finished.exists()


def test_non_selected_rank_never_injects(launcher: Launcher, sc: Scenario) -> None:
    run = launcher.start(
        sc, rank=0, trainer=["--values", "1,2", "--interval", "0.2", "--hold", "0.3"]
    )
    assert run.wait() == 0, run.describe()
    assert not sc.marker.exists()
    assert sc.finished.exists()
    # rank 0 observes the tracker in every run: its one line says so (no tracker, no reading)
    assert run.stderr.count("\n") == 1
    assert f"rank 0 pid {run.proc.pid}: reading checkpoint tracker {sc.tracker};" in run.stderr


def test_existing_marker_means_no_second_injection(launcher: Launcher, sc: Scenario) -> None:
    sc.marker.write_text('{"fault": "kill", "pid": 1}\n')
    before = sc.marker.read_bytes()
    run = launcher.start(sc, trainer=["--values", "1,2", "--interval", "0.2", "--hold", "0.3"])
    assert run.wait() == 0, run.describe()
    assert sc.marker.read_bytes() == before
    assert sc.finished.exists()
    assert "fault already injected" in run.stderr
    assert run.stderr.count("\n") == 1


def test_fault_never_reached_exits_3(launcher: Launcher, sc: Scenario) -> None:
    run = launcher.start(sc, trainer=["--hold", "0.2"])
    assert run.wait() == injector.EXIT_FAULT_NOT_INJECTED, run.describe()
    assert "the requested fault (kill on rank 1) never happened" in run.stderr
    assert str(sc.tracker) in run.stderr
    assert sc.finished.exists()
    assert not sc.marker.exists()


def test_sys_exit_0_counts_as_normal_return(launcher: Launcher, sc: Scenario) -> None:
    run = launcher.start(sc, trainer=["--exit-code", "0"])
    assert run.wait() == injector.EXIT_FAULT_NOT_INJECTED, run.describe()
    assert "never happened" in run.stderr


def test_nonzero_sys_exit_of_the_workload_propagates(launcher: Launcher, sc: Scenario) -> None:
    run = launcher.start(sc, trainer=["--exit-code", "7"])
    assert run.wait() == 7, run.describe()
    assert "never happened" not in run.stderr


def test_baseline_from_existing_tracker(launcher: Launcher, sc: Scenario) -> None:
    sc.tracker.write_text("5")
    run = launcher.start(
        sc, trainer=["--values", "4,5,5,6", "--delay", "0.2", "--interval", "0.3", "--hold", "20"]
    )
    assert run.wait() == -signal.SIGKILL, run.describe()
    record = sc.marker_record()
    assert (record["baseline_iteration"], record["tracker_iteration"]) == (5, 6)
    assert "baseline 5" in run.stderr


@pytest.mark.parametrize(
    "tracker_content",
    [
        pytest.param("", id="empty"),
        pytest.param(" \n", id="blank"),
        pytest.param("abc", id="word"),
        pytest.param("release", id="release"),
        pytest.param("-3", id="negative"),
    ],
)
def test_invalid_tracker_at_start_exits_2_before_training(
    launcher: Launcher, sc: Scenario, tracker_content: str
) -> None:
    sc.tracker.write_text(tracker_content)
    run = launcher.start(sc, trainer=["--values", "1"])
    assert run.wait() == injector.EXIT_USAGE, run.describe()
    assert not sc.started.exists()
    assert f"checkpoint tracker {sc.tracker} is" in run.stderr
    assert not sc.marker.exists()


def test_unreadable_tracker_at_start_exits_2(launcher: Launcher, sc: Scenario) -> None:
    # Tests run as root, so chmod 000 would not stop a read: a directory is reliably unreadable.
    sc.tracker.mkdir()
    run = launcher.start(sc)
    assert run.wait() == injector.EXIT_USAGE, run.describe()
    assert not sc.started.exists()
    assert f"checkpoint tracker {sc.tracker} is unreadable" in run.stderr


def test_tracker_under_a_file_exits_2(launcher: Launcher, sc: Scenario, tmp_path: Path) -> None:
    not_a_dir = tmp_path / "plain-file"
    not_a_dir.write_text("x")
    run = launcher.start(sc, checkpoint_dir=not_a_dir)
    assert run.wait() == injector.EXIT_USAGE, run.describe()
    assert not sc.started.exists()
    assert "unreadable" in run.stderr


def test_partial_reads_neither_crash_nor_inject_early(launcher: Launcher, sc: Scenario) -> None:
    # Rewriting 20 non-atomically shows the watcher "" and "2"; neither is an advance past 20.
    sc.tracker.write_text("20")
    run = launcher.start(
        sc,
        trainer=[
            "--values",
            "20,20,20,20,25",
            "--non-atomic",
            "--gap",
            "0.07",
            "--interval",
            "0.05",
            "--hold",
            "20",
        ],
    )
    assert run.wait() == -signal.SIGKILL, run.describe()
    record = sc.marker_record()
    assert (record["baseline_iteration"], record["tracker_iteration"]) == (20, 25)
    assert "Traceback" not in run.stderr
    assert run.stderr.count("sending SIGKILL") == 1


@pytest.mark.parametrize("dangling", [True, False], ids=["dangling", "existing-target"])
def test_symlink_at_marker_before_start_exits_2(
    launcher: Launcher, sc: Scenario, tmp_path: Path, dangling: bool
) -> None:
    target = tmp_path / "target.json"
    if not dangling:
        target.write_text("precious\n")
    sc.marker.symlink_to(target)
    run = launcher.start(sc, trainer=["--values", "1", "--hold", "1"])
    assert run.wait() == injector.EXIT_USAGE, run.describe()
    assert f"marker path {sc.marker} is a symbolic link" in run.stderr
    assert not sc.started.exists()
    assert sc.marker.is_symlink()
    if dangling:
        assert not target.exists()
    else:
        assert target.read_text() == "precious\n"


@pytest.mark.parametrize("dangling", [True, False], ids=["dangling", "existing-target"])
def test_symlink_planted_during_run_blocks_injection(
    launcher: Launcher, sc: Scenario, tmp_path: Path, dangling: bool
) -> None:
    target = tmp_path / "target.json"
    if not dangling:
        target.write_text("precious\n")
    run = launcher.start(
        sc,
        trainer=[
            "--plant-symlink",
            str(sc.marker),
            str(target),
            "--values",
            "1",
            "--delay",
            "0.1",
            "--hold",
            "0.6",
        ],
    )
    assert run.wait() == injector.EXIT_FAULT_NOT_INJECTED, run.describe()
    assert f"marker path {sc.marker} is a symbolic link" in run.stderr
    assert "refusing to inject" in run.stderr
    assert "never happened" in run.stderr
    assert sc.finished.exists()
    if dangling:
        assert not target.exists()
    else:
        assert target.read_text() == "precious\n"


def test_script_sees_argv_and_path_like_python_runs_it(launcher: Launcher, sc: Scenario) -> None:
    run = launcher.start(sc, fault="none", rank=None, trainer=["--values", "3"])
    assert run.wait() == 0, run.describe()
    started = json.loads(sc.started.read_text())
    assert started["argv"] == [str(TRAINER), *run.cmd[run.cmd.index("--") + 1 :]]
    assert started["path0"] == str(HELPERS)
    assert started["name"] == "__main__"


def test_module_entry_point(launcher: Launcher, sc: Scenario) -> None:
    run = launcher.start(
        sc, module=True, trainer=["--values", "1", "--delay", "0.2", "--hold", "20"]
    )
    assert run.wait() == -signal.SIGKILL, run.describe()
    started = json.loads(sc.started.read_text())
    assert started["argv"][1:] == run.cmd[run.cmd.index("--") + 1 :]
    assert started["name"] == "__main__"
    assert sc.marker_record()["tracker_iteration"] == 1


# --- main() refusals that happen before the workload starts (in-process) ---------------------


def _argv(sc: Scenario, *extra: str, fault_rank: str = "1") -> list[str]:
    return [
        "--checkpoint-dir",
        str(sc.ckpt),
        "--fault-marker",
        str(sc.marker),
        "--fault",
        "kill",
        "--fault-rank",
        fault_rank,
        "--script",
        str(TRAINER),
        *extra,
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            [
                "--checkpoint-dir",
                "rel",
                "--fault-marker",
                "/m",
                "--fault",
                "kill",
                "--fault-rank",
                "0",
                "--script",
                str(TRAINER),
            ],
            "--checkpoint-dir must be absolute",
        ),
        (
            [
                "--checkpoint-dir",
                "/c",
                "--fault-marker",
                "m.json",
                "--fault",
                "kill",
                "--fault-rank",
                "0",
                "--script",
                str(TRAINER),
            ],
            "--fault-marker must be absolute",
        ),
        (
            [
                "--checkpoint-dir",
                "/c",
                "--fault-marker",
                "/m",
                "--fault",
                "kill",
                "--fault-rank",
                "-1",
                "--script",
                str(TRAINER),
            ],
            "--fault-rank must be >= 0",
        ),
        (
            [
                "--checkpoint-dir",
                "/c",
                "--fault-marker",
                "/m",
                "--fault",
                "kill",
                "--fault-rank",
                "0",
            ],
            "one of the arguments --script --module is required",
        ),
        (
            [
                "--checkpoint-dir",
                "/c",
                "--fault-marker",
                "/m",
                "--fault",
                "kill",
                "--fault-rank",
                "0",
                "--script",
                str(TRAINER),
                "--module",
                "x",
            ],
            "not allowed with argument",
        ),
        (
            [
                "--checkpoint-dir",
                "/c",
                "--fault-marker",
                "/m",
                "--fault",
                "crash",
                "--fault-rank",
                "0",
                "--module",
                "x",
            ],
            "invalid choice: 'crash'",
        ),
        (
            [
                "--checkpoint-dir",
                "/c",
                "--fault-marker",
                "/m",
                "--fault",
                "kill",
                "--fault-rank",
                "0",
                "--script",
                "/nonexistent/train.py",
            ],
            "is not a file",
        ),
        (
            [
                "--checkpoint-dir",
                "/c",
                "--fault-marker",
                "/m",
                "--fault",
                "kill",
                "--fault-rank",
                "0",
                "--module",
                "x",
                "--poll-interval",
                "0",
            ],
            "--poll-interval must be in",
        ),
    ],
)
def test_bad_command_lines_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        injector.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_workload_args_follow_the_separator(sc: Scenario) -> None:
    opts = injector.parse_args([*_argv(sc), "--", "--fault", "x", "--", "y"])
    assert opts.workload_args == ("--fault", "x", "--", "y")
    assert opts.tracker == str(sc.tracker)
    assert opts.poll_interval == injector.DEFAULT_POLL_INTERVAL_S


def test_missing_rank_exits_2(
    sc: Scenario, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("RANK", raising=False)
    assert injector.main(_argv(sc)) == injector.EXIT_USAGE
    assert "RANK is unset" in capfd.readouterr().err
    assert not sc.started.exists()


def test_fault_rank_beyond_world_size_exits_2(
    sc: Scenario, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert injector.main(_argv(sc)) == injector.EXIT_USAGE
    assert "--fault-rank 1 is not below WORLD_SIZE 1" in capfd.readouterr().err


def test_missing_marker_directory_exits_2(
    sc: Scenario, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RANK", "1")
    sc.run_dir.rmdir()
    assert injector.main(_argv(sc)) == injector.EXIT_USAGE
    assert f"marker directory {sc.run_dir} does not exist" in capfd.readouterr().err


# --- pure functions -------------------------------------------------------------------------


def test_read_tracker_states(tmp_path: Path) -> None:
    path = tmp_path / "t"
    assert read_tracker(str(path)) == TrackerRead(TrackerState.ABSENT)
    for content, state, iteration in [
        ("12", TrackerState.OK, 12),
        (" 7\n", TrackerState.OK, 7),
        ("", TrackerState.EMPTY, None),
        ("1.5", TrackerState.INVALID, None),
        ("release", TrackerState.INVALID, None),
        ("9" * 5000, TrackerState.INVALID, None),
    ]:
        path.write_text(content)
        got = read_tracker(str(path))
        assert (got.state, got.iteration) == (state, iteration), content[:20]
    path.unlink()
    path.mkdir()
    got = read_tracker(str(path))
    assert got.state is TrackerState.UNREADABLE
    assert "IsADirectoryError" in got.describe()


def test_advance_detector_needs_two_agreeing_reads_past_the_baseline() -> None:
    def ok(n: int) -> TrackerRead:
        return TrackerRead(TrackerState.OK, n)

    empty = TrackerRead(TrackerState.EMPTY)
    det = AdvanceDetector(baseline=20)
    assert [det.observe(r) for r in [ok(20), empty, ok(2), ok(20), ok(21)]] == [None] * 5
    assert det.observe(ok(25)) is None  # 21 became 25 before it was confirmed
    assert det.observe(empty) is None  # a transient read drops the candidate...
    assert det.baseline == 20  # ...but never the baseline
    assert det.observe(ok(25)) is None
    assert det.observe(ok(25)) == 25


@pytest.mark.parametrize(
    ("fault", "signal_name"),
    [
        ("kill", "SIGKILL"),
        ("hang", "SIGSTOP"),
        ("term", "SIGTERM"),
        ("segv", "SIGSEGV"),
        ("ckpt-worker", "SIGKILL"),
        ("exception", None),
    ],
)
def test_every_fault_is_recorded_with_its_signal(fault: str, signal_name: str | None) -> None:
    assert fault in injector.FAULTS
    rec = build_marker_record(
        fault=fault,
        rank=1,
        firing=Firing(window="step", trigger="tracker poll", tracker_iteration=2),
        baseline_iteration=0,
        tracker="/c/t",
        argv=["train.py"],
        env={},
        pid=5,
        rank_pid=5,
        host="h",
        now=datetime(2026, 1, 2, tzinfo=UTC),
    )
    assert (rec["fault"], rec["signal"]) == (fault, signal_name)
    assert set(injector.FAULTS) == {"none", "exception", *injector.FAULT_SIGNALS}


def test_build_marker_record() -> None:
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    rec = build_marker_record(
        fault="hang",
        rank=3,
        firing=Firing(
            window="finalize",
            trigger="start_section(checkpointing)",
            tracker_iteration=10,
            in_flight_iteration=15,
            section="checkpointing",
            write_done=False,
        ),
        baseline_iteration=5,
        tracker="/c/t",
        argv=["train.py", "--x"],
        env={"LOCAL_RANK": "1", "WORLD_SIZE": "4"},
        pid=99,
        rank_pid=99,
        host="node7",
        now=now,
    )
    assert set(rec) == MARKER_KEYS
    assert rec["schema_version"] == 2
    assert rec["signal"] == "SIGSTOP"
    assert (rec["window"], rec["tracker_iteration"], rec["in_flight_iteration"]) == (
        "finalize",
        10,
        15,
    )
    assert (rec["section"], rec["write_done"], rec["trigger"]) == (
        "checkpointing",
        False,
        "start_section(checkpointing)",
    )
    assert rec["time"] == "2026-01-02T03:04:05+00:00"
    assert (rec["local_rank"], rec["world_size"], rec["restart_count"], rec["run_id"]) == (
        1,
        4,
        None,
        None,
    )
    json.dumps(rec)


def test_claim_marker(tmp_path: Path) -> None:
    marker = tmp_path / MARKER_NAME
    assert claim_marker(str(marker), {"who": "first"}) is True
    assert json.loads(marker.read_text()) == {"who": "first"}
    assert marker.stat().st_mode & 0o777 == 0o644 & ~_umask()
    assert claim_marker(str(marker), {"who": "second"}) is False
    assert json.loads(marker.read_text()) == {"who": "first"}
    assert marker_exists(str(marker))


@pytest.mark.parametrize("dangling", [True, False], ids=["dangling", "existing-target"])
def test_claim_marker_never_follows_a_symlink(tmp_path: Path, dangling: bool) -> None:
    target = tmp_path / "target"
    if not dangling:
        target.write_text("precious")
    marker = tmp_path / MARKER_NAME
    marker.symlink_to(target)
    with pytest.raises(MarkerPathError, match="is a symbolic link"):
        claim_marker(str(marker), {"x": 1})
    with pytest.raises(MarkerPathError):
        marker_exists(str(marker))
    assert target.exists() is not dangling
    if not dangling:
        assert target.read_text() == "precious"


def test_claim_marker_never_writes_through_a_symlinked_directory(tmp_path: Path) -> None:
    """#9: a symlinked parent of the marker was followed: the marker landed in another
    directory (someone else's). The marker's own directory must be a real one."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run_dir = tmp_path / "run"
    run_dir.symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(MarkerPathError, match=r"directory .* is a symbolic link"):
        claim_marker(str(run_dir / MARKER_NAME), {"x": 1})
    assert list(elsewhere.iterdir()) == []


def test_claim_marker_refuses_a_directory(tmp_path: Path) -> None:
    marker = tmp_path / MARKER_NAME
    marker.mkdir()
    with pytest.raises(MarkerPathError, match="is a directory"):
        claim_marker(str(marker), {"x": 1})


_CLAIMANT = """
import importlib.util, json, os, sys
spec = importlib.util.spec_from_file_location("injector", sys.argv[1])
mod = sys.modules["injector"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
print("ready", flush=True)
os.read(int(sys.argv[3]), 1)  # blocks until the parent closes the write end
print(mod.claim_marker(sys.argv[2], {"claimant": int(sys.argv[4])}), flush=True)
"""


def test_32_concurrent_claimants_one_winner(tmp_path: Path) -> None:
    marker = tmp_path / MARKER_NAME
    go_r, go_w = os.pipe()
    procs: list[subprocess.Popen[str]] = []
    try:
        for i in range(32):
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        _CLAIMANT,
                        str(INJECTOR),
                        str(marker),
                        str(go_r),
                        str(i),
                    ],
                    stdout=subprocess.PIPE,
                    text=True,
                    pass_fds=(go_r,),
                    start_new_session=True,
                )
            )
        for p in procs:
            assert p.stdout is not None
            assert p.stdout.readline() == "ready\n"
        os.close(go_w)  # every claimant's read returns at once
        go_w = -1
        results = [p.communicate(timeout=WAIT_S)[0].strip() for p in procs]
    finally:
        if go_w >= 0:
            os.close(go_w)
        os.close(go_r)
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    assert sorted(results) == ["False"] * 31 + ["True"]
    assert [p.returncode for p in procs] == [0] * 32
    assert json.loads(marker.read_text()) == {"claimant": results.index("True")}


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# --- windows: the probe logic in-process (fault "exception" raises instead of killing us) -------


@pytest.fixture(autouse=True)
def _no_late_stack_dump() -> Iterator[None]:
    """The exception fault arms faulthandler's one-shot stack dump; never in this process."""
    yield
    faulthandler.cancel_dump_traceback_later()


def _future(done: bool) -> concurrent.futures.Future[None]:
    fut: concurrent.futures.Future[None] = concurrent.futures.Future()
    if done:
        fut.set_result(None)
    return fut


def test_step_window_fires_at_the_first_step_after_a_checkpoint_completed(
    tmp_path: Path,
) -> None:
    w = Windows(tmp_path, "step")
    w.probes.section_started("step")  # nothing completed yet
    w.probes.section_ended("step")
    w.save(5, _future(done=True))
    w.probes.section_started("step")  # submitted, not finalized: still nothing completed
    w.probes.section_ended("step")
    assert not w.marker.exists()
    w.complete(5)
    with pytest.raises(injector.InjectedFault, match=r"rank 1 in window step \(in-flight"):
        w.probes.section_started("step")
    rec = w.record()
    assert (rec["window"], rec["trigger"], rec["section"]) == (
        "step",
        "start_section(step)",
        "step",
    )
    assert (rec["tracker_iteration"], rec["in_flight_iteration"], rec["write_done"]) == (
        5,
        None,
        None,
    )
    assert rec["signal"] is None and rec["fault"] == "exception"
    w.probes.section_started("step")  # once only: no second raise
    assert w.injection.injected


def test_save_window_fires_entering_the_submit_of_the_next_save(tmp_path: Path) -> None:
    w = Windows(tmp_path, "save")
    w.save(5)  # tracker absent: no earlier checkpoint completed, so not this one
    assert not w.marker.exists()
    w.complete(5)
    w.probes.section_started("checkpointing")
    with pytest.raises(injector.InjectedFault, match="window save"):
        w.probes.submit_entry(tmp_path / "iter_0000010")
    rec = w.record()
    assert (rec["window"], rec["trigger"], rec["section"]) == (
        "save",
        "save submit",
        "checkpointing",
    )
    assert (rec["tracker_iteration"], rec["in_flight_iteration"]) == (5, 10)


def test_finalize_window_fires_when_the_rank_begins_finalizing(tmp_path: Path) -> None:
    w = Windows(tmp_path, "finalize")
    w.save(5, _future(done=True))
    w.probes.section_started("checkpointing")  # finalization poll of 5: nothing completed yet
    w.probes.section_ended("checkpointing")
    w.complete(5)
    w.probes.section_started("checkpointing")  # 5 is finalized now: nothing in flight
    w.probes.section_ended("checkpointing")
    assert not w.marker.exists()
    w.save(10, _future(done=False))
    with pytest.raises(injector.InjectedFault, match="window finalize"):
        w.probes.section_started("checkpointing")
    rec = w.record()
    assert (rec["trigger"], rec["section"]) == ("start_section(checkpointing)", "checkpointing")
    assert (rec["tracker_iteration"], rec["in_flight_iteration"], rec["write_done"]) == (
        5,
        10,
        False,
    )


def test_finalize_window_misses_a_save_finalized_before_the_next_section(tmp_path: Path) -> None:
    w = Windows(tmp_path, "finalize")
    w.complete(5)
    w.save(10)
    w.complete(10)  # finalized (by another path) before the rank's next checkpointing section
    w.probes.section_started("checkpointing")
    assert not w.marker.exists()
    assert "window finalize never opened" in w.probes.never_fired()
    assert "saves submitted: 10" in w.probes.never_fired()


def test_finalize_window_says_the_tracker_named_each_save_at_submit(tmp_path: Path) -> None:
    """#21 item 5: a stack that publishes the tracker at submit never opens the finalize window;
    the exit-3 reason names every save the tracker already named when its finalization began."""
    w = Windows(tmp_path, "finalize")
    for iteration in (5, 10, 15):
        w.save(iteration)
        w.complete(iteration)  # rank 0 wrote the tracker at submit
        w.probes.section_started("checkpointing")  # the finalization of that save
        w.probes.section_ended("checkpointing")
    assert not w.marker.exists()
    assert w.probes.never_fired() == (
        "window finalize never opened while training ran (baseline 0, highest tracker read 15,"
        " saves submitted: 5, 10, 15; the tracker already named the save in flight when its"
        " finalization began: 5, 10, 15; NVRx sections seen)"
    )


def test_finalize_window_a_second_poll_is_no_finalization_begun(tmp_path: Path) -> None:
    """A save finalized between two polls (the first saw it in flight) was not named early."""
    w = Windows(tmp_path, "finalize")
    w.save(5)
    w.probes.section_started("checkpointing")  # tracker absent: 5 in flight, no checkpoint yet
    w.probes.section_ended("checkpointing")
    w.complete(5)
    w.probes.section_started("checkpointing")
    assert "already named" not in w.probes.never_fired()


def test_windows_arm_only_above_the_start_up_tracker(tmp_path: Path) -> None:
    w = Windows(tmp_path, "save", baseline=5)
    w.complete(5)  # the checkpoint this run resumed from is no new restore point
    w.probes.section_started("checkpointing")
    w.probes.submit_entry(tmp_path / "iter_0000010")
    assert not w.marker.exists()
    w.probes.submit_return(tmp_path / "iter_0000010", None)
    w.probes.section_ended("checkpointing")
    w.complete(10)
    w.probes.section_started("checkpointing")
    with pytest.raises(injector.InjectedFault):
        w.probes.submit_entry(tmp_path / "iter_0000015")
    assert (w.record()["tracker_iteration"], w.record()["baseline_iteration"]) == (10, 5)


def test_a_tracker_caught_mid_write_never_fires(tmp_path: Path) -> None:
    w = Windows(tmp_path, "step")
    w.tracker.write_text("")  # a plain open/write, caught between truncate and write
    w.probes.section_started("step")
    assert not w.marker.exists()


def test_a_failing_probe_disables_injection_not_the_workload(tmp_path: Path) -> None:
    w = Windows(tmp_path, "save")
    w.complete(5)
    (tmp_path / MARKER_NAME).mkdir()  # claim fails as MarkerPathError inside fire: logged
    w.probes.section_started("checkpointing")
    w.probes.submit_entry(tmp_path / "iter_0000010")  # does not raise into the workload
    assert not w.injection.injected
    assert w.injection.error is not None and "refusing to inject" in w.injection.error
    (tmp_path / "x").mkdir()
    broken = Windows(tmp_path / "x", "step")
    broken.probes.submit_return(object(), None)  # a path we cannot read: ignored, no error
    assert broken.injection.error is None


@pytest.mark.parametrize(
    ("path", "iteration"),
    [
        ("/c/iter_0000010", 10),
        ("/c/iter_0000010/", 10),
        (Path("/c/iter_0001234"), 1234),
        ("/c/iter_0000010/x", None),
        ("/c/release", None),
        (None, None),
        (3, None),
    ],
)
def test_checkpoint_iteration(path: Any, iteration: int | None) -> None:
    assert injector.checkpoint_iteration(path) == iteration


def test_probe_finder_patches_a_module_right_after_it_executed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"nvrx_probe_target_{os.getpid()}"
    (tmp_path / f"{name}.py").write_text("def save(x):\n    return x * 2\nBOUND = save\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    calls: list[Any] = []

    def patch(module: Any) -> None:
        original = module.save

        def save(x: Any) -> Any:
            calls.append(x)
            return original(x)

        module.save = save

    finder = injector.ProbeFinder({name: patch})
    finder.install()
    try:
        module = __import__(name)
        assert module.save(3) == 6 and calls == [3]
        assert module.BOUND(4) == 8 and calls == [3]  # bound at exec time: the original
        from importlib import import_module

        assert import_module(name).save is module.save
    finally:
        sys.meta_path.remove(finder)
        sys.modules.pop(name, None)


def test_find_checkpoint_worker_finds_the_spawned_child(tmp_path: Path) -> None:
    assert injector.find_checkpoint_worker(os.getpid())[0] is None
    ctx = multiprocessing.get_context("spawn")
    child = ctx.Process(target=time.sleep, args=(60,), daemon=True)
    child.start()
    try:
        assert child.pid is not None
        deadline = time.monotonic() + WAIT_S
        # A spawn child shows its command line once exec'd (empty before, and as a zombie).
        while b"spawn_main" not in injector._cmdline(child.pid):
            assert child.is_alive(), f"spawned child died: exit code {child.exitcode}"
            assert time.monotonic() < deadline, "spawned child never showed its command line"
            time.sleep(0.01)
        assert injector.find_checkpoint_worker(os.getpid()) == (child.pid, "")
    finally:
        child.kill()
        child.join()


def test_ckpt_worker_needs_the_finalize_window(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        injector.parse_args(
            [
                f"--checkpoint-dir={tmp_path}",
                f"--fault-marker={tmp_path / MARKER_NAME}",
                "--fault=ckpt-worker",
                "--fault-rank=1",
                "--window=save",
                "--module=train",
            ]
        )
    assert exc.value.code == injector.EXIT_USAGE


@pytest.mark.parametrize(
    ("reads", "fires_with"),
    [
        # the first read still names 5, the confirmation the 10 rank 0 has just written
        (["5", "10", "10"], 10),
        # caught between rank 0's truncate and its write, then the value settles
        (["", "10", "10"], 10),
        # a tracker that never settles is not fired on
        (["5", "10", "5", "10", "5", "10"], None),
    ],
    ids=["advanced-while-confirming", "caught-mid-write", "never-settles"],
)
def test_a_tracker_rank_0_is_rewriting_is_read_until_it_settles(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    reads: list[str],
    fires_with: int | None,
) -> None:
    """Rank 0 writes the tracker just after the finalization all-reduce the faulted rank also
    passed: its submit probe may read the old value or an empty file first. Under load that
    race was lost at every save of a run (a fresh-clone check: 'window save never opened')."""
    w = Windows(tmp_path, "save")
    w.save(5)
    queue = list(reads)
    real = injector.read_tracker

    def next_read(path: str) -> injector.TrackerRead:
        if queue:
            w.tracker.write_text(queue.pop(0))
        return real(path)

    monkeypatch.setattr(injector, "read_tracker", next_read)
    w.probes.section_started("checkpointing")
    if fires_with is None:
        w.probes.submit_entry(tmp_path / "iter_0000015")
        assert not w.marker.exists()
        return
    with pytest.raises(injector.InjectedFault, match="window save"):
        w.probes.submit_entry(tmp_path / "iter_0000015")
    assert w.record()["tracker_iteration"] == fires_with
