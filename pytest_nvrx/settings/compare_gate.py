"""The comparison's gate: which change fails it, parsed from ``compare --fail-on`` and
``--nvrx-compare-fail`` specs (pure text, as the fault schedules: pytest_nvrx.compare applies it).

A spec is one rule, or several joined by commas:

* ``verdict``: a scenario that qualified on OLD and does not on NEW;
* ``missing``: a scenario of OLD that NEW does not have (deselected, skipped, never run: its
  absence is no qualification);
* ``downtime:+20%`` / ``downtime:+10s``: a scenario's downtime (a schedule's total, and each of
  its recoveries' own) grew by more than that;
* ``phase:NAME:+5s`` / ``phase:NAME:+20%``: that recovery phase grew by more than that. NAME is
  a phase id of the report (``checkpoint_load``) or one word of it that names one phase alone
  (``load``, ``reclaim``, ``rendezvous``).

A growth is ``new - old`` seconds; a percent is of ``old`` (``old`` 0 and ``new`` above it is
growth beyond any percent). A timing the rule names that OLD measured and NEW does not fails the
rule (the measurement was lost, never taken as kept); one OLD lacks is not gated (nothing to
hold it to).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pytest_nvrx.layout import PHASE_IDS
from pytest_nvrx.settings.values import ConfigError, quote

#: the CLI's option; the plugin's parser is given its own source (option, variable, ini)
CLI_FLAG = "--fail-on"


def _bad(flag: str, spec: str, why: str) -> ConfigError:
    """A spec refused: one line that starts with where it came from."""
    return ConfigError(f"{flag} {quote(spec)}{why}")


#: a limit: ``+`` then an ASCII decimal number then ``s`` or ``%``
_LIMIT = re.compile(r"\+(?P<number>[0-9]+(?:\.[0-9]+)?)(?P<unit>s|%)")


@dataclass(frozen=True, slots=True)
class Limit:
    """How much a timing may grow: ``amount`` seconds, or ``amount`` percent of the old value."""

    amount: float
    percent: bool

    def exceeded(self, old: float, new: float) -> bool:
        growth = new - old
        if self.percent:
            if old <= 0:
                return growth > 0
            return growth > old * self.amount / 100
        # a millisecond's slack: both sides are rounded to the millisecond
        return growth > self.amount + 0.0005

    def __str__(self) -> str:
        return f"+{self.amount:g}{'%' if self.percent else 's'}"


@dataclass(frozen=True, slots=True)
class GateRule:
    """One rule of the gate: ``what`` is ``verdict``, ``missing``, ``downtime`` or a phase id."""

    what: str
    limit: Limit | None  # None: the verdict and missing rules

    @property
    def timing(self) -> bool:
        return self.limit is not None

    def __str__(self) -> str:
        if self.limit is None:
            return self.what
        if self.what == "downtime":
            return f"downtime:{self.limit}"
        return f"phase:{self.what}:{self.limit}"


def phase_named(name: str, spec: str, flag: str = CLI_FLAG) -> str:
    """The phase id ``name`` names: the id itself, or the one id that has it as a word."""
    if name in PHASE_IDS:
        return name
    words = [p for p in PHASE_IDS if name in p.split("_")]
    if len(words) == 1:
        return words[0]
    known = ", ".join(PHASE_IDS)
    if not words:
        raise _bad(flag, spec, f": no phase {quote(name)}; phases: {known}")
    raise _bad(
        flag, spec, f": {quote(name)} names several phases ({', '.join(words)}); give the id"
    )


def _limit(text: str, spec: str, flag: str) -> Limit:
    match = _LIMIT.fullmatch(text)
    if match is None:
        raise _bad(flag, spec, f": the limit {quote(text)} is not +Ns or +N% (e.g. +10s, +20%)")
    return Limit(float(match["number"]), match["unit"] == "%")


def parse_rule(spec: str, flag: str = CLI_FLAG) -> GateRule:
    """One rule; :class:`ConfigError` (one line, naming ``flag``) for anything else."""
    text = spec.strip()
    if text in ("verdict", "missing"):
        return GateRule(text, None)
    parts = text.split(":")
    if parts[0] == "downtime" and len(parts) == 2:
        return GateRule("downtime", _limit(parts[1], spec, flag))
    if parts[0] == "phase" and len(parts) == 3:
        return GateRule(phase_named(parts[1], spec, flag), _limit(parts[2], spec, flag))
    raise _bad(
        flag,
        spec,
        " is not a gate rule: verdict, missing, downtime:+N%, downtime:+Ns, phase:NAME:+Ns "
        "or phase:NAME:+N%",
    )


def parse_gate(specs: list[str] | tuple[str, ...], flag: str = CLI_FLAG) -> tuple[GateRule, ...]:
    """Every rule of every spec (each may join several with commas), in order, repeats once."""
    rules: list[GateRule] = []
    for spec in specs:
        for part in spec.split(","):
            if not part.strip():
                raise _bad(flag, spec, " holds an empty rule")
            rule = parse_rule(part, flag)
            if rule not in rules:
                rules.append(rule)
    return tuple(rules)


def parse_gate_setting(raw: str, what: str) -> tuple[GateRule, ...]:
    """The plugin's ``--nvrx-compare-fail`` (its variable, its ini value): ``what`` names it."""
    return parse_gate([raw], what)
