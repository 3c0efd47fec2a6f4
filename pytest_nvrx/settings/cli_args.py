"""``python -m pytest_nvrx run``'s arguments: generated from the settings table's CLI rows, and
what they ask for (:class:`RunRequest`: the RunConfig, a dry run or not).

``run --workload reference`` takes the plugin's reference scenario sizing (20 iterations, a save
every 5, 30 s checkpointing deadline, ...) for every value neither an option nor the
walkthrough's environment variable gives; a Megatron run keeps the walkthrough's values.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass

from pytest_nvrx.settings.record import PartialRunConfig, RunConfig
from pytest_nvrx.settings.resolution import resolve
from pytest_nvrx.settings.table import CLI_SETTINGS, ENV_VARS, parse_value, workload_defaults
from pytest_nvrx.settings.values import argparse_type, dry_run_requested


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``run``: the CLI rows of the settings table (SETTINGS); each falls back to
    the walkthrough's environment variable, shown in brackets."""
    for setting in CLI_SETTINGS:
        option, text = setting.cli_option, setting.cli_help_text()
        if setting.cli_off is not None:
            # two flags, one setting: each sets its value, neither leaves it to the stack
            both = parser.add_mutually_exclusive_group()
            off, off_help = setting.cli_off
            for name, value, shown in ((option, True, text), (f"--{off}", False, off_help)):
                both.add_argument(
                    name, dest=setting.cli_dest, action="store_const", const=value, help=shown
                )
        elif setting.flag:
            parser.add_argument(option, action="store_true", help=text)
        elif setting.cli_form == "choice":
            parser.add_argument(option, choices=setting.choices, help=text)
        elif setting.cli_form == "path":
            parser.add_argument(option, type=argparse_type(setting.parse, option), help=text)
        elif setting.cli_form == "typed":
            parser.add_argument(
                option,
                type=argparse_type(setting.parse, option),
                default=setting.cli_default,
                help=text,
            )
        else:  # text, parsed like an environment value (config_from_args)
            parser.add_argument(option, help=text)
    parser.add_argument("extra", nargs="*", help="extra workload arguments (after --)")


def config_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> RunConfig:
    """The run's RunConfig: the options given, over the walkthrough's environment variables."""
    given: dict[str, object] = {"extra_args": tuple(args.extra) if args.extra else None}
    for setting in CLI_SETTINGS:
        if setting.field is None:
            continue
        value = getattr(args, setting.cli_dest)
        if setting.flag and setting.cli_off is None:
            # store_true: given, it sets the row's value
            value = setting.flag_value if value else None
        elif value is not None and not setting.flag and setting.cli_form == "text":
            value = parse_value(setting.field, value, setting.cli_option)
        if value is not None:
            given[setting.field] = value
    explicit = PartialRunConfig.of(given)
    if explicit.workload == "reference":
        explicit = reference_defaults(explicit, environ)
    return resolve(explicit, environ)


def reference_defaults(explicit: PartialRunConfig, environ: Mapping[str, str]) -> PartialRunConfig:
    """The reference workload's scenario defaults (the plugin's, e.g. a 30 s checkpointing
    deadline instead of the walkthrough's 600 s) under what the options and the walkthrough's
    environment variables give: a CPU run sized like the plugin's reference scenarios."""
    defaults = workload_defaults("reference").given()
    unset = {
        name: value
        for name, value in defaults.items()
        if not (name in ENV_VARS and environ.get(ENV_VARS[name], ""))
    }
    return explicit.over(PartialRunConfig.of(unset))


@dataclass(frozen=True)
class RunRequest:
    """What ``run``'s arguments ask for: the run's config, and whether to only print its
    command (``--dry-run`` or the environment's NVRX_DRY_RUN)."""

    config: RunConfig
    dry_run: bool


def run_request(args: argparse.Namespace, environ: Mapping[str, str]) -> RunRequest:
    """``run``'s parsed arguments over the environment; ConfigError for a bad value."""
    dry_run = bool(args.dry_run) or dry_run_requested(environ)
    return RunRequest(config_from_args(args, environ), dry_run)
