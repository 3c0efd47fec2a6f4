"""The pytest plugin, driven through pytester: options, markers, skips, reports, JUnit.

No run is launched here (the end-to-end scenarios are the shipped suite itself); existing real
runs from tests/data are judged through ``--nvrx-run-dir``.
"""

from __future__ import annotations

import os
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_nvrx.criteria import CRITERIA_IDS
from pytest_nvrx.launch.gpu_slots import gpu_available
from pytest_nvrx.layout import FAULT_WINDOWS, INJECTED_FAULTS
from pytest_nvrx.session.scenarios import schedule_scenarios
from tests.helpers.doctor import CYCLE1, copy_run
from tests.helpers.sessions import DEFAULT_IDS, SUITE_ARGS

pytest_plugins = ["pytester"]

DATA = Path(__file__).parents[1] / "data"
GPU_KILL = DATA / "gpu" / "gpu-kill-100"
GPU_BASELINE = DATA / "gpu" / "gpu-baseline-20"
#: The default matrix of one workload (issue #10): every fault once, every window at least once.
DEFAULT_MATRIX = tuple(DEFAULT_IDS)
#: The default schedule matrix of one workload (issue #26), after the fault scenarios.
SCHEDULES = tuple(sc.id.split("-", 1)[1] for sc in schedule_scenarios("reference"))
#: the default schedules with a kill (each starts kill@step), and the one of hang and ckpt-worker
KILL_SCHEDULES = (
    "schedule-kill-step_kill-restore",
    "schedule-kill-step_kill-restore_kill-restore-restarts1",
)
HANG_CKPT = "schedule-hang-finalize_ckpt-worker-finalize"
assert set(SCHEDULES) == {*KILL_SCHEDULES, HANG_CKPT}
TESTS_PER_SCENARIO = 1 + len(CRITERIA_IDS)


def collected_scenarios(result: pytest.RunResult) -> list[str]:
    """Scenario ids of the collected criterion tests, in collection order, once each."""
    ids = [
        line.split("[", 1)[1].rsplit("-", 1)[0]
        for line in result.stdout.lines
        if "test_recovery_criterion[" in line
    ]
    return list(dict.fromkeys(ids))


