"""End to end through the CLI: `run --workload reference` with a real ft_launcher and a real
kill, then `verify` on its run directory (what a user without a GPU does first)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.timeout(600)
def test_run_reference_kill_then_verify(tmp_path: Path) -> None:
    work = tmp_path / "work"
    run = subprocess.run(
        [
            sys.executable, "-m", "pytest_nvrx", "run",
            "--workload", "reference", "--work-dir", str(work), "--run-id", "cli-kill",
            "--fault", "kill", "--train-iters", "20", "--save-interval", "5",
            "--section-timeouts", "setup:120,step:30,checkpointing:60",
            "--workload-check-interval", "1", "--timeout", "400",
        ],
        capture_output=True, text=True, timeout=500,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    run_dir = work / "runs" / "cli-kill"
    assert "fault injected" in run.stdout  # progress lines
    manifest = json.loads((run_dir / "run.json").read_text())
    assert manifest["config"]["workload"] == "reference"
    assert manifest["stack"]["nvrx"] and manifest["stack"]["torch"]  # stack recorded

    report = tmp_path / "verdicts.json"
    verify = subprocess.run(
        [sys.executable, "-m", "pytest_nvrx", "verify", str(run_dir), "--json", str(report)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert verify.stdout.count("PASS ") == 6
    verdicts = json.loads(report.read_text())
    assert [c["id"] for c in verdicts["criteria"] if c["passed"]] == [
        "prior_checkpoint", "replaced_cycle", "optimizer_state_load",
        "progress_past_restore", "no_repeat_injection", "training_continuity",
    ]  # fmt: skip
    continuity = verdicts["criteria"][-1]
    assert not continuity["not_applicable"] and "replayed" in continuity["reason"]
    assert verdicts["stack"]
