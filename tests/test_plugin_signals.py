"""Stop signals during a scenario run: pytest stops, the whole launched tree goes with it.

A real subprocess (signals matter here): the shipped suite launches the reference kill scenario
through the real ft_launcher; the signal arrives while the workers train. SIGTERM (CI cancel,
Slurm timeout) and SIGHUP act like Ctrl-C: pytest exits 2 (interrupted), result.json names the
signal, nothing of the run survives, its TMPDIR is gone. pytest is started with default signal
dispositions, or with SIGINT ignored as a script's background job is (``./check &``, some CI
runners): Ctrl-C must still stop it, not let it run on to a green exit.
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

from tests.processes import (
    dispositions,
    kill_marked,
    marked,
    marked_env,
    new_mark,
    wait_none_marked,
)


def outcome(work: Path, returncode: int | None, left: dict[int, str]) -> Any:
    (run_dir,) = work.glob("runs/*")
    result = run_dir / "result.json"
    tmpdir = Path(json.loads((run_dir / "run.json").read_text())["env"]["TMPDIR"])
    return {
        "exit": returncode,
        "processes left": len(left),
        "interrupted": json.loads(result.read_text())["interrupted"]
        if result.is_file()
        else "(no result.json)",
        "TMPDIR left": tmpdir.exists(),
    }


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
        proc.send_signal(sig)
        deadline = time.monotonic() + 90
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
            if repeat:
                proc.send_signal(sig)  # more of the same while the run is cleaned up
        returncode = proc.poll()
        left = wait_none_marked(mark, timeout=5.0)
    finally:
        kill_marked(mark)
    got = outcome(work, returncode, left)
    assert got == {
        "exit": pytest.ExitCode.INTERRUPTED,
        "processes left": 0,
        "interrupted": sig.name,
        "TMPDIR left": False,
    }, f"left: {sorted(left.values())}\n" + out.read_text(errors="replace")[-3000:]
