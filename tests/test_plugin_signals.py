"""Ctrl-C during a scenario run: pytest stops, the whole launched tree goes with it.

A real subprocess (signals matter here): the shipped suite launches the reference kill scenario
through the real ft_launcher; SIGINT arrives while the workers train.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


def processes_mentioning(text: str) -> list[str]:
    found = []
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit() or int(pid_dir.name) == os.getpid():
            continue
        try:
            cmd = (pid_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (pid_dir / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmd and state != "Z":
            found.append(f"{pid_dir.name}: {cmd[:120]}")
    return found


@pytest.mark.timeout(300)
def test_ctrl_c_kills_the_run_tree(tmp_path: Path) -> None:
    work = tmp_path / "work"
    console = (tmp_path / "pytest.out").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "--pyargs", "pytest_nvrx.suite", "-p",
         "no:cacheprovider", "-k", "reference-kill", "--nvrx-work-dir", str(work)],
        stdout=console, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while not list(work.glob("runs/*/logs/train_cycle0.log")):
            assert proc.poll() is None, (tmp_path / "pytest.out").read_text()
            assert time.monotonic() < deadline, "the scenario never started training"
            time.sleep(0.5)
        assert processes_mentioning(str(work)), "nothing running to interrupt"
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=90) == pytest.ExitCode.INTERRUPTED
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        console.close()
    deadline = time.monotonic() + 15
    while processes_mentioning(str(work)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_mentioning(str(work)) == []
    (run_dir,) = work.glob("runs/*")
    assert json.loads((run_dir / "result.json").read_text())["interrupted"] is True