def given_by_env_and_ini(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], ini: str
) -> None:
    """Set these environment variables and this ini line (if any) for the pytester run."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    if ini:
        pytester.makeini(f"[pytest]\n{ini}\n")


def test_help_lists_the_nvrx_group(pytester: pytest.Pytester, clean_env: None) -> None:
    result = pytester.runpytest("--help")
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [
            "*fault-recovery qualification (pytest-nvrx)*",
            "*--nvrx-megatron-path*",
            "*--nvrx-run-dir*",
            "*--nvrx-keep*",
        ]
    )
    for name in (
        "work-dir",
        "gpus-per-node",
        "nnodes",
        "tp",
        "pp",
        "train-iters",
        "save-interval",
        "fault-rank",
        "section-timeouts",
        "out-of-section-timeout",
        "workload",
        "matrix",
        "window",
    ):
        assert f"--nvrx-{name}" in result.stdout.str()
    assert "nvrx_megatron_path" in result.stdout.str()  # ini mirror
    flowing = " ".join(result.stdout.str().split())  # argparse wraps the help text
    assert "[env NVRX_FAULT_MATRIX]" in flowing and "[env NVRX_FAULT_WINDOW]" in flowing


def test_help_shows_every_plugin_setting(pytester: pytest.Pytester, clean_env: None) -> None:
    """--help carries each plugin row of the settings table with its generated help, the
    scenarios' default included (the same text as docs/options.md's default column,
    tests/settings/test_settings_table.py), and its ini mirror."""
    from pytest_nvrx.settings import PLUGIN_SETTINGS

    result = pytester.runpytest("--help")
    help_text = " ".join(result.stdout.str().split())
    for setting in PLUGIN_SETTINGS:
        assert setting.plugin_option in help_text, setting.name
        assert setting.ini in help_text, setting.name
        assert " ".join(setting.plugin_help().split()) in help_text, setting.name
        if setting.show_default:
            assert f"(default: {setting.default_text()})" in help_text, setting.name
    assert "(default: megatron 1, reference 2) [env GPUS_PER_NODE]" in help_text
    assert "(default: megatron 1800, reference 600)" in help_text


def test_markers_are_registered(pytester: pytest.Pytester, clean_env: None) -> None:
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(
        [
            "@pytest.mark.gpu:*--nvrx-megatron-path*",
            "@pytest.mark.baseline:*",
            *(f"@pytest.mark.{fault}: scenario with fault {fault}:*" for fault in INJECTED_FAULTS),
            *(f"@pytest.mark.{window}: scenario window:*" for window in FAULT_WINDOWS),
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "@pytest.mark.ckpt-worker: *checkpoint worker*; windows finalize;*",
            "@pytest.mark.schedule: *markers of all its faults and windows*",
        ]
    )
    result.stdout.fnmatch_lines(["@pytest.mark.kill: *; every fault-schedule scenario with*"])


def test_collect_only_needs_no_gpu(pytester: pytest.Pytester, clean_env: None) -> None:
    result = pytester.runpytest(*SUITE_ARGS, "--collect-only", "-q")
    assert result.ret == 0
    out = result.stdout.str()
    scenarios = [
        f"{w}-{s}" for w in ("reference", "megatron") for s in (*DEFAULT_MATRIX, *SCHEDULES)
    ]
    assert collected_scenarios(result) == scenarios
    for scenario in scenarios:
        # one test per criterion and scenario: six criteria each, with their ids
        for criterion in CRITERIA_IDS:
            assert f"test_recovery_criterion[{scenario}-{criterion}]" in out
    assert len(CRITERIA_IDS) == 6 and "training_continuity" in CRITERIA_IDS
    assert f"{20 * TESTS_PER_SCENARIO} tests collected" in out


@pytest.mark.parametrize(
    ("expr", "scenarios"),
    [
        # a schedule carries every fault and window it holds (-m kill selects the kill schedules)
        ("gpu and kill", {"megatron-kill-save", *(f"megatron-{s}" for s in KILL_SCHEDULES)}),
        (
            "hang",
            {f"{w}-{s}" for w in ("reference", "megatron") for s in ("hang-finalize", HANG_CKPT)},
        ),
        (
            "kill or hang",
            {
                f"{w}-{s}"
                for w in ("reference", "megatron")
                for s in ("kill-save", "hang-finalize", HANG_CKPT, *KILL_SCHEDULES)
            },
        ),
        ("not gpu", {f"reference-{s}" for s in (*DEFAULT_MATRIX, *SCHEDULES)}),
        ("schedule and not restore", {f"{w}-{HANG_CKPT}" for w in ("reference", "megatron")}),
        ("restore and not gpu", {f"reference-{s}" for s in KILL_SCHEDULES}),
        ("gpu and baseline", {"megatron-baseline"}),
        (
            "gpu and finalize",
            {
                "megatron-hang-finalize",
                "megatron-term-finalize",
                "megatron-ckpt-worker-finalize",
                f"megatron-{HANG_CKPT}",
            },
        ),
        ("kill and not step", {"reference-kill-save", "megatron-kill-save"}),
        # a marker with a hyphen is one name in -m's grammar
        (
            "ckpt-worker and not gpu",
            {"reference-ckpt-worker-finalize", f"reference-{HANG_CKPT}"},
        ),
        (
            "not ckpt-worker and step",
            {f"{w}-{f}-step" for w in ("reference", "megatron") for f in ("segv", "exception")}
            | {f"{w}-{s}" for w in ("reference", "megatron") for s in KILL_SCHEDULES},
        ),
    ],
)
def test_marker_expressions_select_matrices(
    pytester: pytest.Pytester, clean_env: None, expr: str, scenarios: set[str]
) -> None:
    result = pytester.runpytest(*SUITE_ARGS, "--collect-only", "-q", "--strict-markers", "-m", expr)
    assert result.ret == pytest.ExitCode.OK
    assert set(collected_scenarios(result)) == scenarios


@pytest.mark.parametrize(
    ("args", "env", "ini", "scenarios"),
    [
        # the baseline, the matrix's fault scenarios, the three default schedules
        pytest.param(["--nvrx-matrix", "full"], {}, "", 17 + 3, id="option-full"),
        pytest.param([], {"NVRX_FAULT_MATRIX": "full"}, "", 17 + 3, id="env-full"),
        pytest.param([], {}, "nvrx_matrix = full", 17 + 3, id="ini-full"),
        pytest.param(
            ["--nvrx-matrix", "default"], {}, "nvrx_matrix = full", 7 + 3, id="option-wins"
        ),
        pytest.param(["--nvrx-schedules", "none"], {}, "", 7, id="no-schedules"),
        pytest.param([], {"NVRX_SCHEDULES": "kill@save,hang@restore"}, "", 7 + 1, id="schedule"),
        # chosen windows leave the default schedules out
        pytest.param(["--nvrx-window", "save"], {}, "", 1 + 5, id="window-save"),
        pytest.param([], {"NVRX_FAULT_WINDOW": "step,finalize"}, "", 1 + 11, id="env-windows"),
        pytest.param(["--nvrx-window", "finalize"], {}, "nvrx_window = save", 1 + 6, id="win-opt"),
    ],
)
def test_matrix_and_window_choose_the_scenarios(
    pytester: pytest.Pytester,
    clean_env: None,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    env: dict[str, str],
    ini: str,
    scenarios: int,
) -> None:
    given_by_env_and_ini(pytester, monkeypatch, env, ini)
    result = pytester.runpytest(
        *SUITE_ARGS, "--collect-only", "-q", "--nvrx-workload", "reference", *args
    )
    assert result.ret == pytest.ExitCode.OK
    ids = collected_scenarios(result)
    assert len(ids) == scenarios and len(set(ids)) == scenarios
    assert ids[0] == "reference-baseline"  # the continuity reference runs first
    assert all(i.startswith("reference-") for i in ids)
    windows = (args[1:] if "--nvrx-window" in args else []) or [env.get("NVRX_FAULT_WINDOW", "")]
    chosen = [w for w in windows[0].split(",") if w]
    if chosen:  # every fault scenario lies in the chosen windows
        assert all(i.rsplit("-", 1)[1] in chosen for i in ids[1:])


def test_gpu_scenarios_skip_with_reason(pytester: pytest.Pytester, clean_env: None) -> None:
    """No Megatron checkout given: GPU scenarios skip, but a session that qualified nothing is
    not green (exit 5, said in one line)."""
    result = pytester.runpytest(*SUITE_ARGS, "-m", "gpu and kill and not schedule", "-rs")
    result.assert_outcomes(skipped=TESTS_PER_SCENARIO)
    result.stdout.fnmatch_lines(["*gpu scenario: give --nvrx-megatron-path*"])
    result.stdout.fnmatch_lines(
        [
            "pytest-nvrx: every selected scenario was skipped (megatron-kill-save): nothing was "
            "qualified*"
        ]
    )
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED


SUITE_HINT = "pytest-nvrx: --nvrx-megatron-path given, but no pytest-nvrx scenario was collected:"


def test_nvrx_options_that_collect_nothing_say_to_add_pyargs(
    pytester: pytest.Pytester, clean_env: None, megatron_stub: Path
) -> None:
    """``pytest -m gpu --nvrx-megatron-path X`` without ``--pyargs pytest_nvrx.suite``: exit 5
    as before, and one line says how to collect the scenarios (it said nothing)."""
    megatron = ["--nvrx-megatron-path", str(megatron_stub)]
    empty = pytester.runpytest("-p", "no:cacheprovider", "-m", "gpu", *megatron)
    assert empty.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    empty.stdout.fnmatch_lines([f"{SUITE_HINT} add --pyargs pytest_nvrx.suite to collect them*"])
    assert empty.stdout.str().count("pytest-nvrx:") == 1
    # a project's own tests, all deselected by -m gpu: nothing ran either
    pytester.makepyfile(test_trivial="def test_one():\n    assert 1 + 1 == 2\n")
    deselected = pytester.runpytest("-p", "no:cacheprovider", "-m", "gpu", *megatron)
    assert deselected.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    deselected.stdout.fnmatch_lines([f"{SUITE_HINT}*"])
    # no --nvrx-* option, a test that ran, or our scenarios collected and deselected: no hint
    plain = pytester.runpytest("-p", "no:cacheprovider", "-m", "gpu")
    ran = pytester.runpytest("-p", "no:cacheprovider", *megatron)
    ours = pytester.runpytest(*SUITE_ARGS, "-m", "gpu and not gpu", *megatron)
    assert plain.ret == ours.ret == pytest.ExitCode.NO_TESTS_COLLECTED and ran.ret == 0
    for result in (plain, ran, ours):
        assert "--pyargs" not in result.stdout.str(), result.stdout.str()


@pytest.mark.skipif(gpu_available() is None, reason="this host has a GPU")
def test_gpu_selected_with_megatron_on_a_gpu_less_host_is_an_error(
    pytester: pytest.Pytester,
    clean_env: None,
    megatron_stub: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The user named a checkout and selected GPU scenarios: no GPU is an error, not a skip
    (a CI runner that cannot see its GPUs must go red), with what was probed."""
    result = pytester.runpytest(
        *SUITE_ARGS,
        "-m",
        "gpu and kill and not schedule",
        "--nvrx-megatron-path",
        str(megatron_stub),
    )
    result.assert_outcomes(errors=1 + len(CRITERIA_IDS))
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*pytest-nvrx: scenario megatron-kill-save: a Megatron checkout was given*but this host"
            " cannot run GPU scenarios: *(probed with nvidia-smi -L)*"
        ]
    )
    # the same through the environment variable
    monkeypatch.setenv("MEGATRON_PATH", str(megatron_stub))
    result = pytester.runpytest(*SUITE_ARGS, "-m", "gpu and kill and not schedule")
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_a_scenario_breaking_a_rule_is_a_usage_error_in_the_plugins_spelling(
    pytester: pytest.Pytester, clean_env: None
) -> None:
    """A scenario whose settings break a rule between values (a schedule that does not fit the
    iterations) is the usage error every bad option gets (exit 4, issue #36), one line naming
    the scenario, its fix-it hint spelled for pytest (--nvrx-*, ini nvrx_*), no traceback and
    no run directory: nothing launched."""
    work = pytester.path / "work"
    work.mkdir()
    result = pytester.runpytest(
        *SUITE_ARGS,
        "-k",
        "test_run_finished and reference-schedule-kill-step_kill-restore and not restarts",
        "--nvrx-train-iters",
        "8",
        "--nvrx-work-dir",
        str(work),
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    line = "ERROR: pytest-nvrx: scenario reference-schedule-kill-step_kill-restore: window step on"
    own_lines = [row for row in err.splitlines() if row.startswith(line)]
    assert len(own_lines) == 1, err
    assert own_lines[0].endswith("ini nvrx_window)"), own_lines
    assert "--nvrx-train-iters (TRAIN_ITERS, ini nvrx_train_iters)" in err
    out = result.stdout.str() + err
    assert "Traceback" not in out and "ConfigError" not in out and "launching" not in out
    assert not any(work.rglob("run.json")), sorted(work.rglob("*"))


#: The issue's run: a hang while the replacement loads, which only the 900 s setup deadline
#: detects, under a 500 s run timeout.
HANG_RESTORE = [
    "--nvrx-schedules", "kill@step,hang@restore",
    "--nvrx-section-timeouts", "setup:900,step:30,checkpointing:30",
    "--nvrx-run-timeout", "500",
]  # fmt: skip


def test_a_run_timeout_its_faults_cannot_fit_is_a_usage_error_before_anything_launches(
    pytester: pytest.Pytester, clean_env: None, megatron_stub: Path
) -> None:
    """The issue's Megatron schedule on one GPU: refused as a usage error before any scenario
    launches (also on this GPU-less host: the refusal comes first), one line with the arithmetic
    and the plugin's options; nothing written."""
    work = pytester.path / "work"
    result = pytester.runpytest(
        *SUITE_ARGS,
        *("--nvrx-workload", "megatron", "--nvrx-megatron-path", str(megatron_stub)),
        *HANG_RESTORE,
        *("--nvrx-work-dir", str(work)),
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    ours = [line for line in result.stderr.lines if "pytest-nvrx" in line]
    assert ours == [
        "ERROR: pytest-nvrx: scenario megatron-schedule-kill-step_hang-restore: hang@restore"
        " (fault 2 of 2) is detected only by the setup section's timeout (900 s); the run"
        " timeout 500 s cannot fit it: raise --nvrx-run-timeout (ini nvrx_run_timeout) above"
        " ~922 s or lower setup in --nvrx-section-timeouts (ini nvrx_section_timeouts) (a"
        " lower-bound estimate: 2 start-ups of ~10 s, 2 restarts of ~1 s, hang@restore's"
        " detection 900 s)"
    ], result.stderr.str()
    assert "Traceback" not in result.stderr.str() + result.stdout.str()
    assert not work.exists()


def test_a_run_timeout_refused_on_xdist_workers_fails_every_scenario_unlaunched(
    pytester: pytest.Pytester, clean_env: None
) -> None:
    """Under xdist a worker's usage error would be a crash: each scenario fails with the line
    instead, before its launch; nothing written."""
    work = pytester.path / "work"
    result = pytester.runpytest_subprocess(
        *SUITE_ARGS, "-n", "2", "--nvrx-workload", "reference", *HANG_RESTORE,
        "--nvrx-work-dir", str(work),
    )  # fmt: skip
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out[-3000:]
    assert "INTERNALERROR" not in out + result.stderr.str()
    result.assert_outcomes(errors=(len(DEFAULT_MATRIX) + 1) * TESTS_PER_SCENARIO)
    assert "pytest-nvrx: scenario reference-schedule-kill-step_hang-restore: hang@restore" in out
    assert not work.exists()


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--nvrx-matrix", "full"],
        ["--nvrx-schedules", "kill@step,hang@restore", "--nvrx-run-timeout", "500",
         "--nvrx-section-timeouts", "setup:150,step:30,checkpointing:30"],
    ],
    ids=["defaults", "full-matrix", "hang-restore-setup-150"],
)  # fmt: skip
def test_the_default_scenarios_fit_their_run_timeouts(
    pytester: pytest.Pytester, clean_env: None, megatron_stub: Path, args: list[str]
) -> None:
    """Every scenario of both workloads' matrices and default schedules, with their own
    timeouts, is accepted; so is the issue's schedule with setup:150 (it qualified on the GPU)."""
    result = pytester.runpytest(
        *SUITE_ARGS, "--co", "-q", "--nvrx-megatron-path", str(megatron_stub), *args
    )
    assert result.ret == pytest.ExitCode.OK, result.stderr.str()
    assert "cannot fit" not in result.stdout.str() + result.stderr.str()


