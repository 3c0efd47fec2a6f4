"""Fix-it hints in the caller's words: a message that names options is spelled, from the
settings table's row, for the entry point that shows it. A pytest user reads
``--nvrx-save-interval (SAVE_INTERVAL, ini nvrx_save_interval)``, a ``python -m pytest_nvrx run``
user ``--save-interval (SAVE_INTERVAL)`` (issue: fix-it hints built for the calling entry point).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_nvrx import cli
from pytest_nvrx.settings import (
    SETTINGS,
    ConfigError,
    EntryPoint,
    check_extra_args,
    check_rdzv_endpoint,
    option_hint,
)

pytest_plugins = ["pytester"]

SUITE_ARGS = ["--pyargs", "pytest_nvrx.suite", "-p", "no:cacheprovider"]


def test_option_hint_is_the_rows_spelling_at_each_entry_point() -> None:
    assert option_hint("save-interval", "plugin") == (
        "--nvrx-save-interval (SAVE_INTERVAL, ini nvrx_save_interval)"
    )
    assert option_hint("save-interval", "cli") == "--save-interval (SAVE_INTERVAL)"
    assert option_hint("tp", "cli", "2") == "--tp 2 (TP=2)"
    assert option_hint("tp", "plugin", "2") == "--nvrx-tp 2 (TP=2, ini nvrx_tp)"
    # a row without a variable; two rows of one name (the plugin's window selects scenarios)
    assert option_hint("window", "cli", "save") == "--window save"
    assert option_hint("window", "plugin") == "--nvrx-window (NVRX_FAULT_WINDOW, ini nvrx_window)"
    # an option only the CLI has: the plugin user is told its variable
    assert option_hint("run-id", "cli") == "--run-id (NVRX_RUN_ID)"
    assert option_hint("run-id", "plugin") == "NVRX_RUN_ID"
    with pytest.raises(KeyError):
        option_hint("no-such-setting", "cli")


@pytest.mark.parametrize("entry", ["plugin", "cli"])
def test_every_row_has_a_hint_at_each_entry_point(entry: EntryPoint) -> None:
    for setting in SETTINGS:
        assert option_hint(setting.name, entry)


def test_a_message_is_spelled_for_the_entry_point_that_shows_it() -> None:
    with pytest.raises(ConfigError) as caught:
        check_extra_args(["--persistent-save-interval=2"])
    error = caught.value
    # str(): the CLI's spelling, as before
    assert str(error) == error.message_for("cli")
    assert "set it with --save-interval (SAVE_INTERVAL) instead" in str(error)
    assert "set it with --nvrx-save-interval (SAVE_INTERVAL, ini nvrx_save_interval) instead" in (
        error.message_for("plugin")
    )
    # a message that names no option reads the same everywhere
    plain = ConfigError("work dir must be an absolute path")
    assert plain.message_for("plugin") == plain.message_for("cli") == str(plain)


def test_a_hint_quotes_no_user_text_as_a_template() -> None:
    """The message is a function of the entry point, never a template: a value with braces
    is quoted as it is."""
    with pytest.raises(ConfigError) as caught:
        check_rdzv_endpoint("{cli}:{plugin}", 2)
    assert "'{cli}:{plugin}'" in caught.value.message_for("plugin")
    assert "--nvrx-rdzv-endpoint node001:29400" in caught.value.message_for("plugin")


@dataclass(frozen=True)
class SameInput:
    """One bad input through both entry points, and the hint each must show."""

    id: str
    plugin_args: tuple[str, ...]
    cli_args: tuple[str, ...]
    plugin_hint: str
    cli_hint: str


SAME_INPUTS = [
    SameInput(
        "save-interval-not-below-train-iters",
        ("-k", "kill-save", "--nvrx-save-interval", "30", "--nvrx-train-iters", "20"),
        ("--fault", "kill", "--save-interval", "30", "--train-iters", "20"),
        "e.g. --nvrx-save-interval 10 (SAVE_INTERVAL=10, ini nvrx_save_interval), or more",
        "e.g. --save-interval 10 (SAVE_INTERVAL=10), or more",
    ),
    SameInput(
        "multinode-without-endpoint",
        ("-k", "kill-save", "--nvrx-nnodes", "2"),
        ("--fault", "kill", "--nnodes", "2"),
        "set --nvrx-rdzv-endpoint host:port (RDZV_ENDPOINT=host:port, ini nvrx_rdzv_endpoint),"
        " or launch through Slurm, which chooses one: --nvrx-launcher slurm"
        " (NVRX_LAUNCHER=slurm, ini nvrx_launcher)",
        "set --rdzv-endpoint host:port (RDZV_ENDPOINT=host:port), or launch through Slurm,"
        " which chooses one: --launcher slurm (NVRX_LAUNCHER=slurm)",
    ),
    SameInput(
        "reference-step-window-without-a-step",
        ("-k", "segv-step", "--nvrx-train-iters", "10"),
        ("--fault", "segv", "--window", "step", "--train-iters", "10"),
        "window save or finalize: --nvrx-train-iters (TRAIN_ITERS, ini nvrx_train_iters),"
        " --nvrx-save-interval (SAVE_INTERVAL, ini nvrx_save_interval), --nvrx-window"
        " (NVRX_FAULT_WINDOW, ini nvrx_window)",
        "window save or finalize: --train-iters (TRAIN_ITERS), --save-interval"
        " (SAVE_INTERVAL), --window",
    ),
]


@pytest.fixture
def walkthrough_env_unset(clean_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """No walkthrough or Slurm variable of the developer's shell decides these runs."""
    monkeypatch.setenv("NVRX_RUN_ID", "job1")  # what a multinode session needs


@pytest.mark.parametrize("case", SAME_INPUTS, ids=[c.id for c in SAME_INPUTS])
def test_the_same_bad_input_gets_each_entry_points_spelling(
    case: SameInput,
    pytester: pytest.Pytester,
    walkthrough_env_unset: None,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    # the pytest plugin: the usage error before anything is launched, in --nvrx-* words
    result = pytester.runpytest(*SUITE_ARGS, "--nvrx-workload", "reference", *case.plugin_args)
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out
    assert "launching" not in out
    assert case.plugin_hint in " ".join(out.split()), out
    assert " --save-interval" not in out and " --train-iters" not in out

    # the CLI: refused with exit status 2 (nothing launched, --dry-run besides), in its words
    capsys.readouterr()
    argv = ["run", "--dry-run", "--workload", "reference", *case.cli_args]
    status = cli.main(argv, {"NVRX_WORK_DIR": str(tmp_path), "NVRX_RUN_ID": "job1"})
    err = capsys.readouterr().err
    assert status == 2, err
    assert case.cli_hint in err, err
    assert "--nvrx-" not in err and "ini nvrx_" not in err
