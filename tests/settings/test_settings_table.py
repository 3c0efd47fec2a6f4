"""The settings table (pytest_nvrx.settings.SETTINGS) and what is generated from it: the docs'
options table, the CLI's arguments, the parsers and variables of resolve, the scenarios'
defaults, the plugin's resolution. The plugin's --help is checked in
tests/session/test_plugin.py."""

from __future__ import annotations

import argparse
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from pytest_nvrx.cli import build_parser
from pytest_nvrx.session.scenarios import RUN_TIMEOUTS
from pytest_nvrx.settings import (
    CLI_SETTINGS,
    ENV_VARS,
    OPTIONS_TABLE_HEAD,
    PARSERS,
    PLUGIN_SETTINGS,
    SELFTEST_FIELDS,
    SETTINGS,
    ConfigError,
    NvrxSettings,
    PartialRunConfig,
    RunConfig,
    SectionTimeouts,
    Setting,
    config_from_args,
    default_text,
    options_table,
    resolve_plugin_settings,
    workload_defaults,
)

OPTIONS_MD = Path(__file__).resolve().parents[2] / "docs" / "options.md"


def committed_table() -> str:
    """The options table as docs/options.md holds it: from its head to the first blank line."""
    text = OPTIONS_MD.read_text(encoding="utf-8")
    start = text.index(OPTIONS_TABLE_HEAD.splitlines()[0])
    end = text.index("\n\n", start)
    return text[start:end]


def test_docs_table_is_the_generated_one() -> None:
    expected = options_table()
    assert committed_table() == expected, (
        "docs/options.md's options table differs from pytest_nvrx.settings.options_table(); "
        "paste this in its place:\n" + expected
    )


def test_docs_table_has_a_row_per_plugin_option_with_the_help_default() -> None:
    rows = committed_table().splitlines()[2:]
    assert len(rows) == len(PLUGIN_SETTINGS)
    by_option = {re.findall(r"--nvrx-[a-z-]+", row)[0]: row for row in rows}
    assert set(by_option) == {s.plugin_option for s in PLUGIN_SETTINGS}
    for setting in PLUGIN_SETTINGS:
        row = by_option[setting.plugin_option].strip("|")
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", row)]  # "\|" is a pipe in a cell
        if setting.show_default:
            # the same text as --help's "(default: ...)"
            assert cells[2] == default_text(setting.key), setting.name
        assert cells[1] == (f"`{setting.env}`" if setting.env else "—"), setting.name
    # the values users read: per workload where they differ
    assert default_text("gpus_per_node") == "megatron 1, reference 2"
    assert default_text("train_iters") == "megatron 100, reference 20"
    assert default_text("out_of_section_timeout") == "megatron 180, reference 60"
    assert default_text("run_timeout") == "megatron 1800, reference 600"
    assert default_text("save_interval") == "5"
    assert default_text("rdzv_endpoint") == "localhost:0"
    assert default_text("fault_rank") == "1 (0 when the run has one rank in all)"


def test_rows_are_consistent() -> None:
    run_fields = {f.name for f in fields(RunConfig)}
    attrs = {f.name for f in fields(NvrxSettings)}
    for side in (PLUGIN_SETTINGS, CLI_SETTINGS):
        names = [s.name for s in side]
        assert len(names) == len(set(names)), names
    for setting in SETTINGS:
        assert setting.field is None or setting.field in run_fields, setting.name
        assert setting.attr is None or setting.attr in attrs, setting.name
        if setting.in_plugin:
            # a plugin value lands somewhere: an attribute, else the scenarios' RunConfig
            assert setting.attr is not None or setting.field is not None, setting.name
            assert setting.flag or setting.doc_value, f"{setting.name}: no value in the docs"
        if setting.choices:
            assert setting.cli_form == "choice", setting.name
    # the CLI sets every RunConfig field but the extra arguments (after --) and the self-test's
    cli_fields = {s.field for s in CLI_SETTINGS if s.field is not None}
    assert cli_fields == run_fields - {"extra_args", *SELFTEST_FIELDS}


def test_walkthrough_variables_and_parsers() -> None:
    assert ENV_VARS == {
        "megatron_path": "MEGATRON_PATH",
        "work_dir": "NVRX_WORK_DIR",
        "run_id": "NVRX_RUN_ID",
        "nnodes": "NNODES",
        "gpus_per_node": "GPUS_PER_NODE",
        "tp": "TP",
        "pp": "PP",
        "train_iters": "TRAIN_ITERS",
        "save_interval": "SAVE_INTERVAL",
        "fault": "NVRX_DEMO_FAULT",
        "fault_rank": "NVRX_FAULT_RANK",
        "checkpoint_dir": "NVRX_CHECKPOINT_DIR",
        "rdzv_endpoint": "RDZV_ENDPOINT",
        "node_index": "NVRX_NODE_INDEX",
        "launcher": "NVRX_LAUNCHER",
        "schedule": "NVRX_SCHEDULE",
    }
    assert set(PARSERS) == {f.name for f in fields(RunConfig)} - {"extra_args", *SELFTEST_FIELDS}
    with pytest.raises(ConfigError, match=r"^TP must be a positive integer, got 'x'$"):
        PARSERS["tp"]("x", "TP")