#: Values no selected scenario can run with, from an option, the walkthrough's environment or
#: an ini value: each was an error of every scenario once the session ran (exit 1)
RULE_BREAKERS = [
    (["--nvrx-tp", "3"], {}, "", "must be divisible by TP x PP = 3"),
    (["--nvrx-pp", "3"], {}, "", "must be divisible by TP x PP = 3"),
    (["--nvrx-tp", "3", "--nvrx-gpus-per-node", "6"], {}, "", "must divide the model's 8"),
    (["--nvrx-pp", "3", "--nvrx-gpus-per-node", "6"], {}, "", "must divide the model's 4"),
    (["--nvrx-save-interval", "30"], {}, "", "save interval 30 >= train iterations 20"),
    (["--nvrx-train-iters", "3"], {}, "", "save interval 5 >= train iterations 3"),
    (["--nvrx-fault-rank", "2"], {}, "", "fault rank 2 is not a rank of a world of size 2"),
    (["--nvrx-gpus-per-node", "1"], {}, "", "the CPU reference workload needs at least 2 ranks"),
    ([], {"GPUS_PER_NODE": "1"}, "", "the CPU reference workload needs at least 2 ranks"),
    ([], {"NVRX_FAULT_RANK": "7"}, "", "fault rank 7 is not a rank of a world of size 2"),
    ([], {}, "nvrx_save_interval = 20", "save interval 20 >= train iterations 20"),
    (["--nvrx-nnodes", "2"], {"NVRX_RUN_ID": "j"}, "", "needs a rendezvous endpoint"),
    (["--nvrx-rdzv-endpoint", "nohostport"], {}, "", "'nohostport' is not host:port"),
]


