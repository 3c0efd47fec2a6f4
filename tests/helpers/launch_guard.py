"""A test that launches the real ft_launcher carries ``@pytest.mark.real_run``, or fails.

``pytest -m "not real_run"`` is the fast loop; it stays true only if every real-run test says
so. This plugin (registered by tests/conftest.py, loadable as ``-p tests.helpers.launch_guard``)
arms a :func:`sys.addaudithook` for each test without the marker, from the start of its setup
(where a shared module or session run starts) to the end of its teardown, and watches the
processes it starts (``subprocess.Popen``, ``os.posix_spawn``, ``os.exec``, ``os.spawn``,
``os.system``):

* one whose command line names ``ft_launcher`` or ``torchrun`` (a path or a shell word ending
  in that name; ``srun ... ft_launcher`` too), ``python -m torch.distributed.run`` (or
  ``.launch``) or NVRx's launcher module is refused before it starts, and the test fails,
  whatever the code under test did with the exception;
* the CLI's ``python -m pytest_nvrx run`` or ``selftest`` (not ``--dry-run`` or ``--help``) is
  let start, and the test fails if it launched: a run.json written under its work dir's runs/
  since it started (``--work-dir``, else NVRX_WORK_DIR; a ``selftest`` of a work dir of its
  own counts as launched). A refusal before the launch (bad input, a full disk) is no launch.

It sees what this process starts: pytest-xdist workers load it too, and a pytester session run
in this process starts its launches here. What a process we start starts in turn is out of its
sight: a pytest session in a process of its own, ``./qualify``, an ``sbatch`` script; those
tests are marked by what they select. Disarmed (a marked test), the hook returns at its first
test; armed, it costs a set lookup per audit event.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_nvrx.layout import MANIFEST_NAME, RUNS_DIR

MARKER = "real_run"

WATCHED_EVENTS = frozenset(
    {"subprocess.Popen", "os.posix_spawn", "os.exec", "os.spawn", "os.system"}
)
#: programs that are a launch, by the last part of their path
LAUNCHER_NAMES = frozenset({"ft_launcher", "torchrun"})
#: ``python -m`` modules that are a launch
LAUNCHER_MODULES = frozenset(
    {
        "torch.distributed.run",
        "torch.distributed.launch",
        "nvidia_resiliency_ext.fault_tolerance.launcher",
    }
)
#: the CLI's commands that launch, and the flags that make them launch nothing
CLI_LAUNCHING = frozenset({"run", "selftest"})
CLI_NO_LAUNCH = frozenset({"--dry-run", "-h", "--help"})
#: the CLI's launches, confirmed by their run dirs (:func:`_cli_launched`)
CLI_PROGRAMS = frozenset(f"python -m pytest_nvrx {command}" for command in CLI_LAUNCHING)


class UnmarkedLaunch(Exception):
    """Raised into the code that would have started a launch in an unmarked test."""


def launched_program(command: Iterable[str]) -> str | None:
    """What in ``command`` (a process's argv, its words split on white space: a shell
    command's too) launches the real ft_launcher, or None."""
    words = [word for arg in command for word in arg.split()]
    for i, word in enumerate(words):
        name = os.path.basename(word)
        if name in LAUNCHER_NAMES:
            return name
        if word == "-m" and i + 1 < len(words):
            module, rest = words[i + 1], words[i + 2 :]
        elif word.startswith("-m") and len(word) > 2:
            module, rest = word[2:], words[i + 1 :]
        else:
            continue
        if module in LAUNCHER_MODULES:
            return f"python -m {module}"
        if module == "pytest_nvrx":
            command_word = next((w for w in rest if not w.startswith("-")), None)
            if command_word in CLI_LAUNCHING and not CLI_NO_LAUNCH.intersection(rest):
                return f"python -m pytest_nvrx {command_word}"
    return None


def _words(value: object) -> list[str]:
    if isinstance(value, (str, bytes, os.PathLike)):
        return [os.fsdecode(value)]
    if isinstance(value, Sequence):
        return [os.fsdecode(v) for v in value if isinstance(v, (str, bytes, os.PathLike))]
    return []


def _command(event: str, args: tuple[Any, ...]) -> list[str]:
    """The program (where it is not argv[0]) and argv an audited process start names."""
    if event == "os.system":  # (command,)
        return _words(args[0])
    # Popen: (executable, args, cwd, env); posix_spawn, exec: (path, argv, env); spawn: (mode,
    # path, args, env)
    program, argv = (args[1], args[2]) if event == "os.spawn" else (args[0], args[1])
    words = _words(argv)
    return [*_words(program), *words] if _words(program)[:1] != words[:1] else words


@dataclass(frozen=True)
class _CliStart:
    """A CLI ``run`` or ``selftest`` an armed test started: launched if a run.json appears."""

    what: str
    work_dir: Path | None
    since: float


def _option(words: Sequence[str], option: str) -> str | None:
    """The last value ``words`` give ``option`` (``--opt V`` or ``--opt=V``)."""
    found = None
    for i, word in enumerate(words):
        if word == option and i + 1 < len(words):
            found = words[i + 1]
        elif word.startswith(option + "="):
            found = word[len(option) + 1 :]
    return found


def _cli_start(command: list[str], args: tuple[Any, ...]) -> _CliStart:
    """A ``subprocess.Popen``'s CLI start: (executable, args, cwd, env)."""
    cwd = os.fsdecode(args[2]) if args[2] is not None else os.getcwd()
    env: Mapping[str, str] = args[3] if isinstance(args[3], Mapping) else os.environ
    work = _option(command, "--work-dir") or env.get("NVRX_WORK_DIR") or None
    work_dir = None if work is None else Path(cwd, os.path.expanduser(work))
    # a file system's clock runs a tick behind this one: a second of slack
    return _CliStart(" ".join(command)[:300], work_dir, time.time() - 1.0)


def _cli_launched(start: _CliStart) -> bool:
    """Whether the CLI wrote a run's run.json since it started (the launcher starts right
    after): a run refused before its launch writes none."""
    if start.work_dir is None:
        # run: no work dir is a refusal; selftest: its runs go to a work dir of its own
        return "pytest_nvrx selftest" in start.what
    try:
        run_dirs = list((start.work_dir / RUNS_DIR).iterdir())
    except OSError:
        return False
    for run_dir in run_dirs:
        try:
            if (run_dir / MANIFEST_NAME).stat().st_mtime >= start.since:
                return True
        except OSError:
            continue
    return False


class _State:
    """The armed test's node id (None: disarmed), the launches refused in it and the CLI
    starts to confirm at the end of its phase."""

    armed: str | None = None
    refused: list[str] = []  # noqa: RUF012 (one list, replaced per test)
    cli: list[_CliStart] = []  # noqa: RUF012 (one list, replaced per test)


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _State.armed is None or event not in WATCHED_EVENTS:
        return
    command = _command(event, args)
    program = launched_program(command)
    if program is None:
        return
    if program in CLI_PROGRAMS and event == "subprocess.Popen":
        _State.cli.append(_cli_start(command, args))
        return
    what = " ".join(command)[:300]
    _State.refused.append(f"{program}: {what}")
    raise UnmarkedLaunch(
        f"{_State.armed} launches {program} without @pytest.mark.{MARKER} (refused: {what})"
    )


_installed = False


def pytest_configure(config: pytest.Config) -> None:
    global _installed
    if not _installed:  # an audit hook cannot be removed: one per process
        sys.addaudithook(_audit)
        _installed = True


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    _State.refused, _State.cli = [], []
    _State.armed = None if item.get_closest_marker(MARKER) else item.nodeid
    try:
        return (yield)
    finally:
        _State.armed = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if not (_State.refused or _State.cli):
        return report
    launched = [start for start in _State.cli if _cli_launched(start)]
    found = [*_State.refused, *(f"{start.what} (launched)" for start in launched)]
    # a CLI still starting (its run.json not yet written) is looked at again after the next
    # phase, the test's teardown last
    _State.refused = []
    _State.cli = [start for start in _State.cli if start not in launched]
    if found:
        lines = [
            f"{item.nodeid} launches the real ft_launcher but does not carry "
            f"@pytest.mark.{MARKER} (module-level pytestmark where all its tests do):",
            *(f"  {line}" for line in found),
        ]
        if report.failed and report.longrepr is not None:
            lines += ["", "the test's own failure:", str(report.longrepr)]
        report.outcome = "failed"
        report.longrepr = "\n".join(lines)
    return report
