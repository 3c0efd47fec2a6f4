"""Numbers, names and directories of a run read within bounds (issue #36 item 15).

* A number of more than :data:`~pytest_nvrx.evidence.refs.MAX_DIGITS` digits in any field a
  parser reads (an iteration, its total, consumed samples, a save or load, an exit code, a
  pid, a rank, a profiling cycle, the injector's fire and watch lines, a launch setting, a
  Megatron setting) is a ``ValueError`` traceback before (``int()`` refuses 5000 digits); now
  the line is unreadable evidence: the run "cannot judge" (exit 2), naming the line, in
  verify, report and the plugin. Each field is edited in every committed run of the window
  matrices (both workloads, every fault and window) and the fault-schedule runs that print it.
* A cycle record named for cycle 10**199 took time linear in its number (the search for a
  missing cycle walked every number below it: 1e8 took 44 s); now the records are walked.
* An unreadable ``checkpoints/``, ``cycle_infos/``, ``logs/`` or run directory is a
  ``PermissionError`` traceback before; now one line naming it, "cannot judge". As root the
  permission bits bind only a process without CAP_DAC_OVERRIDE: the commands run under
  ``setpriv`` with those capabilities dropped.

Every run edited is a copy of a committed real run (tests/helpers/doctor.py) in tmp_path.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_nvrx.report.main import report_main
from pytest_nvrx.verify import verify_main
from tests.helpers.doctor import Doctor, copy_run

pytest_plugins = ["pytester"]

DATA = Path(__file__).parents[1] / "data"
#: every fault in every window of both workloads, and the CPU fault schedules
RUNS = sorted(
    p
    for group in ("windows/cpu", "windows/gpu", "cpu-schedules")
    for p in (DATA / group).iterdir()
    if (p / "run.json").is_file()
)
REF_KILL_SAVE = DATA / "windows" / "cpu" / "ref-kill-save"
SUITE_ARGS = ["--pyargs", "pytest_nvrx.suite", "-p", "no:cacheprovider"]
BIG = "7" * 5000
#: (refs.MAX_DIGITS, spelled out: held equal in test_the_digit_bound)
UNREADABLE = "holds a number of more than 20 digits"


@dataclass(frozen=True)
class Field:
    """A parsed number: the file it is in and the pattern of its line, the number the group
    named ``n``."""

    id: str
    file: str
    pattern: str


CYCLE_LOGS = "logs/train_cycle*.log"
FIELDS = [
    # the reference workload's lines
    Field("ref-iteration", CYCLE_LOGS, r"\[ref\] \S+ rank \d+ iteration (?P<n>\d+)/"),
    Field("ref-total", CYCLE_LOGS, r"\[ref\] \S+ rank \d+ iteration \d+/(?P<n>\d+) "),
    Field("ref-consumed-samples", CYCLE_LOGS, r"iteration \d+/\d+ consumed_samples (?P<n>\d+) "),
    Field("ref-save-scheduled", CYCLE_LOGS, r"save scheduled iteration (?P<n>\d+)"),
    Field("ref-save-completed", CYCLE_LOGS, r"save completed iteration (?P<n>\d+)$"),
    Field("ref-load", CYCLE_LOGS, r"load checkpoint iteration (?P<n>\d+) "),
    Field("ref-load-consumed", CYCLE_LOGS, r"load checkpoint .* consumed_samples (?P<n>\d+)"),
    Field("ref-exit-code", CYCLE_LOGS, r"\[ref\] .* exit code (?P<n>\d+)$"),
    Field("ref-stated-rank", CYCLE_LOGS, r"\[ref\] \S+ rank (?P<n>\d+) iteration "),
    # Megatron's lines
    Field("megatron-iteration", CYCLE_LOGS, r"\] iteration\s+(?P<n>\d+)/"),
    Field("megatron-total", CYCLE_LOGS, r"\] iteration\s+\d+/\s*(?P<n>\d+) "),
    Field(
        "megatron-saved", CYCLE_LOGS, r"successfully saved checkpoint from iteration\s+(?P<n>\d+)"
    ),
    Field(
        "megatron-loaded", CYCLE_LOGS, r"successfully loaded checkpoint .* iteration\s+(?P<n>\d+)"
    ),
    Field("megatron-log-interval", CYCLE_LOGS, r"  log_interval \.+ (?P<n>\d+)"),
    Field(
        "megatron-consumed-samples", CYCLE_LOGS, r"\] iteration .* consumed samples: +(?P<n>\d+)"
    ),
    Field(
        "megatron-scheduled",
        CYCLE_LOGS,
        r"scheduled an async checkpoint save at iteration +(?P<n>\d+)",
    ),
    Field("traceback-frame-line", CYCLE_LOGS, r'  File ".*", line (?P<n>\d+), in '),
    # the fault injector's own lines
    Field("injector-pid", CYCLE_LOGS, r"\[pytest-nvrx injector\] rank \d+ pid (?P<n>\d+):"),
    Field("injector-baseline", CYCLE_LOGS, r"injector\].* \(baseline (?P<n>\d+)\) to inject"),
    Field("fire-in-flight", CYCLE_LOGS, r"injector\].* in-flight iteration (?P<n>\d+), tracker"),
    Field("fire-tracker", CYCLE_LOGS, r"injector\].*, tracker (?P<n>\d+); marker"),
    # the launcher's
    Field("profiling-cycle", "logs/launcher.log", r"- Cycle: (?P<n>\d+) Event: "),
    Field("section-timeout-cycle", "logs/launcher.log", r"\[Cycle (?P<n>\d+)\] Section '"),
    Field("gpu-reclaimed", "logs/launcher.log", r"GPU (?P<n>\d+) memory reclaimed in "),
    Field("worker-exit-code", "logs/launcher.log", r"failed \(exitcode: -?(?P<n>\d+)\)"),
    Field("worker-pid", "logs/launcher.log", r"failed \(exitcode: .*\(pid: (?P<n>\d+)\)"),
    Field(
        "worker-local-rank", "logs/launcher.log", r"failed \(exitcode: .* local_rank: (?P<n>\d+)"
    ),
    Field("glog-pid", "logs/launcher.log", r"^[IWEF]\d{4} [\d:.]+\s+(?P<n>\d+) .*failed \("),
    Field("restart-attempts", "logs/launcher.log", r"(?P<n>\d+)/\d+ attempts left"),
    Field("cycle-progress", "logs/launcher.log", r"Training cycle #(?P<n>\d+) made "),
    Field("launch-max-restarts", "logs/launcher.log", r"^  max_restarts\s*: (?P<n>\d+)$"),
    Field("launch-nproc", "logs/launcher.log", r"Using nproc_per_node=(?P<n>\d+)"),
]

FIELD = {field.id: field for field in FIELDS}


def first_line(run: Path, field: Field) -> tuple[str, int, re.Match[str]] | None:
    """The first line of ``run`` the field's pattern finds: (file, 1-based line, match)."""
    pattern = re.compile(field.pattern)
    for path in sorted(run.glob(field.file)):
        with path.open(encoding="utf-8", errors="replace") as fh:
            for lineno, line in enumerate(fh, start=1):
                m = pattern.search(line.rstrip("\n"))
                if m is not None:
                    return path.relative_to(run).as_posix(), lineno, m
    return None