@pytest.mark.parametrize(("args", "env", "ini", "message"), RULE_BREAKERS)
@pytest.mark.parametrize("collect_only", [True, False], ids=["collect-only", "session"])
def test_a_value_the_selected_scenarios_break_is_a_usage_error(
    pytester: pytest.Pytester,
    clean_env: None,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    env: dict[str, str],
    ini: str,
    message: str,
    collect_only: bool,
) -> None:
    """Checked once -k/-m chose the scenarios, before any launches (issue #36)."""
    given_by_env_and_ini(pytester, monkeypatch, env, ini)
    work = pytester.path / "work"
    work.mkdir()
    more = ["--co"] if collect_only else []
    result = pytester.runpytest(
        *SUITE_ARGS, "-k", "reference-kill", "--nvrx-work-dir", str(work), *more, *args
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stderr.fnmatch_lines([f"ERROR: pytest-nvrx: scenario reference-kill-*{message}*"])
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    assert not any(work.rglob("run.json"))


def test_a_value_only_unselected_scenarios_break_is_no_error(
    pytester: pytest.Pytester, clean_env: None
) -> None:
    """One GPU per node breaks no Megatron scenario: selecting those alone, it is no error."""
    result = pytester.runpytest(*SUITE_ARGS, "--co", "-q", "-m", "gpu", "--nvrx-gpus-per-node", "1")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()


def test_under_xdist_the_controller_gives_the_usage_error(
    pytester: pytest.Pytester, clean_env: None
) -> None:
    """A worker's usage error would crash it (an INTERNALERROR): the controller checks the
    ids the workers collected, before any is scheduled."""
    pytest.importorskip("xdist")
    work = pytester.path / "work"
    work.mkdir()
    result = pytester.runpytest_subprocess(
        *SUITE_ARGS, "-n", "2", "-k", "reference-kill", "--nvrx-tp", "3",
        "--nvrx-work-dir", str(work),
    )  # fmt: skip
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stderr.fnmatch_lines(["ERROR: pytest-nvrx: scenario reference-kill-*TP x PP = 3*"])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    assert not any(work.rglob("run.json"))


def test_workload_option_limits_scenarios(pytester: pytest.Pytester, clean_env: None) -> None:
    result = pytester.runpytest(*SUITE_ARGS, "--collect-only", "-q", "--nvrx-workload", "megatron")
    assert "reference-" not in result.stdout.str()
    assert f"{10 * TESTS_PER_SCENARIO} tests collected" in result.stdout.str()


@pytest.mark.parametrize(
    ("args", "env", "ini", "message"),
    [
        (["--nvrx-tp", "0"], {}, "", "--nvrx-tp must be a positive integer"),
        (["--nvrx-workload", "bert"], {}, "", "must be one of megatron, reference"),
        (["--nvrx-work-dir", "rel/work"], {}, "", "must be an absolute path, got rel/work"),
        ([], {}, "nvrx_work_dir = rel/work", "must be an absolute path, got rel/work"),
        (["--nvrx-work-dir", "/tmp/a\x1bb"], {}, "", "'/tmp/a\\x1bb' holds the control char"),
        (["--nvrx-report", "r\x1b.html"], {}, "", "holds the control character"),
        (["--nvrx-section-timeouts", "step:5"], {}, "", "missing setup, checkpointing"),
        (["--nvrx-megatron-path", "/nonexistent"], {}, "", "pretrain_gpt.py not found"),
        (["--nvrx-run-dir", "/nonexistent"], {}, "", "is not a directory"),
        (["--nvrx-continuity-rtol", "nan"], {}, "", "'nan' is not a number"),
        (["--nvrx-continuity-rtol", "-0.1"], {}, "", "need 0 <= rtol < 1"),
        (["--nvrx-continuity-rtol", "\u0660.1"], {}, "", "is not a number"),
        (["--nvrx-max-downtime", "\u0663"], {}, "", "must be a positive number of seconds"),
        (
            [],
            {},
            "nvrx_continuity_rtol = tight",
            "ini value nvrx_continuity_rtol must be a number: could not convert",
        ),
        (
            [],
            {},
            "nvrx_train_iters = many",
            "ini value nvrx_train_iters must be an integer: invalid literal",
        ),
        (["--nvrx-matrix", "all"], {}, "", "--nvrx-matrix must be one of default, full"),
        ([], {}, "nvrx_matrix = huge", "ini value nvrx_matrix must be one of default, full"),
        (["--nvrx-window", "during"], {}, "", "--nvrx-window must be one or more of step, save"),
        (["--nvrx-window", "save,"], {}, "", "--nvrx-window must be one or more of step, save"),
        ([], {}, "nvrx_window = later", "ini value nvrx_window must be one or more of"),
        (
            ["--nvrx-gpu-lock-dir", "rel/locks"],
            {},
            "",
            "--nvrx-gpu-lock-dir: must be an absolute path, got rel/locks",
        ),
        (
            ["--nvrx-gpu-lock-dir", "/nonexistent-nvrx/locks"],
            {},
            "",
            "--nvrx-gpu-lock-dir: /nonexistent-nvrx/locks is not a directory; give one that",
        ),
        ([], {}, "nvrx_gpu_lock_dir = locks", "ini value nvrx_gpu_lock_dir: must be an absolute"),
    ],
)
def test_bad_values_are_usage_errors(
    pytester: pytest.Pytester,
    clean_env: None,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    env: dict[str, str],
    ini: str,
    message: str,
) -> None:
    given_by_env_and_ini(pytester, monkeypatch, env, ini)
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*pytest-nvrx:*{message}*"])


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TP": "x"}, "environment variable TP must be a positive integer"),
        ({"NVRX_FAULT_MATRIX": "big"}, "environment variable NVRX_FAULT_MATRIX must be"),
        ({"NVRX_FAULT_WINDOW": "Step"}, "environment variable NVRX_FAULT_WINDOW must be"),
        ({"NVRX_WORK_DIR": "/tmp/a\nb"}, "NVRX_WORK_DIR '/tmp/a\\nb' holds the control char"),
        ({"NVRX_WORK_DIR": "rel/work"}, "NVRX_WORK_DIR: must be an absolute path, got rel/work"),
        ({"NVRX_GPU_LOCK_DIR": "/etc/hostname"}, "NVRX_GPU_LOCK_DIR: /etc/hostname is not a dir"),
    ],
)
def test_bad_environment_is_an_error_once_scenarios_are_collected(
    pytester: pytest.Pytester,
    clean_env: None,
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    message: str,
) -> None:
    """The walkthrough's variables are read when our scenarios are collected: a bad one stops
    the session there (a collection error that says how to fix it, nothing launched)."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    result = pytester.runpytest(*SUITE_ARGS)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines([f"*pytest-nvrx:*{message}*"])
    assert "Traceback" not in result.stdout.str()
    assert "launching" not in result.stdout.str()


UNRELATED_ENV = {"TP": "x", "SAVE_INTERVAL": "0", "TRAIN_ITERS": "1e5", "PP": "-1"}
PROBE_TRACE = """
import os, sys
if any("__nvrx_stack_probe__" in a or a.endswith("stack.py") for a in sys.argv):
    with open(os.environ["PROBE_TRACE_FILE"], "a") as fh:
        fh.write("probe\\n")
