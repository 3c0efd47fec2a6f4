"""Stop signals to ``python -m pytest_nvrx run`` while its workers train (real ft_launcher).

SIGTERM (CI cancel, Slurm timeout), SIGHUP (the terminal went away) and SIGINT (Ctrl-C) all stop
the whole launched tree, write result.json naming the signal, remove the run's TMPDIR and exit
128 + signal with one line on stderr. SIGINT counts even when the CLI was started with SIGINT
ignored (a background job of a script, some CI runners); a repeated signal during the cleanup
does not cut it short.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.processes import (
    dispositions,
    kill_marked,
    marked,
    marked_env,
    new_mark,
    stop,
    stopped_run,
    wait_none_marked,
)

# each test launches a run through the CLI and stops it
pytestmark = pytest.mark.real_run

CLI_RUN = [
    sys.executable, "-m", "pytest_nvrx", "run", "--workload", "reference",
    "--fault", "none", "--train-iters", "1000", "--save-interval", "100",
    "--section-timeouts", "setup:120,step:30,checkpointing:60",
    "--workload-check-interval", "1", "--timeout", "300",
]  # fmt: skip
# each step sleeps: the run trains for minutes unless it is stopped
STEP_TIME = ["--", "--step-time", "0.2"]


def wait_training(run_dir: Path, proc: subprocess.Popen[bytes], out: Path) -> None:
    log = run_dir / "logs" / "train_cycle0.log"
    deadline = time.monotonic() + 120
    while not (log.is_file() and "iteration" in log.read_text(errors="replace")):
        assert proc.poll() is None, out.read_text(errors="replace")
        assert time.monotonic() < deadline, "the run never started training"
        time.sleep(0.3)


def outcome(run_dir: Path, returncode: int | None, stderr: str, left: dict[int, str]) -> Any:
    """What a stopped CLI run left behind, and what it said on stderr."""
    return {
        **stopped_run(run_dir, returncode, left),
        "traceback": "Traceback" in stderr,
        "interrupted lines": sum("interrupted by" in line for line in stderr.splitlines()),
    }


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("sig", "parent_sigint", "repeat"),
    [
        pytest.param(signal.SIGTERM, "default", False, id="SIGTERM"),
        pytest.param(signal.SIGTERM, "ignored", False, id="SIGTERM-sigint-ignored"),
        pytest.param(signal.SIGHUP, "ignored", False, id="SIGHUP-sigint-ignored"),
        pytest.param(signal.SIGINT, "ignored", False, id="SIGINT-sigint-ignored"),
        pytest.param(signal.SIGTERM, "default", True, id="SIGTERM-repeated"),
        pytest.param(signal.SIGINT, "default", True, id="SIGINT-repeated"),
    ],
)
def test_stop_signal_stops_the_whole_run(
    tmp_path: Path, sig: signal.Signals, parent_sigint: str, repeat: bool
) -> None:
    work = tmp_path / "work"
    run_dir = work / "runs" / "sig"
    mark = new_mark()
    out, err = tmp_path / "cli.out", tmp_path / "cli.err"
    with out.open("wb") as out_fh, err.open("wb") as err_fh:
        proc = subprocess.Popen(
            [*CLI_RUN, "--work-dir", str(work), "--run-id", "sig", *STEP_TIME],
            stdout=out_fh,
            stderr=err_fh,
            env=marked_env(mark),
            start_new_session=True,
            preexec_fn=dispositions(parent_sigint),
        )
    try:
        wait_training(run_dir, proc, out)
        assert len(marked(mark)) >= 4, "expected the CLI, launcher and two workers running"
        returncode, left = stop(proc, sig, mark, repeat=repeat, within=60)
    finally:
        kill_marked(mark)
    got = outcome(run_dir, returncode, err.read_text(errors="replace"), left)
    assert got == {
        "exit": 128 + sig,
        "processes left": 0,
        "interrupted": sig.name,
        "TMPDIR left": False,
        "traceback": False,
        "interrupted lines": 1,
    }, f"left: {sorted(left.values())}\n" + err.read_text(errors="replace")[-3000:]


@pytest.mark.timeout(120)
def test_run_timeout_is_reported_without_traceback(tmp_path: Path) -> None:
    """``--timeout`` kills the tree and says so with a hint; exit 124, as timeout(1) does."""
    work = tmp_path / "work"
    mark = new_mark()
    argv = [a if a != "300" else "8" for a in CLI_RUN]  # --timeout 8: still in setup or training
    try:
        run = subprocess.run(
            [*argv, "--work-dir", str(work), "--run-id", "slow", *STEP_TIME],
            capture_output=True,
            text=True,
            env=marked_env(mark),
            timeout=100,
            preexec_fn=dispositions("default"),
        )
        left = wait_none_marked(mark, timeout=5.0)
    finally:
        kill_marked(mark)
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    assert run.returncode == 124, run.stderr[-3000:]
    assert "did not finish within 8s" in run.stderr and "Hint:" in run.stderr
    assert left == {}
    result = json.loads((work / "runs" / "slow" / "result.json").read_text())
    assert result["timed_out"] is True and result["interrupted"] is None
