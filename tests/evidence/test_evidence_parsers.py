"""Parsers on the real H200 artifacts and on malformed input (which must never crash them)."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from pytest_nvrx.evidence import load_run
from pytest_nvrx.evidence.cycle_infos import read_cycle_infos
from pytest_nvrx.evidence.cycle_log import MAX_ERRORS, SAVES_KEPT, parse_cycle_log
from pytest_nvrx.evidence.launcher_log import LauncherEventKind as K
from pytest_nvrx.evidence.launcher_log import parse_launcher_log
from pytest_nvrx.evidence.manifest import ManifestError, read_manifest
from pytest_nvrx.evidence.marker import read_marker
from pytest_nvrx.evidence.megatron import MEGATRON
from pytest_nvrx.evidence.refs import LineCursor, split_rank_prefix
from pytest_nvrx.evidence.rundir import RunDirError
from pytest_nvrx.evidence.tracker import read_tracker
from pytest_nvrx.evidence.workload import (
    FtTimeoutsReported,
    IterationCommitted,
    LoadCompleted,
    LoadStarted,
    Milestone,
    MilestoneLookalike,
    OptimizerLoadFailed,
    SaveCompleted,
    SaveScheduled,
    SettingReported,
    StartedFromScratch,
    VersionReported,
    WorkloadError,
    get_adapter,
)
from tests.helpers.doctor import (
    BASELINE_RUN,
    CYCLE0,
    CYCLE1,
    KILL_RUN,
    LAUNCHER,
    MARKER,
    copy_run,
    nvrx_line,
)


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


# ---------------------------------------------------------------------------------------------
# Megatron adapter, line by line


def parse(line: str) -> object:
    cursor = LineCursor("logs/x.log")
    cursor.lineno, cursor.raw = 7, "0: " + line
    return MEGATRON.parse_line(line, cursor)


_FT_LINE = (
    "FT: initialized. Timeouts=SectionTimeouts(out_of_section=60.00, sections=[setup=900.00,"
    " step=30.00, checkpointing=30.00, ], calculated_sections={calc},"
    " is_out_of_section_calculated={oos})"
)


@pytest.mark.parametrize(
    ("calc", "oos", "calculated"),
    [("set()", "False", False), ("{'step'}", "False", True), ("set()", "True", True)],
)
def test_megatron_ft_line_says_its_deadlines(calc: str, oos: str, calculated: bool) -> None:
    # run.json's section_timeouts and the other cycles' are checked against it; deadlines NVRx
    # calculated itself (--calc-ft-timeouts) are not the launcher's and are compared with nothing
    event = parse(_FT_LINE.format(calc=calc, oos=oos))
    assert isinstance(event, FtTimeoutsReported)
    assert event.sections == (("checkpointing", 30.0), ("setup", 900.0), ("step", 30.0))
    assert event.out_of_section == 60.0 and event.calculated is calculated


def test_megatron_ft_line_of_no_deadline_is_no_evidence() -> None:
    line = _FT_LINE.format(calc="set()", oos="False")
    assert parse(line.replace("step=30.00", "step=\u0663\u0660.00")) is None
    assert parse(line.replace("step=30.00", "step=nan")) is None


def test_megatron_iteration_line() -> None:
    ev = parse(
        " [2026-11-29 11:03:47.596636] iteration        1/     100 | consumed samples:            1"
        " | elapsed time per iteration (ms): 2711.7 | learning rate: 1.000000E-04 | global batch"
        " size:     1 | lm loss: 7.009670E+00 | loss scale: 1.0 | grad norm: 6.704 |"
    )
    assert isinstance(ev, IterationCommitted)
    assert (ev.iteration, ev.total, ev.consumed_samples, ev.loss) == (1, 100, 1, 7.00967)
    assert ev.time == utc("2026-11-29 11:03:47.596636")
    assert ev.ref.location == "logs/x.log:7" and ev.ref.text.startswith("0:  [2026")


@pytest.mark.parametrize(
    ("line", "kind", "iteration"),
    [
        (
            "  [2026-11-29 11:03:55.321189] scheduled an async checkpoint save at iteration       5"
            " to /c",
            SaveScheduled,
            5,
        ),
        (
            "  [2026-11-29 11:03:55.958385] successfully saved checkpoint from iteration       5 to"
            " /c [ t 1/1, gtp_remat 1/1, p 1/1 ]",
            SaveCompleted,
            5,
        ),
        (" loading distributed checkpoint from /c at iteration 5", LoadStarted, 5),
        (" loading checkpoint from /c at iteration 12", LoadStarted, 12),
        (
            "  successfully loaded checkpoint from /c [ t 1/1, gtp_remat 1/1, p 1/1 ]"
            " at iteration 5",
            LoadCompleted,
            5,
        ),
    ],
)
def test_megatron_checkpoint_lines(line: str, kind: type, iteration: int) -> None:
    ev = parse(line)
    assert isinstance(ev, kind)
    assert ev.iteration == iteration  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("    will not load any checkpoints and will start from random", StartedFromScratch),
        (
            "Unable to load optimizer from checkpoint /c/iter_0000005. Specify ...",
            OptimizerLoadFailed,
        ),
        ("[rank0]: Traceback (most recent call last):", WorkloadError),
        ("AssertionError", WorkloadError),
        ("[rank0]: torch.distributed.DistBackendError: NCCL error", WorkloadError),
        ("KeyError: 'optimizer'", WorkloadError),
        ("[after training is done] datetime: 2026-11-29 11:04:42.978219 ", Milestone),
        ("> Megatron-Core version .......... 0.19.1", VersionReported),
        # every entry of the argument dump is kept: all are compared between cycles
        ("  async_save ...................................... True", SettingReported),
        ("  ckpt_assume_constant_structure .................. False", SettingReported),
        ("  exit_on_missing_checkpoint ...................... False", SettingReported),
    ],
)
def test_megatron_other_lines(line: str, kind: type) -> None:
    assert isinstance(parse(line), kind)


def test_megatron_training_done_is_print_datetimes_whole_line() -> None:
    done = parse("[after training is done] datetime: 2026-11-29 11:04:42.978219 ")
    assert isinstance(done, Milestone)
    assert (done.name, done.iteration) == ("training_done", None)


@pytest.mark.parametrize(
    "line",
    [
        "WARNING: will print [after training is done] datetime: 2026-11-29 11:04:42.978219 ",
        "[after training is done] datetime: 2026-11-29 11:04:42.978219 (not really)",
        # print_datetime's strftime('%Y-%m-%d %H:%M:%S.%f') and its space, exactly
        "[after training is done] datetime: 2026-11-29 11:04:42.978219",
        "[after training is done] datetime: 2026-11-29 11:04:42 ",
        "[after training is done] datetime: 2026-11-29 11:04:42.97 ",
    ],
)
def test_megatron_a_line_almost_training_done_is_no_milestone(line: str) -> None:
    almost = parse(line)
    assert isinstance(almost, MilestoneLookalike)
    assert almost.name == "training_done"
    assert MEGATRON.event_kind(line) is MilestoneLookalike


@pytest.mark.parametrize(
    "line",
    [
        "/workspace/x.py:25: UserWarning: Transformer Engine and Apex are not installed.",
        "WARNING: Starting a checkpoint save before previous has finished.",
        "[Rank 0] (before save_checkpoint for iteration 5) memory (MB) | allocated: 292.73",
        " [2026-11-29 11:03:47] iteration garbage",
        "  [garbage] successfully saved checkpoint from iteration x",
        "",
    ],
)
def test_megatron_ignores_other_lines(line: str) -> None:
    assert parse(line) is None


def test_adapter_registry() -> None:
    assert get_adapter("megatron") is MEGATRON
    with pytest.raises(KeyError, match="no log adapter for workload 'nope'"):
        get_adapter("nope")


# ---------------------------------------------------------------------------------------------
# cycle logs


def test_real_cycle_logs() -> None:
    c0 = parse_cycle_log(KILL_RUN / CYCLE0, 0, MEGATRON, file=CYCLE0)
    assert (c0.line_count, c0.ranks, c0.unprefixed_lines) == (1057, (0,), 0)
    assert c0.first_iteration is not None and c0.first_iteration.iteration == 1
    assert c0.max_iteration is not None and c0.max_iteration.iteration == 10
    assert [e.iteration for e in c0.of_type(SaveScheduled)] == [5, 10]
    assert [e.iteration for e in c0.of_type(SaveCompleted)] == [5]
    assert c0.of_type(StartedFromScratch)[0].ref.location == f"{CYCLE0}:951"
    c1 = parse_cycle_log(KILL_RUN / CYCLE1, 1, MEGATRON, file=CYCLE1)
    assert [e.iteration for e in c1.of_type(LoadCompleted)] == [5]
    assert c1.first_iteration is not None and c1.first_iteration.iteration == 6
    assert c1.iteration_lines == 95 and c1.last_line is not None
    assert c1.last_line.location == f"{CYCLE1}:1276"


def test_cycle_log_multi_rank_and_unprefixed_lines(tmp_path: Path) -> None:
    log = tmp_path / "train_cycle3.log"
    log.write_text(
        " 0: > PyTorch version ................ 2.11.0\n"
        "12:  [2026-11-29 11:00:00.000001] iteration        7/      9 | consumed samples: 7 |\n"
        "a line without a prefix\n"
        "3:  [2026-11-29 11:00:01.5] iteration        8/      9 | consumed samples: 8 |\n"
        " [2026-11-29 11:00:02] iteration        9/      9 | consumed samples:   9 |\n"
    )
    c = parse_cycle_log(log, 3, MEGATRON)
    assert c.ranks == (0, 3, 12) and c.unprefixed_lines == 2
    assert c.first_iteration is not None and c.first_iteration.iteration == 7
    assert c.max_iteration is not None and c.max_iteration.iteration == 9
    assert c.max_iteration.ref.line == 5 and c.iteration_lines == 3


LINES_NEAR_A_PREFIX = [
    "1: > PyTorch version ................ 2.11.0",
    "1: 1: a body that starts like a prefix",
    "1:x not a prefix (no space after the colon)",
    "10: > Megatron-Core version ................ 0.19.0",
    "1 : spaces inside the prefix",
    "1: Traceback (most recent call last):",
    '1:   File "/ckpt/megatron/core/x.py", line 3, in f',
    "1: KeyError: 'x'",
    "   1: > PyTorch version ................ 2.11.0",
    "1234567: too long to be a prefix",
    "no prefix at all",
    "",
    "1: ",
    "1:  [2026-11-29 11:00:00] iteration        4/      9 | consumed samples: 4 |",
]


def test_cycle_log_rank_prefixes_agree_with_split_rank_prefix(tmp_path: Path) -> None:
    """The parser remembers the last rank prefix it saw (most lines share it); every line must
    still be split exactly as :func:`split_rank_prefix` splits it on its own."""
    log = tmp_path / "train_cycle0.log"
    log.write_text("\n".join(LINES_NEAR_A_PREFIX) + "\n")
    split = [split_rank_prefix(line) for line in LINES_NEAR_A_PREFIX]
    c = parse_cycle_log(log, 0, MEGATRON)
    assert c.ranks == tuple(sorted({r for r, _ in split if r is not None})) == (1, 10)
    assert c.unprefixed_lines == sum(r is None for r, _ in split) == 4
    versions = {(e.component, e.ref.line) for e in c.of_type(VersionReported)}
    assert versions == {("torch", 1), ("megatron_core", 4), ("torch", 9)}
    (error,) = c.of_type(WorkloadError)
    assert error.exception == "KeyError: 'x'" and error.ref.line == 8
    assert c.iteration_lines == 1 and c.max_iteration is not None
    assert c.max_iteration.ref.line == len(LINES_NEAR_A_PREFIX)


def test_cycle_log_naive_times_take_the_host_zone(tmp_path: Path) -> None:
    log = tmp_path / "l.log"
    log.write_text("0:  [2026-11-29 13:00:00.000000] iteration        1/      2 |\n")
    c = parse_cycle_log(log, 0, MEGATRON, tz=__import__("datetime").timezone(timedelta(hours=2)))
    assert c.first_iteration is not None and c.first_iteration.time == utc("2026-11-29 11:00:00")


def test_cycle_log_malformed(tmp_path: Path) -> None:
    missing = parse_cycle_log(tmp_path / "nope.log", 0, MEGATRON)
    assert not missing.exists and missing.line_count == 0
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    e = parse_cycle_log(empty, 0, MEGATRON)
    assert e.exists and e.line_count == 0 and e.first_line is None and e.last_line is None
    junk = tmp_path / "junk.log"
    junk.write_bytes(
        os.urandom(4096).replace(b"\n", b"")
        + b"\n0:  [2026-11-29 11:00:00.0] iteration        4/     10 | consumed samp"
    )
    j = parse_cycle_log(junk, 0, MEGATRON)
    assert j.line_count == 2
    assert j.max_iteration is not None and j.max_iteration.iteration == 4  # truncated last line


def test_cycle_log_keeps_bounded_errors(tmp_path: Path) -> None:
    log = tmp_path / "errors.log"
    log.write_text("0: RuntimeError: boom\n" * (MAX_ERRORS + 7))
    c = parse_cycle_log(log, 0, MEGATRON)
    assert len(c.of_type(WorkloadError)) == MAX_ERRORS and c.errors_not_kept == 7


# ---------------------------------------------------------------------------------------------
# launcher log


def test_real_launcher_log() -> None:
    log = parse_launcher_log(KILL_RUN / LAUNCHER, file=LAUNCHER)
    assert log.utc_offset == timedelta(0)
    assert log.first.time == utc("2026-11-29 11:03:14.654")
    assert log.config["nproc_per_node"] == "1" and log.config["max_restarts"] == "3"
    assert log.nproc_per_node == 1
    (failed,) = log.of_kind(K.WORKER_FAILED)
    assert (failed.rank, failed.pid, failed.exit_code) == (0, 585, -9)
    assert failed.time == utc("2026-11-29 11:03:56.239")  # glog line: year from neighbours
    (detected,) = log.profiling("failure_detected")
    assert detected.cycle == 1 and detected.ref.location == f"{LAUNCHER}:40"
    assert [e.cycle for e in log.profiling("worker_start_completed")] == [0, 1]
    assert len(log.of_kind(K.GROUP_FAILED)) == 1 and len(log.of_kind(K.RUN_OK)) == 1


def test_launcher_log_host_zone_from_profiling_events(tmp_path: Path) -> None:
    # log stamps in UTC+2 local time; profiling events also carry UTC
    path = tmp_path / "launcher.log"
    path.write_text(
        "2026-11-29 13:00:00,000 [INFO] [vm] [workload:?(?) infra:?(?)] profiling.py:93   - Cycle:"
        " 0 Event: worker_start_completed Node: n Rank: 0 Time: 2026-11-29 11:00:00.001 UTC\n"
        "E1129 13:00:05.000000 547 torch/api.py:986] failed (exitcode: -9) local_rank: 1 (pid: 9)"
        " of binary: /p\n"
    )
    log = parse_launcher_log(path)
    assert log.utc_offset == timedelta(hours=2)
    assert log.of_kind(K.WORKER_FAILED)[0].time == utc("2026-11-29 11:00:05")


@pytest.mark.parametrize(
    ("message", "kind", "field", "value"),
    [
        (
            "[Cycle 0] Section 'step' has been open for 30.61 seconds. Timeout is 30.00 seconds.",
            K.SECTION_TIMEOUT,
            "name",
            "step",
        ),
        (
            "[Cycle 2] Was out of section for 181.00 seconds. Timeout is 180.00 seconds.",
            K.SECTION_TIMEOUT,
            "name",
            "out_of_section",
        ),
        (
            "[Cycle 1] Did not get subsequent heartbeat. Waited 60.00 seconds.",
            K.HEARTBEAT_TIMEOUT,
            "cycle",
            1,
        ),
        (
            "EARLY TERMINATION: 3 consecutive training cycles without progress",
            K.EARLY_TERMINATION,
            None,
            None,
        ),
        (
            "NVRx decided the job must not be restarted (no_progress): x. Agent's exit code = 93",
            K.NO_RESTART,
            "exit_code",
            93,
        ),
        (
            "Training cycle #1 made NO progress: 5 → 5 (0 iterations, need 1).",
            K.NO_PROGRESS,
            None,
            None,
        ),
        ("Agent exits with exit code = 0.", K.AGENT_EXIT, "exit_code", 0),
        (
            "Some rank(s) exited with non-zero exit code: {}. Agent's exit code = 1",
            K.AGENT_EXIT,
            "exit_code",
            1,
        ),
        (
            "[default] Worker group UNHEALTHY. 2/3 attempts left; will restart worker group",
            K.GROUP_FAILED,
            "name",
            "UNHEALTHY",
        ),
        ("[default] Joining cluster restart (group_rank=1)", K.JOIN_RESTART, None, None),
    ],
)
def test_launcher_messages(
    tmp_path: Path, message: str, kind: K, field: str | None, value: object
) -> None:
    path = tmp_path / "launcher.log"
    path.write_text("0: " + nvrx_line("11:00:00,000", message, local="1") + "\n")
    (event,) = parse_launcher_log(path).events
    assert event.kind is kind
    if field is not None:
        assert getattr(event, field) == value
    if kind is K.SECTION_TIMEOUT:
        assert event.rank == 1  # from workload:?(1)


def test_launcher_log_malformed(tmp_path: Path) -> None:
    assert not parse_launcher_log(tmp_path / "missing.log").exists
    path = tmp_path / "launcher.log"
    path.write_bytes(b"")
    empty = parse_launcher_log(path)
    assert empty.exists and empty.events == () and empty.first.time is None
    path.write_bytes(
        b"\x00\xff garbage\nnot a log line\n2026-11-29 11:00:00,000 [INFO] [vm] [worklo"
    )
    junk = parse_launcher_log(path)
    assert junk.events == () and junk.line_count == 3


# ---------------------------------------------------------------------------------------------
# cycle infos, marker, tracker, manifest


def test_real_cycle_infos() -> None:
    infos = read_cycle_infos(KILL_RUN / "cycle_infos", KILL_RUN)
    assert [r.cycle for r in infos.records] == [0, 1]
    r1 = infos.records[1]
    assert r1.log_name == "train_cycle1.log" and r1.start == utc("2026-11-29 11:04:00.602873")
    assert r1.ref.location == "cycle_infos/cycle_info..0.1:3"


def test_cycle_infos_refuse_junk_and_skip_symlinks(tmp_path: Path) -> None:
    d = tmp_path / "cycle_infos"
    assert not read_cycle_infos(d, tmp_path).exists
    d.mkdir()
    (d / "cycle_info..0.0").write_text('{"cycle_start_time": "2026-11-29T11:00:00Z"}')
    (d / "cycle_info..0.1").write_bytes(b"{\xff truncated")
    (d / "cycle_info..0.2").write_text("[1, 2]")
    (d / "cycle_info..0.3").write_text('{\n  "cycle_end_time": "2026-13-29T11:00:00Z"\n}')
    (d / "cycle_info..current").symlink_to("cycle_info..0.1")
    (d / "unrelated.txt").write_text("x")
    infos = read_cycle_infos(d, tmp_path)
    assert [r.cycle for r in infos.records] == [0, 3]  # numbers from file names
    assert infos.records[1].start is None and infos.records[1].end is None
    bad = infos.records[1].bad_time
    assert bad is not None and bad.location == "cycle_infos/cycle_info..0.3:2"
    assert [(p.severity, p.message.split(":")[0]) for p in infos.problems] == [
        ("fatal", "cycle record cycle_infos/cycle_info..0.1 unreadable"),
        ("fatal", "cycle record cycle_infos/cycle_info..0.2 unreadable"),
    ]


def test_real_marker() -> None:
    m = read_marker(KILL_RUN / MARKER, KILL_RUN)
    assert m is not None and m.ok
    assert (m.fault, m.rank, m.pid, m.tracker_iteration) == ("kill", 0, 585, 5)
    assert m.time == utc("2026-11-29 11:03:55.960")
    assert m.ref("tracker_iteration").location == f"{MARKER}:7"


@pytest.mark.parametrize(
    ("content", "error"),
    [
        (b"", "empty file"),
        (b"SIGKILL sent", "not JSON"),
        (b'{"fault": "kill"', "not JSON"),
        (b'["kill"]', "not a JSON object"),
        (
            b'{"fault": "kill", "rank": "zero", "time": "yesterday"}',
            "no valid 'time', no integer 'rank'",
        ),
    ],
)
def test_marker_problems_are_reported_not_raised(
    tmp_path: Path, content: bytes, error: str
) -> None:
    path = tmp_path / MARKER
    path.write_bytes(content)
    m = read_marker(path, tmp_path)
    assert m is not None and not m.ok and m.error is not None and error in m.error


def test_marker_absent(tmp_path: Path) -> None:
    assert read_marker(tmp_path / MARKER, tmp_path) is None


@pytest.mark.parametrize(
    ("content", "iteration", "error"),
    [
        (b"100\n", 100, None),
        (b"release", None, None),
        (b"", None, "empty"),
        (b"1x", None, "not an iteration"),
        ("\u00b2".encode(), None, "not an iteration"),  # str.isdigit() is True, int() fails
        ("\u0663".encode(), None, "not an iteration"),  # Arabic-Indic 3: not Megatron's text
    ],
)
def test_tracker(tmp_path: Path, content: bytes, iteration: int | None, error: str | None) -> None:
    path = tmp_path / "latest_checkpointed_iteration.txt"
    path.write_bytes(content)
    t = read_tracker(path, tmp_path)
    assert t.iteration == iteration
    assert (t.error is None) if error is None else (error in (t.error or ""))
    assert not read_tracker(tmp_path / "none.txt", tmp_path).exists


def test_manifest_in_recipe_shape_with_result(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text(
        '{\n  "schema": 1,\n  "config": {\n    "workload": "megatron",\n    "train_iters": 100,\n'
        '    "fault": "hang",\n    "gpus_per_node": 2\n  },\n'
        '  "start_time": "2026-11-29T11:03:10.000+00:00",\n'
        '  "stack": {"torch": "2.11.0"}\n}\n'
    )
    (tmp_path / "result.json").write_text('{"exit_code": 0, "end_time": "2026-11-29T11:04:54Z"}')
    m = read_manifest(tmp_path / "run.json", tmp_path)
    assert m is not None
    assert m.fault is not None and m.fault.value == "hang" and m.fault.ref.location == "run.json:6"
    assert m.train_iters is not None and m.train_iters.value == 100
    assert m.exit_code is not None and m.exit_code.value == 0
    assert m.stack == {"torch": "2.11.0"} and m.start.time == utc("2026-11-29 11:03:10")


def test_manifest_garbled_raises_manifest_error(tmp_path: Path) -> None:
    assert read_manifest(tmp_path / "run.json", tmp_path) is None
    (tmp_path / "run.json").write_text("{oops")
    with pytest.raises(ManifestError, match=r"run\.json is unreadable: not JSON"):
        read_manifest(tmp_path / "run.json", tmp_path)


# ---------------------------------------------------------------------------------------------
# the whole run directory


def test_load_run_real_directories() -> None:
    run = load_run(KILL_RUN)
    assert run.workload == "megatron" and run.problems == ()
    assert [c.cycle for c in run.cycle_logs] == [0, 1]
    assert run.tracker.iteration == 100
    assert run.checkpoints[0].iteration == 5 and run.checkpoints[0].state == "absent"
    assert run.stack()["megatron_core"] == "0.19.1"
    base = load_run(BASELINE_RUN)
    assert base.marker is None and len(base.cycles) == 1


def test_load_run_without_cycle_infos_or_launcher_log(tmp_path: Path) -> None:
    d = copy_run(KILL_RUN, tmp_path / "r")
    d.remove("cycle_infos")
    d.remove(LAUNCHER)
    run = load_run(d.root)
    assert [c.cycle for c in run.cycle_logs] == [0, 1]  # found from logs/ alone
    messages = " | ".join(p.message for p in run.problems)
    assert "cycle_infos/ is missing" in messages and "logs/launcher.log is missing" in messages
    assert not run.fatal_problems


def test_load_run_cycle_in_records_without_log(tmp_path: Path) -> None:
    d = copy_run(KILL_RUN, tmp_path / "r")
    d.remove(CYCLE1)
    run = load_run(d.root)
    log = run.cycle_log(1)
    assert log is not None and not log.exists
    assert any("train_cycle1.log is missing" in p.message for p in run.problems)


def test_load_run_not_a_run_dir(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match="does not exist"):
        load_run(tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunDirError, match="not a directory"):
        load_run(tmp_path / "file")
    run = load_run(tmp_path)
    assert run.fatal_problems and "is not a run directory" in run.fatal_problems[0].message


def test_load_run_unknown_workload_is_fatal(tmp_path: Path) -> None:
    d = copy_run(KILL_RUN, tmp_path / "r")
    d.set_json("run.json", schema=1, config={"workload": "nope"})
    run = load_run(d.root)
    assert any("no log adapter for workload 'nope'" in p.message for p in run.fatal_problems)


def test_cycle_log_keeps_first_and_last_saves_only(tmp_path: Path) -> None:
    log = tmp_path / "saves.log"
    n = SAVES_KEPT * 3
    with log.open("w") as f:
        for i in range(1, n + 1):
            f.write(
                f"0:   [2026-11-29 11:00:00] scheduled an async checkpoint save at iteration {i}\n"
            )
            f.write(
                f"0:   [2026-11-29 11:00:00.0] successfully saved checkpoint from iteration {i}\n"
            )
    c = parse_cycle_log(log, 0, MEGATRON)
    done = [e.iteration for e in c.of_type(SaveCompleted)]
    assert done == [*range(1, SAVES_KEPT + 1), *range(n - SAVES_KEPT + 1, n + 1)]
    assert c.saves_not_kept == 2 * (n - 2 * SAVES_KEPT)
    lines = [e.ref.line or 0 for e in c.events]
    assert lines == sorted(lines)


@pytest.mark.parametrize("rel", [CYCLE0, CYCLE1])
def test_iteration_fast_path_agrees_with_parse_line(rel: str) -> None:
    from pytest_nvrx.evidence.refs import iter_lines, split_rank_prefix

    cursor = LineCursor(rel)
    for lineno, text in iter_lines(KILL_RUN / rel):
        _, body = split_rank_prefix(text)
        cursor.lineno, cursor.raw = lineno, text
        event = MEGATRON.parse_line(body, cursor)
        number = MEGATRON.iteration_of(body)
        assert (number is not None) == isinstance(event, IterationCommitted), text
        if isinstance(event, IterationCommitted):
            assert event.iteration == number


@pytest.mark.parametrize(
    "line",
    [
        "[pytest-nvrx injector] rank 0 pid 585: watching /c/latest_checkpointed_iteration.txt"
        " (baseline 0) to inject kill (SIGKILL) once it advances",
        "[pytest-nvrx injector] rank 0 pid 585: tracker /c/latest_checkpointed_iteration.txt"
        " advanced 0 -> 5; marker /r/fault_injected.json written; sending SIGKILL to pid 585",
        "[pytest-nvrx injector] rank 1 pid 9: ERROR: checkpoint tracker /c/t.txt is empty; at"
        " start it must be absent or hold an integer iteration",
    ],
)
def test_our_injector_lines_are_not_evidence(line: str) -> None:
    # verdicts must not depend on our wrapper's lines (the real GPU runs have none)
    assert parse(line) is None
    assert MEGATRON.iteration_of(line) is None