"""


def test_an_unrelated_project_runs_as_without_the_plugin(
    pytester: pytest.Pytester,
    clean_env: None,
    monkeypatch: pytest.MonkeyPatch,
    megatron_stub: Path,
    tmp_path: Path,
) -> None:
    """Installed in an environment shared with other projects, the plugin stays out of their
    way: the walkthrough's common variable names (bad values included) and a valid
    MEGATRON_PATH change nothing, nothing probes the stack, and the output is the output of
    ``-p no:nvrx``."""
    pytester.makepyfile(test_trivial="def test_one():\n    assert 1 + 1 == 2\n")
    for key, value in UNRELATED_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MEGATRON_PATH", str(megatron_stub))
    # every Python started from here records whether it is the stack probe
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(PROBE_TRACE)
    trace = tmp_path / "probes"
    monkeypatch.setenv("PROBE_TRACE_FILE", str(trace))
    monkeypatch.setenv("PYTHONPATH", f"{site}:{os.environ.get('PYTHONPATH', '')}")
    with_plugin = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    without = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:nvrx")
    assert with_plugin.ret == without.ret == pytest.ExitCode.OK

    def normalized(result: pytest.RunResult) -> list[str]:
        # the one line that differs by design: pytest's list of loaded plugins
        lines = [re.sub(r", nvrx-[^,]+", "", line) for line in result.outlines]
        return [re.sub(r"in [0-9.]+s", "in Ts", line) for line in lines]

    assert normalized(with_plugin) == normalized(without)
    assert not trace.exists(), "the stack was probed in a session without our scenarios"
    # the same variables do reach our suite when it is collected (there, TP=x is an error)
    ours = pytester.runpytest_subprocess(*SUITE_ARGS)
    assert ours.ret == pytest.ExitCode.INTERRUPTED
    ours.stdout.fnmatch_lines(["*environment variable TP must be a positive integer*"])
    # and the probe detector works: collecting our GPU scenarios does probe, once
    for key in UNRELATED_ENV:
        monkeypatch.delenv(key)
    ours = pytester.runpytest_subprocess(*SUITE_ARGS, "--collect-only", "-m", "gpu")
    assert ours.ret == pytest.ExitCode.OK, ours.stdout.str()
    assert trace.read_text().splitlines() == ["probe"]


def test_option_beats_env_beats_ini(
    pytester: pytest.Pytester, clean_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makeini("[pytest]\nnvrx_train_iters = 11\nnvrx_save_interval = 3\n")
    monkeypatch.setenv("TRAIN_ITERS", "22")
    pytester.makeconftest(
        """
        from pytest_nvrx.plugin import nvrx_settings
        def pytest_report_header(config):
            o = nvrx_settings(config).overrides
            return [f"resolved: {o.train_iters} {o.save_interval} {o.tp}"]
        """
    )
    result = pytester.runpytest("--nvrx-tp", "2", "--collect-only")
    result.stdout.fnmatch_lines(["resolved: 22 3 2"])
    result = pytester.runpytest("--nvrx-train-iters", "33", "--collect-only")
    result.stdout.fnmatch_lines(["resolved: 33 3 None"])


@pytest.mark.parametrize(
    ("table", "values"),
    [
        ("[tool.pytest]", "nvrx_train_iters = 11\nnvrx_continuity_rtol = 0.001"),
        ("[tool.pytest.ini_options]", 'nvrx_train_iters = "11"\nnvrx_continuity_rtol = "1e-3"'),
    ],
    ids=["native-table", "ini-options"],
)
def test_ini_values_are_typed(
    pytester: pytest.Pytester, clean_env: None, table: str, values: str
) -> None:
    """pytest 9's native table takes numbers as numbers (a value registered as a string
    refused ``11``); the classic table's strings read the same."""
    pytester.makepyprojecttoml(f"{table}\n{values}\nnvrx_no_distributed_optimizer = true\n")
    pytester.makeconftest(
        """
        from pytest_nvrx.plugin import nvrx_settings
        def pytest_report_header(config):
            s = nvrx_settings(config)
            o = s.overrides
            return [f"resolved: {o.train_iters} {s.continuity_rtol}"
                    f" {o.distributed_optimizer}"]
        """
    )
    result = pytester.runpytest("--collect-only")
    result.stdout.fnmatch_lines(["resolved: 11 0.001 False"])


