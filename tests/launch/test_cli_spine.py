"""The spine's trace (tests/helpers/spine_trace.py) sees the CLI's calls and counts them: the
dry run of ``run`` (nothing launched) within two entries a module, and a spine that runs a
stage's steps by hand found out. The real run's measure is
tests/launch/test_cli_e2e.py::test_run_each_default_pair_then_verify (its traced pair)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_nvrx import cli
from pytest_nvrx.launch import claims
from pytest_nvrx.settings import RunConfig
from tests.helpers.spine_trace import report, trace_entries


def test_the_dry_run_enters_each_module_at_most_twice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", "--workload", "reference", "--fault", "kill", "--window", "save"]
    argv += ["--work-dir", str(tmp_path / "work"), "--run-id", "dry", "--dry-run"]
    status, entries = trace_entries(lambda: cli.main(argv, {}))
    assert status == 0, capsys.readouterr().err
    counts = entries.counts()
    # what the dry run does, seen: cli.py plans through launch/run.py, which validates and
    # asks the claims (read-only) before building the recipe
    for module in ("launch/run.py", "launch/run_dir_setup.py", "launch/claims.py"):
        assert counts.get(module, 0) >= 1, "\n".join(report(entries))
    assert not entries.over(2), "\n".join(report(entries))


def test_a_spine_that_runs_the_claim_steps_by_hand_is_found_out(tmp_path: Path) -> None:
    """Taken as the spine, launch/claims.py checks and takes a run's claims step by step: it
    enters launch/run_dir_setup.py three times (the fresh and unclaimed checks, the run dir
    made), as plan_launch did before one claims API."""
    config = RunConfig(work_dir=tmp_path / "work", run_id="by-hand", workload="reference")

    def by_hand() -> None:
        claims.check(config)
        claims.claim(config)
        claims.give_back(config)

    _, entries = trace_entries(by_hand, spine=frozenset({"launch/claims.py"}))
    assert entries.counts()["launch/run_dir_setup.py"] >= 3, "\n".join(report(entries))
    assert "launch/run_dir_setup.py" in entries.over(2)
