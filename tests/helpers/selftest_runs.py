"""The reference self-test of the issue's Done-when (#25), run once per test session and shared by
the modules that judge its runs (tests/selftest/test_selftest.py,
tests/selftest/test_planted_labels.py: tests/conftest.py puts them in one xdist work unit, so the
session fixture runs once)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

#: The self-test's wall-clock limit. Measured on 2 cores: 140 s alone and 216 s beside ./check's
#: other worker (2026-12-01); on a slower host of the same kind (2026-12-03) 164 s alone and
#: 371-463 s beside the other worker's reference matrix (3 runs at once beside its 3).
SELFTEST_TIMEOUT_S = 900.0
#: pytest-timeout's limit for a test of a module using the session's self-test (the first of them
#: waits for it): its wait, the stop after it and the judging.
SELFTEST_TEST_TIMEOUT_S = SELFTEST_TIMEOUT_S + 120


@dataclass(frozen=True)
class Selftest:
    """The finished ``selftest`` command: its exit status, its JSON document and its text."""

    returncode: int
    document: dict[str, Any]
    text: str  # stderr: the progress and the text outcome
    pid: int  # the harness's (the CLI process's): no plant record may come from it

    def outcome(self, name: str) -> dict[str, Any]:
        found: list[dict[str, Any]] = [
            o for o in self.document.get("outcomes", ()) if o["plant"] == name
        ]
        assert len(found) == 1, f"{len(found)} outcomes for {name!r}:\n{self.tail()}"
        return found[0]

    def run_dir(self, name: str) -> Path:
        run_dir = self.outcome(name)["run_dir"]
        assert run_dir is not None, self.outcome(name)
        return Path(run_dir)

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.text.splitlines()[-lines:])


def run_reference_selftest(work: Path) -> Selftest:
    """The command of the issue's Done-when, run once: stdout and stderr to files, a bounded
    wait, and on a timeout the whole process group stopped (the self-test stops its runs on
    SIGTERM) before the failure names the command."""
    argv = [
        sys.executable,
        "-m",
        "pytest_nvrx",
        "selftest",
        "--workload",
        "reference",
        "--work-dir",
        str(work / "work"),
        "--json",
        "-",
    ]
    out, err = work / "stdout", work / "stderr"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(argv, stdout=stdout, stderr=stderr, start_new_session=True)
        try:
            proc.wait(SELFTEST_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            tail = "\n".join(err.read_text(errors="replace").splitlines()[-30:])
            pytest.fail(f"{' '.join(argv)} ran past {SELFTEST_TIMEOUT_S:.0f} s:\n{tail}")
    text = err.read_text(errors="replace")
    try:
        document = json.loads(out.read_text())
    except ValueError as exc:
        pytest.fail(f"{' '.join(argv)} (exit {proc.returncode}) wrote no JSON: {exc}\n{text}")
    print(f"\n{document.get('summary')}")  # -s shows it
    return Selftest(proc.returncode, document, text, proc.pid)