def test_a_native_ini_value_of_the_wrong_type_is_a_usage_error(
    pytester: pytest.Pytester, clean_env: None
) -> None:
    pytester.makepyprojecttoml('[tool.pytest]\nnvrx_train_iters = "many"\n')
    result = pytester.runpytest("--collect-only")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*pytest-nvrx: ini value nvrx_train_iters must be an integer: *expects an int*"]
    )


def test_help_shows_readable_metavars(pytester: pytest.Pytester) -> None:
    out = pytester.runpytest("--help").stdout.str()
    for shown in (
        "--nvrx-gpus-per-node=N",
        "--nvrx-max-downtime=SECONDS",
        "--nvrx-section-timeouts=setup:S,step:S,checkpointing:S",
        "--nvrx-workload=megatron|reference",
    ):
        assert shown in out


def test_header_records_stack_and_paths(pytester: pytest.Pytester, clean_env: None) -> None:
    result = pytester.runpytest(*SUITE_ARGS, "--collect-only")
    result.stdout.fnmatch_lines(
        [
            "nvrx: python 3.*, torch *, nvrx 0.7.*, megatron-core *, TE *, apex *",
            "nvrx: megatron: not given, work dir: pytest tmp",
        ]
    )


def test_existing_real_run_passes_all_criteria(
    pytester: pytest.Pytester, clean_env: None, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    shutil.copytree(GPU_KILL, run)
    junit = tmp_path / "junit.xml"
    result = pytester.runpytest(*SUITE_ARGS, "--nvrx-run-dir", str(run), f"--junitxml={junit}")
    result.assert_outcomes(passed=7)
    # a session that judged a run is not "nothing qualified"
    assert result.ret == pytest.ExitCode.OK
    assert "nothing was qualified" not in result.stdout.str()
    result.stdout.fnmatch_lines(
        ["*= nvrx verdicts =*", "existing-run: *", "  PASS prior_checkpoint: *[[]*:*[]]"]
    )
    result.stdout.fnmatch_lines(["  PASS training_continuity: cycle 1 vs cycle 0: iterations *"])
    props = {p.get("name"): p.get("value") for p in ET.parse(junit).getroot().iter("property")}
    assert props["nvrx_run_dir"] == str(run)
    assert "nvrx_timing_failure_to_detected_s" in props


def test_existing_run_that_fails_reports_evidence_and_log_tail(
    pytester: pytest.Pytester, clean_env: None, tmp_path: Path
) -> None:
    """A baseline run judged as a fault run must fail, with quoted evidence and log tails."""
    run = tmp_path / "run"
    shutil.copytree(GPU_BASELINE, run)
    result = pytester.runpytest(*SUITE_ARGS, "--nvrx-run-dir", str(run))
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) >= 1
    out = result.stdout.str()
    assert "FAIL prior_checkpoint" in out
    assert "nvrx: tail of logs/train_cycle0.log" in out
    # a failed criterion shows its verdict, not pytest's assertion rewrite or the suite's source
    assert "where False" not in out and "assert verdict.passed" not in out
    assert "def test_recovery_criterion" not in out


