"""What one row of the settings table is (:class:`Setting`): where it is given, how its text
is read, what it means, its defaults; and how the help and the docs show it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any, Literal

from pytest_nvrx.settings.record import RunConfig, SectionTimeouts, WorkloadKind
from pytest_nvrx.settings.values import (
    EntryPoint,
    format_seconds,
    parse_non_negative_int,
    parse_positive_int,
    parse_rtol,
    parse_seconds,
    parse_text,
)

#: Where a setting is given: the pytest plugin (``--nvrx-<name>``, ini ``nvrx_<name>``), the
#: CLI's ``run`` (``--<name>``), or both.
SettingWhere = Literal["both", "plugin", "cli"]
#: How the CLI reads a value: text parsed after argparse like an environment value (its error
#: names the option), parsed by argparse itself (``typed``: an argparse error), a path, a choice.
CliForm = Literal["text", "typed", "path", "choice"]
#: The order in which per-workload defaults are shown.
DEFAULTS_SHOWN: tuple[WorkloadKind, ...] = ("megatron", "reference")


@dataclass(frozen=True)
class Setting:
    """One setting: where it is given, how its text is read, what it means, its defaults.

    ``field`` is the RunConfig field it sets; a plugin setting without ``attr`` gives that field
    of :attr:`NvrxSettings.overrides` (a PartialRunConfig: the scenarios' RunConfig values), one
    with ``attr`` sets that attribute of NvrxSettings. A new option is a new row (plus the
    attribute it sets)."""

    name: str  # the option without its prefix: --nvrx-<name>, --<name>, ini nvrx_<name>
    help: str
    field: str | None = None
    #: text (environment, ini, option) -> value; errors name the source given as second argument
    parse: Callable[[str, str], Any] = parse_text
    env: str | None = None
    where: SettingWhere = "both"
    choices: tuple[str, ...] = ()
    #: an option without a value; given, it sets ``flag_value``
    flag: bool = False
    flag_value: Any = True
    attr: str | None = None
    #: the plugin's parser where it checks more than the field's (a checkout, an absolute dir)
    plugin_parse: Callable[[str, str], Any] | None = None
    #: the scenarios' defaults where they are not RunConfig's (the walkthrough's)
    defaults: Mapping[WorkloadKind, Any] | None = None
    #: the plugin's help ends with ``(default: ...)``
    show_default: bool = False
    #: the default as shown, where it is not one value per workload
    default_note: str | None = None
    cli_help: str | None = None
    #: what the CLI's help shows in brackets; None: the variable and the walkthrough's default,
    #: "": nothing
    cli_note: str | None = None
    cli_form: CliForm = "text"
    cli_default: Any = None
    #: (name, help) of a second CLI flag that sets the opposite value (mutually exclusive)
    cli_off: tuple[str, str] | None = None
    #: the docs' table: what follows the option, its meaning (default: help), its default
    doc_value: str = ""
    doc: str | None = None
    doc_default: str | None = None

    @property
    def in_plugin(self) -> bool:
        return self.where != "cli"

    @property
    def in_cli(self) -> bool:
        return self.where != "plugin"

    @property
    def plugin_option(self) -> str:
        return f"--nvrx-{self.name}"

    @property
    def cli_option(self) -> str:
        return f"--{self.name}"

    @property
    def ini(self) -> str:
        """The ini name, also the plugin option's dest."""
        return "nvrx_" + self.name.replace("-", "_")

    @property
    def ini_type(self) -> Literal["string", "int", "float", "bool"]:
        """The ini value's pytest type: a native ``[tool.pytest]`` table takes ``5``, not only
        ``"5"`` (pytest 9 refuses a number for a string value)."""
        if self.flag:
            return "bool"
        if self.parse in (parse_positive_int, parse_non_negative_int):
            return "int"
        if self.parse in (parse_seconds, parse_rtol):
            return "float"
        return "string"

    @property
    def metavar(self) -> str:
        """What follows the option in ``--help`` (the docs' value, ``S`` spelled out)."""
        value = self.doc_value.replace("\\|", "|")
        return {"S": "SECONDS", "": self.name.split("-")[-1].upper()}.get(value, value)

    def hint(self, entry: EntryPoint, value: str | None = None) -> str:
        """This setting as a fix-it hint to a user of ``entry`` names it: the option there, then
        the variable and, for the plugin, the ini value: ``--nvrx-tp (TP, ini nvrx_tp)``,
        ``--tp (TP)``; with ``value``, ``--tp 2 (TP=2)``."""
        option = self.plugin_option if entry == "plugin" else self.cli_option
        also = [] if self.env is None else [self.env if value is None else f"{self.env}={value}"]
        if entry == "plugin":
            also.append(f"ini {self.ini}")
        given = option if value is None else f"{option} {value}"
        return f"{given} ({', '.join(also)})" if also else given

    @property
    def cli_dest(self) -> str:
        return self.name.replace("-", "_")

    @property
    def key(self) -> str:
        """What the setting sets: its NvrxSettings attribute, else its RunConfig field."""
        return self.attr or self.field or self.name.replace("-", "_")

    def walkthrough_default(self) -> Any:
        """RunConfig's default (the walkthrough's, what the CLI uses), or the CLI's own."""
        if self.field is None:
            return self.cli_default
        return _RUN_CONFIG_DEFAULTS.get(self.field)

    def default_text(self) -> str:
        """The scenarios' default as ``--help`` and docs/options.md show it: one value, or one
        per workload where they differ (``megatron 100, reference 20``)."""
        if self.default_note is not None:
            return self.default_note
        base = self.walkthrough_default()
        defaults = self.defaults or {}
        shown = {w: _show_value(defaults.get(w, base)) for w in DEFAULTS_SHOWN}
        if len(set(shown.values())) == 1:
            return shown[DEFAULTS_SHOWN[0]]
        return ", ".join(f"{w} {v}" for w, v in shown.items())

    def plugin_help(self) -> str:
        text = self.help
        if self.show_default:
            text += f" (default: {self.default_text()})"
        if self.env and not self.flag:
            text += f" [env {self.env}]"
        return text

    def cli_help_text(self) -> str:
        text = self.cli_help or self.help
        note = self.cli_note
        if note is None:
            default = None if self.flag else self.walkthrough_default()
            parts = [part for part in (self.env, _show_value(default)) if part]
            note = ", ".join(parts)
            reference = (self.defaults or {}).get("reference")
            if self.field is not None and reference is not None and reference != default:
                # `run --workload reference` takes the plugin's reference scenario default
                note = f"{note}; reference: {_show_value(reference)}".lstrip("; ")
        return f"{text} [{note}]" if note else text

    def doc_row(self) -> str:
        option = f"`{self.plugin_option}{' ' + self.doc_value if self.doc_value else ''}`"
        env = f"`{self.env}`" if self.env else "—"
        if self.doc_default is not None:
            default = self.doc_default
        elif self.show_default or self.defaults:
            default = self.default_text()
        else:
            default = "—"
        return f"| {option} | {env} | {default} | {self.doc or self.help} |"


def _show_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, SectionTimeouts):
        return value.render()
    if isinstance(value, float):
        return format_seconds(value)
    return str(value)


_RUN_CONFIG_DEFAULTS: dict[str, Any] = {
    **{f.name: f.default for f in fields(RunConfig) if f.default is not MISSING},
    **{f.name: f.default_factory() for f in fields(RunConfig) if f.default_factory is not MISSING},
}
