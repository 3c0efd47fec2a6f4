"""README.md's commands, run as written (issue #23 item 6).

The ``bash`` blocks' commands and the dry-run command of the prose, each through the shell as it
stands, with only its paths moved under the test's directory (``/tmp/nvrx`` and the Megatron
checkout ``/workspace/Megatron-LM``, for which a stand-in serves) and ``<run-id>`` filled in:

* ``python -m pytest_nvrx run`` launches one real reference run through ft_launcher; ``verify``
  and ``report`` judge it (exit 0, the report written);
* the ``pytest`` lines (GPU qualifications) collect only here: no GPU; their selection must hold
  the scenarios they name;
* the dry run prints the command and writes nothing.

Not here: ``./qualify`` (tests/session/test_qualify.py runs it for real), ``./check`` (what CI
runs), the install lines (tests/test_install_as_written.py runs them as written, git serving the
project's URL from a bare clone of this checkout).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")


def bash_lines() -> list[str]:
    lines: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        for line in block.splitlines():
            command = line.split("  #")[0].strip()
            if command and not command.startswith("#"):
                lines.append(command)
    return lines


def run_shell(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture
def shell_env(tmp_path: Path) -> dict[str, str]:
    """This interpreter's venv first on PATH (``python``, ``pytest``, ``ft_launcher``), none of
    this session's pytest or nvrx settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_", "NVRX_")) and k != "MEGATRON_PATH"
    }
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def moved(command: str, tmp_path: Path) -> str:
    megatron = tmp_path / "Megatron-LM"
    if not megatron.is_dir():
        megatron.mkdir()
        (megatron / "pretrain_gpt.py").write_text("raise SystemExit('not a real Megatron')\n")
    return command.replace("/tmp/nvrx", str(tmp_path / "nvrx")).replace(
        "/workspace/Megatron-LM", str(megatron)
    )


@pytest.mark.real_run
def test_the_readme_run_verify_and_report_commands_run_as_written(
    tmp_path: Path, shell_env: dict[str, str]
) -> None:
    lines = bash_lines()
    run = next(line for line in lines if line.startswith("python -m pytest_nvrx run "))
    verify = next(line for line in lines if line.startswith("python -m pytest_nvrx verify "))
    report = next(line for line in lines if line.startswith("python -m pytest_nvrx report "))
    done = run_shell(moved(run, tmp_path), tmp_path, shell_env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run_dir,) = (tmp_path / "nvrx" / "runs").iterdir()
    command = moved(verify, tmp_path).replace("<run-id>", run_dir.name)
    judged = run_shell(command, tmp_path, shell_env)
    assert judged.returncode == 0 and "verify: PASSED (6 of 6)" in judged.stdout, judged.stdout
    reported = run_shell(moved(report, tmp_path), tmp_path, shell_env)
    assert reported.returncode == 0, reported.stdout + reported.stderr
    assert (tmp_path / "report.html").is_file() and (tmp_path / "report.json").is_file()


def test_the_readme_gpu_qualifications_select_what_they_say(
    tmp_path: Path, shell_env: dict[str, str]
) -> None:
    lines = [line for line in bash_lines() if line.startswith("pytest --pyargs pytest_nvrx.suite")]
    assert len(lines) == 2, lines
    for line in lines:
        command = moved(line, tmp_path) + " --collect-only -q -p no:cacheprovider"
        done = run_shell(command, tmp_path, shell_env)
        assert done.returncode == 0, done.stdout + done.stderr
        ids = set(re.findall(r"test_run_finished\[(megatron-[a-z-]+)\]", done.stdout))
        assert ids and all(i.startswith("megatron-") for i in ids), done.stdout
        argv = shlex.split(line)
        if "gpu and finalize" in argv:
            assert {i.rsplit("-", 1)[-1] for i in ids} == {"finalize"}, ids


def test_the_readme_dry_run_prints_the_command_and_writes_nothing(
    tmp_path: Path, shell_env: dict[str, str]
) -> None:
    (line,) = set(re.findall(r"`(NVRX_DRY_RUN=1 [^`]*)`", README))
    done = run_shell(moved(line, tmp_path), tmp_path, shell_env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ft_launcher --nnodes=1" in done.stdout
    assert list(tmp_path.iterdir()) == [tmp_path / "Megatron-LM"]  # the stand-in alone


#: Every README command and the test that runs it as written.
COVERED = {
    "./qualify": "tests/session/test_qualify.py (a real qualification through the script)",
    "./check": ".ci/run (CI runs exactly this)",
    "MEGATRON_PATH=/workspace/Megatron-LM ./qualify": "tests/session/test_qualify.py (no GPU here)",
    "uv pip install ": "tests/test_install_as_written.py",
    "pip install ": "tests/test_install_as_written.py",
    "pytest --pyargs pytest_nvrx.suite ": "test_the_readme_gpu_qualifications_select_what_they_say",
    "python -m pytest_nvrx run ": "test_the_readme_run_verify_and_report_commands_run_as_...",
    "python -m pytest_nvrx verify ": "test_the_readme_run_verify_and_report_commands_run_as_...",
    "python -m pytest_nvrx report ": "test_the_readme_run_verify_and_report_commands_run_as_...",
}


def test_every_readme_command_has_a_test_that_runs_it() -> None:
    """A command added to the README without a test running it fails here."""
    lines = bash_lines()
    assert len(lines) >= 10, lines
    uncovered = [line for line in lines if not any(line.startswith(p) for p in COVERED)]
    assert not uncovered, f"README commands no test runs as written: {uncovered}"


def test_every_pytest_spelled_in_the_readme_selects_the_suite() -> None:
    """A comment's ``pytest -m gpu --nvrx-megatron-path X`` (no --pyargs) collects 0 items and
    exits 5 outside this repository: every pytest the README spells, in a comment or a command,
    with a marker or an --nvrx option, names the suite."""
    spelled = re.findall(r"(?:^|[`:#]\s*)(pytest\s[^`\n]*)", README, re.M)
    suite = [s for s in spelled if "--nvrx-" in s or re.search(r"\s-m\s", s)]
    assert suite, spelled
    missing = [s for s in suite if "--pyargs pytest_nvrx.suite" not in s]
    assert not missing, f"README pytest lines without --pyargs pytest_nvrx.suite: {missing}"