def test_header_has_full_stack_for_a_gpu_qualification(
    pytester: pytest.Pytester, clean_env: None, megatron_stub: Path
) -> None:
    result = pytester.runpytest(
        *SUITE_ARGS, "--collect-only", "--nvrx-megatron-path", str(megatron_stub)
    )
    result.stdout.fnmatch_lines(
        [
            "nvrx stack: Python 3.* | torch * (CUDA *, cuDNN *, NCCL *) | GPU * | TE * | Apex * "
            "| Megatron * | NVRx 0.7.*"
        ]
    )


@pytest.mark.parametrize(
    "selection",
    [["-k", "prior_checkpoint"], ["-k", "test_run_finished"], ["-m", "not nothing"]],
    ids=["k-prior-checkpoint", "k-run-finished", "all"],
)
def test_a_not_qualified_scenario_fails_the_session_whatever_was_selected(
    pytester: pytest.Pytester, clean_env: None, tmp_path: Path, selection: list[str]
) -> None:
    """One replayed loss changed in a real passing run: only training_continuity fails. Selecting
    tests that pass (``-k prior_checkpoint``, as ``--lf`` or a retry of the others would) still
    fails the session, naming the scenario and its first cause."""
    run = copy_run(DATA / "gpu-continuity" / "g2-kill-30", tmp_path / "run")
    run.replace(CYCLE1, "lm loss: 6.720069E+00", "lm loss: 6.720169E+00", 1)
    result = pytester.runpytest(*SUITE_ARGS, "--nvrx-run-dir", str(run.root), *selection)
    outcomes = result.parseoutcomes()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "pytest-nvrx: scenario existing-run is NOT QUALIFIED although every selected test"
            " of it passed: training_continuity: replayed iteration 8 loss 6.720169E+00 *"
        ]
        if not outcomes.get("failed")
        else ["*FAILED*training_continuity*"]
    )
    if selection[0] == "-k":
        assert outcomes.get("passed", 0) >= 1 and not outcomes.get("failed")
