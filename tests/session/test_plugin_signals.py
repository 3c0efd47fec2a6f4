"""Stop signals during a scenario run: pytest stops, the whole launched tree goes with it.

A real subprocess (signals matter here): the shipped suite launches the reference kill scenario
through the real ft_launcher; the signal arrives while the workers train. SIGTERM (CI cancel,
Slurm timeout) and SIGHUP act like Ctrl-C: pytest exits 2 (interrupted), result.json names the
signal, nothing of the run survives, its TMPDIR is gone. pytest is started with default signal
dispositions, or with SIGINT ignored as a script's background job is (``./check &``, some CI
runners): Ctrl-C must still stop it, not let it run on to a green exit.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.processes import (
    dispositions,
    kill_marked,
    marked,
    marked_env,
    new_mark,
    stop,
    stopped_run,
)

# the test launches scenarios and stops the session
pytestmark = pytest.mark.real_run


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("sig", "parent_sigint", "repeat"),
    [
        pytest.param(signal.SIGINT, "default", False, id="SIGINT"),
        pytest.param(signal.SIGINT, "ignored", False, id="SIGINT-sigint-ignored"),
        pytest.param(signal.SIGTERM, "default", False, id="SIGTERM"),
        pytest.param(signal.SIGHUP, "ignored", False, id="SIGHUP-sigint-ignored"),
        pytest.param(signal.SIGTERM, "ignored", True, id="SIGTERM-repeated"),
    ],
)
def test_stop_signal_kills_the_run_tree(
    tmp_path: Path, sig: signal.Signals, parent_sigint: str, repeat: bool
) -> None:
    work = tmp_path / "work"
    mark = new_mark()
    out = tmp_path / "pytest.out"
    with out.open("wb") as console:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", "--pyargs", "pytest_nvrx.suite", "-p",
             "no:cacheprovider", "-k", "reference-kill", "--nvrx-work-dir", str(work)],
            stdout=console, stderr=subprocess.STDOUT, env=marked_env(mark),
            start_new_session=True, preexec_fn=dispositions(parent_sigint),
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while not list(work.glob("runs/*/logs/train_cycle0.log")):
            assert proc.poll() is None, out.read_text(errors="replace")
            assert time.monotonic() < deadline, "the scenario never started training"
            time.sleep(0.5)
        assert len(marked(mark)) >= 4, "expected pytest, the launcher and two workers running"
        returncode, left = stop(proc, sig, mark, repeat=repeat, within=90)
    finally:
        kill_marked(mark)
    (run_dir,) = work.glob("runs/*")
    got = stopped_run(run_dir, returncode, left)
    assert got == {
        "exit": pytest.ExitCode.INTERRUPTED,
        "processes left": 0,
        "interrupted": sig.name,
        "TMPDIR left": False,
    }, f"left: {sorted(left.values())}\n" + out.read_text(errors="replace")[-3000:]