def with_big_number(src: Path, dest: Path, field: Field) -> str | None:
    """A copy of ``src`` whose first line of ``field`` holds a 5000-digit number; its
    ``file:line``, or None (no copy) where the run prints no such line."""
    found = first_line(src, field)
    if found is None:
        return None
    rel, lineno, m = found
    run = copy_run(src, dest)
    lines = run.lines(rel)
    line = lines[lineno - 1]
    lines[lineno - 1] = line[: m.start("n")] + BIG + line[m.end("n") :]
    run.write_lines(rel, lines)
    return f"{rel}:{lineno}"


def verify(run: Path, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = verify_main([str(run), *argv], out, err)
    return status, out.getvalue(), err.getvalue()


def test_the_digit_bound() -> None:
    from pytest_nvrx.evidence.refs import MAX_DIGITS, NumberTooLong, check_numbers, read_int

    assert f"more than {MAX_DIGITS} digits" in UNREADABLE
    assert read_int("9" * MAX_DIGITS) == int("9" * MAX_DIGITS)
    assert read_int("-12") == -12 and read_int("007") == 7
    for text in ("9" * (MAX_DIGITS + 1), "-" + "9" * (MAX_DIGITS + 1), BIG):
        with pytest.raises(NumberTooLong, match=f"a number of {len(text.lstrip('-'))} digits"):
            read_int(text)
    assert check_numbers("a 12 b 99") == "a 12 b 99"
    with pytest.raises(NumberTooLong):
        check_numbers(f"world {'1' * (MAX_DIGITS + 1)} ranks")
    with pytest.raises(NumberTooLong):  # any script's digits, as the parsers' \d reads them
        check_numbers("\u0661" * (MAX_DIGITS + 1))


@pytest.mark.parametrize("field", FIELDS, ids=lambda f: f.id)
def test_a_number_past_the_bound_in_any_parsed_field_cannot_be_judged(
    field: Field, tmp_path: Path
) -> None:
    edited = []
    for src in RUNS:
        where = with_big_number(src, tmp_path / src.name, field)
        if where is None:
            continue
        edited.append(src.name)
        status, out, err = verify(tmp_path / src.name)
        assert status == 2, f"{src.name} ({where}): {out[-800:]}{err}"
        assert f"{where} {UNREADABLE}" in err, f"{src.name} ({where}): {err}"
        assert "Traceback" not in out + err and BIG not in out + err
        shutil.rmtree(tmp_path / src.name)
    assert edited, f"no committed run prints {field.id}"


@pytest.mark.parametrize(
    "field",
    [FIELD["ref-iteration"], FIELD["profiling-cycle"], FIELD["injector-baseline"]],
    ids=lambda f: f.id,
)
def test_report_and_verify_json_say_so_too(field: Field, tmp_path: Path) -> None:
    where = with_big_number(REF_KILL_SAVE, tmp_path / "run", field)
    assert where is not None
    out, err = io.StringIO(), io.StringIO()
    html = tmp_path / "out" / "report.html"
    status = report_main([str(tmp_path / "run"), "-o", str(html)], out, err)
    assert status == 1, err.getvalue()
    assert "run: NOT QUALIFIED: cannot judge" in out.getvalue()
    assert f"{where} {UNREADABLE}" in html.read_text(encoding="utf-8")
    status, text, _ = verify(tmp_path / "run", "--json", "-")
    assert status == 2 and f"{where} {UNREADABLE}" in text and BIG not in text


def test_the_plugin_judges_such_a_run_without_a_traceback(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    where = with_big_number(REF_KILL_SAVE, tmp_path / "run", FIELD["ref-iteration"])
    result = pytester.runpytest(*SUITE_ARGS, "--nvrx-run-dir", str(tmp_path / "run"))
    out = result.stdout.str()
    assert "Traceback" not in out and "ValueError" not in out and "INTERNALERROR" not in out
    assert f"{where} {UNREADABLE}" in out
    assert result.ret == pytest.ExitCode.TESTS_FAILED


# -- cycle records named for a huge cycle -------------------------------------------------------


def cli(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_nvrx", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.parametrize(
    ("name", "message"),
    [
        # NVRx's numbering is checked against the name: a gap below it, quickly found
        ("cycle_info..0.100000000", "no record of cycle 2 exists"),
        (f"cycle_info..0.{'9' * 200}", "is named with a number of 200 digits"),
        (f"cycle_info..{'9' * 200}.0", "is named with a number of 200 digits"),
    ],
    ids=["1e8", "cycle-200-digits", "attempt-200-digits"],
)
def test_a_cycle_record_named_for_a_huge_cycle_is_judged_at_once(
    tmp_path: Path, name: str, message: str
) -> None:
    run = copy_run(REF_KILL_SAVE, tmp_path / "run")
    shutil.copy(run.path("cycle_infos/cycle_info..0.1"), run.path(f"cycle_infos/{name}"))
    started = time.monotonic()
    done = cli("verify", str(run.root), timeout=60)  # before: linear in the number, hours
    assert time.monotonic() - started < 30
    assert done.returncode == 2, done.stdout[-600:] + done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr, done.stderr


# -- directories that cannot be read --------------------------------------------------------------


def _unprivileged() -> list[str]:
    """The command prefix that makes permission bits bind (root ignores them)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: permission bits do not bind")
    caps = "-dac_override,-dac_read_search"
    return [setpriv, f"--bounding-set={caps}", f"--inh-caps={caps}"]


@pytest.fixture
def unreadable_run(tmp_path: Path) -> Iterator[Doctor]:
    run = copy_run(REF_KILL_SAVE, tmp_path / "run")
    yield run
    for p in [run.root, *(p for p in run.root.iterdir() if p.is_dir())]:
        p.chmod(0o755)  # tmp_path is removed later


@pytest.mark.parametrize("mode", [0o000, 0o311, 0o644], ids=["none", "no-read", "no-search"])
@pytest.mark.parametrize("folder", ["checkpoints", "cycle_infos", "logs"])
def test_an_unreadable_evidence_directory_is_one_line_cannot_judge(
    unreadable_run: Doctor, folder: str, mode: int, tmp_path: Path
) -> None:
    unreadable_run.path(folder).chmod(mode)
    for argv in (
        ["verify", str(unreadable_run.root)],
        ["report", str(unreadable_run.root), "-o", str(tmp_path / "r.html")],
    ):
        done = subprocess.run(
            [*_unprivileged(), sys.executable, "-m", "pytest_nvrx", *argv],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        text = done.stdout + done.stderr
        assert "Traceback" not in text and "PermissionError" not in text, text[-2000:]
        assert f"{folder} cannot be read (Permission denied)" in text, text[-2000:]
        assert done.returncode == (2 if argv[0] == "verify" else 1), text[-2000:]


def test_an_unreadable_run_directory_is_one_line(unreadable_run: Doctor) -> None:
    unreadable_run.root.chmod(0o000)
    done = subprocess.run(
        [*_unprivileged(), sys.executable, "-m", "pytest_nvrx", "verify", str(unreadable_run.root)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr == (
        f"verify: error: run directory {unreadable_run.root} cannot be read (Permission denied)\n"
    )


@pytest.mark.parametrize(
    "rel",
    [
        "logs/train_cycle1.log",
        "logs/launcher.log",
        "checkpoints/latest_checkpointed_iteration.txt",
        "cycle_infos/cycle_info..0.1",
        "run.json",
        "result.json",
        "fault_injected.json",
    ],
)
def test_an_evidence_file_that_cannot_be_read_cannot_be_judged(
    unreadable_run: Doctor, rel: str
) -> None:
    """A file that is there and cannot be read says something unknown: never absence. Before,
    an unreadable cycle log or launcher log was a note and the criteria failed as if it were
    empty, and an unreadable tracker a note beside PASSED."""
    unreadable_run.path(rel).chmod(0o000)
    done = subprocess.run(
        [*_unprivileged(), sys.executable, "-m", "pytest_nvrx", "verify", str(unreadable_run.root)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stdout[-1500:] + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("verify: error:")]
    assert errors and rel in errors[0] and "Permission denied" in errors[0], done.stderr
    assert "Traceback" not in done.stdout + done.stderr


def test_a_cycle_log_named_for_a_huge_cycle_cannot_be_judged(tmp_path: Path) -> None:
    """``logs/train_cycle<200 digits>.log`` beside the real ones: before, a cycle of that number
    without a record (a note) and a failed criterion; it names no cycle a run has."""
    run = copy_run(REF_KILL_SAVE, tmp_path / "run")
    name = f"train_cycle{'9' * 200}.log"
    shutil.copy(run.path("logs/train_cycle1.log"), run.path(f"logs/{name}"))
    status, out, err = verify(run.root)
    assert status == 2, out[-800:] + err
    assert f"logs/{name} is named for a cycle of 200 digits" in err and "Traceback" not in err