def test_scenario_defaults_come_from_the_table() -> None:
    expected = {
        "reference": {
            "gpus_per_node": 2,
            "fault_rank": 1,
            "train_iters": 20,
            "save_interval": 5,
            "section_timeouts": SectionTimeouts(setup=120, step=10, checkpointing=15),
            "out_of_section_timeout": 60.0,
            "workload_check_interval": 1.0,
        },
        "megatron": {
            "gpus_per_node": 1,
            "section_timeouts": SectionTimeouts(setup=900, step=30, checkpointing=30),
            "workload_check_interval": 1.0,
        },
    }
    assert expected == {w: workload_defaults(w).given() for w in ("reference", "megatron")}
    assert RUN_TIMEOUTS == {"reference": 600.0, "megatron": 1800.0}


def cli_options() -> dict[str, argparse.Action]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    run = sub.choices["run"]
    return {opt: action for action in run._actions for opt in action.option_strings}


def test_cli_arguments_are_the_cli_rows() -> None:
    options = cli_options()
    expected = {s.cli_option for s in CLI_SETTINGS} | {"--default-profile", "-h", "--help"}
    assert set(options) == expected
    for setting in CLI_SETTINGS:
        assert options[setting.cli_option].help == setting.cli_help_text(), setting.name
    # the walkthrough's variable and default, in brackets; the reference workload's where it
    # differs (run --workload reference takes it)
    assert options["--train-iters"].help == "training iterations [TRAIN_ITERS, 100; reference: 20]"
    assert options["--tp"].help == "tensor-parallel size [TP, 1]"
    assert options["--fault"].help == "fault to inject [NVRX_DEMO_FAULT, kill]"
    assert options["--megatron-path"].help == "Megatron-LM checkout [MEGATRON_PATH]"
    assert options["--log-server-port"].help == "ft_launcher log server port [a free one]"
    assert options["--timeout"].default == 3600.0


def test_cli_reads_every_form(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        [
            "run",
            "--workload=reference",
            f"--work-dir={tmp_path}",
            "--tp=2",
            "--section-timeouts=setup:1,step:2,checkpointing:3",
            "--no-distributed-optimizer",
            "--default-profile",
            "--fault=hang",
            "--",
            "--seed=3",
        ]
    )
    config = config_from_args(args, {"TP": "4", "TRAIN_ITERS": "30"})
    assert config.workload == "reference" and config.work_dir == tmp_path
    assert config.tp == 2 and config.train_iters == 30  # option > variable
    assert config.section_timeouts == SectionTimeouts(1, 2, 3)
    assert config.distributed_optimizer is False and config.no_te_profile is False
    assert config.fault == "hang" and config.extra_args == ("--seed=3",)
    bare = config_from_args(build_parser().parse_args(["run", f"--work-dir={tmp_path}"]), {})
    assert bare.distributed_optimizer is True and bare.no_te_profile is None
    with pytest.raises(ConfigError, match=r"^--nnodes must be a positive integer, got '0'$"):
        config_from_args(build_parser().parse_args(["run", "--nnodes=0"]), {})


def lookup_from(found: dict[str, tuple[Any, str]]) -> Any:
    return lambda setting: found.get(setting.name)


def test_plugin_resolution_from_the_table(tmp_path: Path) -> None:
    resolved = resolve_plugin_settings(
        lookup_from(
            {
                "tp": ("2", "--nvrx-tp"),
                "work-dir": (str(tmp_path), "environment variable NVRX_WORK_DIR"),
                "window": ("save, finalize,save", "ini value nvrx_window"),
                "keep": (True, "--nvrx-keep"),
                "no-distributed-optimizer": ("yes", "ini value nvrx_no_distributed_optimizer"),
                "run-timeout": ("90", "--nvrx-run-timeout"),
                "workload": ("reference", "--nvrx-workload"),
            }
        ),
        environ=None,
    )
    assert resolved.overrides == PartialRunConfig(tp=2, distributed_optimizer=False)
    assert resolved.work_dir == tmp_path and resolved.windows == ("save", "finalize")
    assert resolved.keep is True and resolved.run_timeout == 90.0
    assert resolved.workloads == ("reference",)
    # a flag given as false is not given
    off = resolve_plugin_settings(lookup_from({"keep": ("off", "env")}), environ=None)
    assert off.keep is False
    # a multinode session inside a Slurm allocation launches through srun, only with environ
    nodes = lookup_from({"nnodes": ("2", "--nvrx-nnodes")})
    assert resolve_plugin_settings(nodes, {"SLURM_JOB_ID": "7"}).overrides.launcher == "slurm"
    assert resolve_plugin_settings(nodes, None).overrides.launcher is None


@pytest.mark.parametrize(
    ("name", "raw", "message"),
    [
        ("work-dir", "rel/work", "^S: must be an absolute path, got rel/work$"),
        ("workload", "bert", "^S: must be one of megatron, reference, got 'bert'$"),
        ("matrix", "half", "^S must be one of default, full"),
        ("run-dir", "/nonexistent/x", "^S: /nonexistent/x is not a directory$"),
        ("megatron-path", "/tmp", "^S: pretrain_gpt.py not found in /tmp"),
        ("continuity-rtol", "2", "^S: '2': need 0 <= rtol < 1"),
        ("keep", "maybe", "^S must be one of 1/true/yes/on"),
    ],
)
def test_plugin_errors_name_the_source(name: str, raw: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve_plugin_settings(lookup_from({name: (raw, "S")}), environ=None)


def test_a_row_needs_an_attribute_that_exists() -> None:
    """NvrxSettings has slots: a row whose attribute is missing fails at once, not silently."""
    with pytest.raises(AttributeError):
        setattr(NvrxSettings(), Setting("no-such", "h", attr="no_such").attr or "", 1)
