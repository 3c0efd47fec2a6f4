"""The first-use build in the entry points: a pytest session and ``python -m pytest_nvrx run``
build a Megatron checkout once before any scenario launches, say so in one line, and refuse an
unbuildable one before anything launches, in their own spelling (issue #35).

The checkout is the slow stand-in of tests/helpers/megatron_checkouts.py (no compiler needed); the
sessions are real (pytester in subprocesses, the CLI as a user runs it). No run is launched
here: the end-to-end runs are tests/launch/test_megatron_first_use_runs.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_nvrx.launch.gpu_slots import gpu_available
from tests.helpers.megatron_checkouts import DATASETS, slow_checkout, tool_bin

pytest_plugins = ["pytester"]

SUITE_ARGS = ["--pyargs", "pytest_nvrx.suite", "-p", "no:cacheprovider"]
ARTIFACT = f"{DATASETS}/helpers_data.py"
# on a GPU host the selected Megatron scenario would launch the stand-in
cpu_host = pytest.mark.skipif(gpu_available() is None, reason="this host has a GPU")


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_env: None) -> Path:
    """A fresh slow stand-in; its builds are logged in tmp_path/builds.log."""
    monkeypatch.setenv("NVRX_TEST_BUILD_LOG", str(tmp_path / "builds.log"))
    monkeypatch.setenv("NVRX_TEST_PIECE_S", "0.2")
    return slow_checkout(tmp_path / "Megatron-LM")


def builds(tmp_path: Path) -> int:
    log = tmp_path / "builds.log"
    return len(log.read_text().split()) if log.exists() else 0


def said(text: str) -> list[str]:
    return re.findall(r"^(?:\[gw\d+\] )?(nvrx: megatron build: .*)$", text, re.M)


@cpu_host
def test_a_session_builds_the_checkout_once_before_its_scenarios(
    pytester: pytest.Pytester, checkout: Path, tmp_path: Path
) -> None:
    args = [*SUITE_ARGS, "-k", "test_run_finished and megatron-baseline"]
    result = pytester.runpytest_subprocess(*args, "--nvrx-megatron-path", str(checkout))
    out = result.stdout.str()
    assert said(out) == [
        f"nvrx: megatron build: {ARTIFACT} built in {said(out)[0].split(' built in ')[1]}"
    ]
    assert " s, once, before launch (Megatron's first-use make -C " in said(out)[0]
    # before the scenario (which fails here: no GPU), after the header
    assert out.index("nvrx: 1 scenario: megatron-baseline") < out.index("nvrx: megatron build:")
    assert out.index("nvrx: megatron build:") < out.index("cannot run GPU scenarios")
    assert builds(tmp_path) == 1
    assert (checkout / ARTIFACT).read_text().endswith("COMPLETE = len(PIECES) == 5\n")
    again = pytester.runpytest_subprocess(*args, "--nvrx-megatron-path", str(checkout))
    assert said(again.stdout.str()) == [
        f"nvrx: megatron build: {ARTIFACT} already built (Megatron's first-use make -C"
        f" {DATASETS}, {DATASETS}/utils.py:10: up to date)"
    ]
    assert builds(tmp_path) == 1


def test_no_build_where_no_megatron_scenario_runs(
    pytester: pytest.Pytester, checkout: Path, tmp_path: Path
) -> None:
    """--collect-only, a selection without Megatron scenarios, and a judged existing run leave
    the checkout as it is."""
    given = ["--nvrx-megatron-path", str(checkout)]
    for args in (
        ["--collect-only", "-k", "megatron-baseline"],
        ["--collect-only", "-m", "not gpu", "-k", "reference-baseline"],
    ):
        result = pytester.runpytest_subprocess(*SUITE_ARGS, *given, *args)
        assert result.ret == pytest.ExitCode.OK, result.stdout.str()
        assert said(result.stdout.str()) == []
    assert builds(tmp_path) == 0 and not (checkout / ARTIFACT).exists()


def test_an_unbuildable_checkout_is_a_usage_error_before_anything_runs(
    pytester: pytest.Pytester, checkout: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", tool_bin(tmp_path / "bin", make=False, compiler=False))
    result = pytester.runpytest_subprocess(
        *SUITE_ARGS, "-k", "megatron-baseline", "--nvrx-megatron-path", str(checkout)
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.stderr.lines if line.startswith("ERROR: ")]
    assert errors == [
        "ERROR: pytest-nvrx: this Megatron checkout builds at first use"
        f" ({DATASETS}/utils.py:10 compile_helpers() runs make -C {DATASETS}), but make is not on"
        " PATH: rank 0 of every job would die there; install make, a C++ compiler and pybind11"
        " for the python3 on PATH"
    ]
    assert "passed" not in result.stdout.str() and "error" not in result.stdout.str().lower()


@cpu_host
def test_under_xdist_one_worker_says_it_once(
    pytester: pytest.Pytester, checkout: Path, tmp_path: Path
) -> None:
    result = pytester.runpytest_subprocess(
        *SUITE_ARGS, "-n", "2", "-k", "megatron-baseline", "--nvrx-megatron-path", str(checkout)
    )
    text = result.stdout.str() + "\n" + result.stderr.str()
    lines = re.findall(r"^\[gw\d+\] nvrx: megatron build: .*$", text, re.M)
    assert len(lines) == 1 and lines[0].startswith(f"[gw0] nvrx: megatron build: {ARTIFACT} ")
    assert builds(tmp_path) == 1


# ----------------------------------------------------------------------------------------------
# python -m pytest_nvrx run


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_nvrx", "run", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_the_cli_refuses_an_unbuildable_checkout_before_making_the_run_dir(
    checkout: Path, tmp_path: Path
) -> None:
    import os

    work = tmp_path / "work"
    env = {**os.environ, "PATH": tool_bin(tmp_path / "bin", make=False, compiler=False)}
    args = ["--workload", "megatron", "--megatron-path", str(checkout), "--fault", "none"]
    done = cli(*args, "--gpus-per-node", "1", "--work-dir", str(work), env=env)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "pytest-nvrx run: error: this Megatron checkout builds at first use"
        f" ({DATASETS}/utils.py:10 compile_helpers() runs make -C {DATASETS}), but make is not on"
        " PATH: rank 0 of every job would die there; install make, a C++ compiler and pybind11"
        " for the python3 on PATH"
    ]
    assert not work.exists() or list((work / "runs").iterdir()) == []
    # a dry run builds nothing and says nothing of it
    dry = cli(*args, "--work-dir", str(work), "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    assert said(dry.stdout + dry.stderr) == [] and builds(tmp_path) == 0


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_a_stop_signal_during_the_build_stops_it_whole(
    checkout: Path, tmp_path: Path, signame: str
) -> None:
    """SIGTERM (CI cancel) or Ctrl-C while run builds the checkout: make and what it started
    are killed, the claim and the build's temp dir removed, nothing launched."""
    import os
    import signal
    import time

    from tests.helpers.processes import MARK_VAR, dispositions, kill_marked, marked, new_mark

    mark = new_mark()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, MARK_VAR: mark, "NVRX_TEST_PIECE_S": "3", "TMPDIR": str(tmp)}
    args = ["--workload", "megatron", "--megatron-path", str(checkout), "--fault", "none"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest_nvrx", "run", *args, "--gpus-per-node", "1",
         "--work-dir", str(tmp_path / "work")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=dispositions("default"),
    )  # fmt: skip
    claim = checkout / DATASETS / ".nvrx-build.claim"
    try:
        deadline = time.monotonic() + 60
        while builds(tmp_path) == 0:  # the recipe has started
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        assert claim.exists()
        proc.send_signal(getattr(signal, signame))
        out, err = proc.communicate(timeout=60)
        left = marked(mark)  # at once: the CLI has exited, nothing of its build may be left
    finally:
        kill_marked(mark)
    assert proc.returncode == 128 + getattr(signal, signame), out + err
    assert f"interrupted by {signame}; nothing was launched" in err
    assert left == {}, left  # no make, no sleep of its recipe
    assert not claim.exists()
    assert not (checkout / ARTIFACT).exists()
    assert list(tmp.iterdir()) == []  # the build's copy removed
