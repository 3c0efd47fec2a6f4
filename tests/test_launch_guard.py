"""The real-run guard (tests/helpers/launch_guard.py) fails an unmarked test that launches, lets a
marked one through, and names the commands that launch: a session of its own over tests that
start a harmless program named ft_launcher, the CLI refused, and a stand-in for a CLI run that
launched; and the command lines it judges."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.helpers.launch_guard import launched_program

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[1]

INNER = """
import subprocess
import sys

import pytest


def test_unmarked():
    subprocess.run(["ft_launcher", "--nnodes=1"], check=True)


def test_unmarked_swallowing():
    # code under test that catches everything still fails the test
    try:
        subprocess.run(["ft_launcher"], check=True)
    except Exception:
        pass


@pytest.fixture(scope="module")
def shared_run():
    subprocess.run(["ft_launcher"], check=True)


def test_unmarked_fixture(shared_run):
    pass


@pytest.mark.real_run
def test_marked():
    subprocess.run(["ft_launcher", "--nnodes=1"], check=True)


def test_unmarked_other_program():
    subprocess.run(["true"], check=True)


def test_unmarked_cli_run_refused(tmp_path):
    # the real CLI, refused before anything launches: no launch, no failure
    run = [sys.executable, "-m", "pytest_nvrx", "run", "--workload", "reference"]
    done = subprocess.run([*run, "--work-dir", str(tmp_path), "--train-iters", "0"])
    assert done.returncode == 2


def test_unmarked_cli_run_that_launched(tmp_path):
    # a stand-in for a CLI run that got as far as its launch: it wrote the run's run.json
    wrote = "import pathlib, sys; d = pathlib.Path(sys.argv[-1], 'runs', 'r'); "
    wrote += "d.mkdir(parents=True); (d / 'run.json').write_text('{}')"
    cli = ["-m", "pytest_nvrx", "run", "--work-dir", str(tmp_path)]
    subprocess.run([sys.executable, "-c", wrote, *cli], check=True)
"""


def test_an_unmarked_launch_fails_and_a_marked_one_runs(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = pytester.path / "bin"
    bin_dir.mkdir()
    stamp = pytester.path / "ran"
    script = bin_dir / "ft_launcher"
    script.write_text(f"#!/bin/sh\necho ran >> {stamp}\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    pytester.makeini("[pytest]\nmarkers =\n    real_run: launches\n")
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest_subprocess(
        "-p", "tests.helpers.launch_guard", "-p", "no:randomly", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=3, failed=3, errors=1)
    out = result.stdout.str()
    for name in (
        "test_unmarked",
        "test_unmarked_swallowing",
        "test_unmarked_cli_run_that_launched",
    ):
        assert f"FAILED test_inner.py::{name} " in out, out
    assert "ERROR test_inner.py::test_unmarked_fixture " in out, out
    assert (
        "test_inner.py::test_unmarked launches the real ft_launcher but does not carry "
        "@pytest.mark.real_run" in out
    ), out
    assert "ft_launcher: ft_launcher --nnodes=1" in out, out
    assert "-m pytest_nvrx run --work-dir" in out and "(launched)" in out, out
    # refused before it started; the marked test's ran
    assert stamp.read_text() == "ran\n"


@pytest.mark.parametrize(
    ("command", "program"),
    [
        (["/venv/bin/ft_launcher", "--nnodes=1", "-m", "x"], "ft_launcher"),
        (["srun", "--nodes=2", "/venv/bin/ft_launcher", "--nnodes=2"], "ft_launcher"),
        (["bash", "-c", "cd /tmp && exec torchrun --nproc-per-node=2 t.py"], "torchrun"),
        ([sys.executable, "-m", "torch.distributed.run", "t.py"],
         "python -m torch.distributed.run"),
        ([sys.executable, "-m", "pytest_nvrx", "run", "--workload", "reference"],
         "python -m pytest_nvrx run"),
        ([sys.executable, "-mpytest_nvrx", "selftest"], "python -m pytest_nvrx selftest"),
        ([sys.executable, "-m", "pytest_nvrx", "run", "--dry-run"], None),
        ([sys.executable, "-m", "pytest_nvrx", "run", "--help"], None),
        ([sys.executable, "-m", "pytest_nvrx", "verify", "runs/r1"], None),
        ([sys.executable, "-m", "pytest_nvrx", "--version"], None),
        (["./qualify", "-m", "kill"], None),  # its session's launches are out of sight
        (["grep", "ft_launcher_log", "launcher.log"], None),
        ([sys.executable, "-m", "pytest", "tests/test_readme.py"], None),
    ],
)  # fmt: skip
def test_what_launches(command: list[str], program: str | None) -> None:
    assert launched_program(command) == program
