"""Runs die with their harness (#22 item 3): SIGKILL of ``run`` or of a pytest session leaves no
process of the run alive and a result.json that names it.

Real reference runs through ft_launcher: the harness is SIGKILLed once the first iteration is
logged; its watchdog (pytest_nvrx.launch.watchdog) must stop the launcher, its log server, the rank
monitors and the workers (which run in sessions of their own and are reparented to init), write
result.json and remove the launch's TMPDIR within 15 s.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_nvrx.verify import verify_main

# each test launches a run and SIGKILLs its harness
pytestmark = pytest.mark.real_run

REPO = Path(__file__).resolve().parents[2]
#: what the watchdog has to stop the tree in (its own grace is 3 s)
WITHIN_S = 15.0


def _with_tmpdir(tmpdir: str) -> set[int]:
    """Live processes whose environment holds the run's TMPDIR (every process of the run)."""
    needle = f"TMPDIR={tmpdir}".encode()
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
            stat = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        if stat[stat.rfind(b")") + 2 :][:1] == b"Z":
            continue
        if needle in env.split(b"\0"):
            found.add(int(entry))
    return found


def _first_iteration(runs: Path, deadline_s: float = 180.0) -> Path:
    """The run dir under ``runs`` once its cycle 0 log shows an iteration."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        for log in runs.glob("*/logs/train_cycle0.log"):
            if b" iteration " in log.read_bytes():
                return log.parent.parent
        time.sleep(0.2)
    raise AssertionError(f"no iteration logged under {runs} in {deadline_s:.0f}s")


def _harness_killed_leaves_nothing(harness: subprocess.Popen[bytes], runs: Path) -> None:
    run_dir = _first_iteration(runs)
    tmpdir = json.loads((run_dir / "run.json").read_text())["env"]["TMPDIR"]
    assert _with_tmpdir(tmpdir), "the run is not running"
    harness.send_signal(signal.SIGKILL)
    harness.wait()
    end = time.monotonic() + WITHIN_S
    while time.monotonic() < end and (_with_tmpdir(tmpdir) or Path(tmpdir).exists()):
        time.sleep(0.2)
    left = _with_tmpdir(tmpdir)
    for pid in left:  # never leave them to the next test
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"alive {WITHIN_S:.0f}s after the harness died: {sorted(left)}"
    assert not Path(tmpdir).exists()
    # the checkpoint dir's claim of the dead harness is released (a new run may use it)
    assert not list((run_dir / "checkpoints").glob("*.claim"))
    result = json.loads((run_dir / "result.json").read_text())
    assert result["interrupted"] == "harness killed"
    assert result["exit_code"] is None
    console = (run_dir / "logs" / "launcher.console.log").read_text(errors="replace")
    assert "[pytest-nvrx watchdog]" in console and "the harness that launched this run" in console
    # the run is no evidence of a recovery: it cannot be judged
    assert verify_main([str(run_dir)], io.StringIO(), io.StringIO()) == 2


@pytest.mark.timeout(300)
def test_a_sigkilled_run_command_leaves_no_process_and_says_so(tmp_path: Path) -> None:
    work = tmp_path / "work"
    cli = subprocess.Popen(
        [
            *(sys.executable, "-m", "pytest_nvrx", "run", "--workload", "reference"),
            *("--work-dir", str(work), "--run-id", "hk", "--fault", "none", "--train-iters", "60"),
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        _harness_killed_leaves_nothing(cli, work / "runs")
    finally:
        if cli.poll() is None:
            cli.kill()


@pytest.mark.timeout(300)
def test_a_sigkilled_pytest_session_leaves_no_process_and_says_so(tmp_path: Path) -> None:
    work = tmp_path / "work"
    session = subprocess.Popen(
        [
            *(sys.executable, "-m", "pytest", "--pyargs", "pytest_nvrx.suite"),
            *("-p", "no:cacheprovider", "-k", "reference-baseline", "--nvrx-work-dir", str(work)),
            *("--nvrx-train-iters", "60", f"--basetemp={tmp_path / 'base'}"),
        ],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        _harness_killed_leaves_nothing(session, work / "runs")
    finally:
        if session.poll() is None:
            session.kill()
