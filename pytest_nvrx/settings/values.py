"""Text values: the one parser per kind of value, the error they raise, how messages quote.

Every entry point (pytest options and ini values, the CLI, the walkthrough's environment
variables) reads a value through these parsers, so a bad value gets the same message wherever it
was given.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TextIO

#: Integers go to ft_launcher, torch and Megatron, which hold them in 64 bits.
INT64_MAX = 2**63 - 1
#: Seconds that still fit in 64-bit nanoseconds (threading.TIMEOUT_MAX, time.sleep).
MAX_SECONDS = INT64_MAX // 10**9
#: No message quotes more than this many characters of a value the user gave.
QUOTE_MAX = 80

#: The one reading of a boolean text value (environment variables, ini values).
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off", "")


#: Who shows a message to the user: the pytest plugin (``--nvrx-*`` options, ini values) or the
#: CLI (``python -m pytest_nvrx run``, ``--*`` options). Each spells an option its own way.
EntryPoint = Literal["plugin", "cli"]


class ConfigError(ValueError):
    """A setting is invalid; the message says which one and how to fix it.

    A message whose fix names options is written once, as a function of the entry point
    (:meth:`naming`), and spelled by the one that shows it (:meth:`message_for`): a pytest user
    reads ``--nvrx-save-interval``, a CLI user ``--save-interval``. ``str()`` is the CLI's."""

    def __init__(self, message: str, *, spelled: Callable[[EntryPoint], str] | None = None):
        super().__init__(message)
        self._spelled = spelled

    @classmethod
    def naming(cls, message: Callable[[EntryPoint], str]) -> ConfigError:
        """An error whose message names options, spelled by ``message`` for an entry point."""
        return cls(message("cli"), spelled=message)

    def message_for(self, entry: EntryPoint) -> str:
        """The message as ``entry`` shows it (the options it names in that entry's spelling)."""
        return str(self) if self._spelled is None else self._spelled(entry)


def quote(text: str, limit: int = QUOTE_MAX) -> str:
    """``repr(text)``, cut to ``limit`` characters: no message echoes a huge value back."""
    shown = repr(text)
    if len(shown) <= limit:
        return shown
    return f"{shown[: limit - 3]}... ({len(text)} characters)"


def show_path(path: Path | str, limit: int = 200) -> str:
    """A path for a message: whole when reasonable, else its start and end and its length."""
    text = str(path)
    if len(text) <= limit:
        return text
    return f"{text[: limit // 2]}...{text[-limit // 4 :]} ({len(os.fsencode(text))} bytes)"


DRY_RUN_ENV = "NVRX_DRY_RUN"


def _int64(raw: str, what: str, pattern: str, kind: str) -> int:
    """ASCII digits only; the length is checked before ``int()`` (which refuses over 4300
    digits with a ValueError) so a 5000-digit value is a ConfigError like any other."""
    text = raw.strip()
    if not re.fullmatch(pattern, text):
        raise ConfigError(f"{what} must be a {kind} integer, got {quote(raw)}")
    if len(text) > len(str(INT64_MAX)) or int(text) > INT64_MAX:
        raise ConfigError(f"{what} must be at most {INT64_MAX} (64 bits), got {quote(raw)}")
    return int(text)


def parse_positive_int(raw: str, what: str) -> int:
    return _int64(raw, what, r"[1-9][0-9]*", "positive")


def parse_non_negative_int(raw: str, what: str) -> int:
    return _int64(raw, what, r"0|[1-9][0-9]*", "non-negative")


#: A number as the options take it: ASCII digits, a point, an exponent. ``float()`` alone also
#: reads any script's digits (``٣.5``), ``1_0`` and ``infinity``, which the integer options refuse.
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _decimal(raw: str) -> float:
    """``raw`` as a float, NaN where it is no plain ASCII decimal number."""
    text = raw.strip()
    return float(text) if _DECIMAL.fullmatch(text) else math.nan


def parse_seconds(raw: str, what: str) -> float:
    """A positive, finite number of seconds that fits in 64-bit nanoseconds."""
    value = _decimal(raw)
    if not (value > 0 and math.isfinite(value)):
        raise ConfigError(f"{what} must be a positive number of seconds, got {quote(raw)}")
    if value > MAX_SECONDS:
        raise ConfigError(
            f"{what} must be at most {MAX_SECONDS} seconds (64-bit nanoseconds), got {quote(raw)}"
        )
    return value


def named_seconds(
    text: str,
    sep: str,
    names: Sequence[str],
    *,
    refused: Callable[[str], str],
    twice: Callable[[str], str],
    what: Callable[[str], str],
) -> dict[str, float]:
    """``NAME<sep>SECONDS[,...]`` with each NAME one of ``names`` at most once. The messages:
    ``refused(part)`` for a part that is no such pair, ``twice(name)``, and ``what(name)`` names
    a value for :func:`parse_seconds`."""
    out: dict[str, float] = {}
    for part in text.split(","):
        name, found, raw = part.strip().partition(sep)
        if not found or name not in names:
            raise ConfigError(refused(part.strip()))
        if name in out:
            raise ConfigError(twice(name))
        out[name] = parse_seconds(raw, what(name))
    return out


def parse_rtol(raw: str, what: str) -> float:
    """A relative tolerance 0 <= rtol < 1 (0: exact), or a ConfigError naming ``what``."""
    value = _decimal(raw)
    if math.isnan(value):
        raise ConfigError(f"{what}: {quote(raw)} is not a number")
    if not 0.0 <= value < 1.0:  # also rejects nan
        raise ConfigError(f"{what}: {quote(raw)}: need 0 <= rtol < 1 (0 means exact)")
    return value


def finite_float(text: str) -> float | None:
    """``float(text)`` where it reads a finite number, else None."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def argparse_type(parse: Callable[[str, str], Any], option: str) -> Callable[[str], Any]:
    """An argparse ``type`` from one of these parsers: one parser for every entry point, its
    error an argparse error (exit 2 before anything is done)."""

    def convert(text: str) -> Any:
        try:
            return parse(text, option)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def command_parser(command: str, description: str, epilog: str) -> argparse.ArgumentParser:
    """The argument parser of one of ``python -m pytest_nvrx``'s commands."""
    return argparse.ArgumentParser(
        prog=f"python -m pytest_nvrx {command}", description=description, epilog=epilog
    )


def add_continuity_rtol(parser: argparse.ArgumentParser, help: str) -> None:
    """``--continuity-rtol``, training_continuity's tolerance, for a command that judges runs:
    one parser and default (0: exact) for every one of them."""
    parser.add_argument(
        "--continuity-rtol",
        metavar="RTOL",
        type=argparse_type(parse_rtol, "--continuity-rtol"),
        default=0.0,
        help=help,
    )


def parse_command_line(
    parser: argparse.ArgumentParser, argv: Sequence[str], usage_status: int
) -> argparse.Namespace | int:
    """``argv`` parsed, or the exit status where argparse ended it: 0 after ``--help``, its
    own (2) after a usage error it printed, else ``usage_status``."""
    try:
        return parser.parse_args(list(argv))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else usage_status


def parse_command(
    command: str,
    argv: Sequence[str],
    usage_status: int,
    *,
    description: str,
    epilog: str,
    arguments: Callable[[argparse.ArgumentParser], None],
    continuity_rtol: str | None = None,
) -> argparse.Namespace | int:
    """A command's whole command line in one step: its parser (:func:`command_parser`), the
    command's own ``arguments``, ``--continuity-rtol`` last where the command judges runs (its
    help), then ``argv`` parsed (:func:`parse_command_line`: the namespace or an exit status)."""
    parser = command_parser(command, description, epilog)
    arguments(parser)
    if continuity_rtol is not None:
        add_continuity_rtol(parser, continuity_rtol)
    return parse_command_line(parser, argv, usage_status)


#: A command's body: its parsed command line, its stdout and its stderr -> the exit status.
CommandBody = Callable[[argparse.Namespace, TextIO, TextIO], int]


def run_command(
    args: argparse.Namespace | int,
    body: CommandBody,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """A command whose command line was parsed (:func:`parse_command_line`,
    :func:`parse_command`): the exit status where parsing ended it, else ``body``'s, given the
    namespace and the streams (None: sys.stdout, sys.stderr as they are at the call, so a
    caller's redirection holds)."""
    if isinstance(args, int):
        return args
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    return body(args, out, err)


def parse_port(raw: str, what: str) -> int:
    """A TCP port we connect to or listen on: 1-65535 (0 would be a random one)."""
    text = raw.strip()
    if not re.fullmatch(r"[0-9]{1,5}", text) or not 1 <= int(text) <= 65535:
        raise ConfigError(f"{what} must be a port number from 1 to 65535, got {quote(raw)}")
    return int(text)


def check_port(port: int, what: str) -> int:
    """:func:`parse_port` for a value that is already an int (API callers)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        if isinstance(port, int) and abs(port) <= INT64_MAX:
            shown = str(port)
        else:  # str() of a huge int raises ValueError (over 4300 digits)
            shown = "an integer beyond 64 bits" if isinstance(port, int) else quote(repr(port))
        raise ConfigError(f"{what} must be a port number from 1 to 65535, got {shown}")
    return port


def format_seconds(value: float) -> str:
    """Seconds as the launcher CLI takes them: ``180`` for whole numbers, else ``2.5``."""
    return str(int(value)) if float(value).is_integer() else repr(value)


def choice_parser(choices: tuple[str, ...]) -> Callable[[str, str], str]:
    def parse(raw: str, what: str) -> str:
        if raw not in choices:
            raise ConfigError(f"{what} must be one of {', '.join(choices)}, got {quote(raw)}")
        return raw

    return parse


#: What a terminal obeys rather than shows (C0 controls, DEL, C1 controls) and what reorders
#: or breaks a line without being a control (bidi marks, embeddings, overrides and isolates,
#: line and paragraph separators): refused in a path we are given (a run's own text is shown
#: with them escaped instead, :func:`pytest_nvrx.evidence.refs.printable`).
CONTROL_CHARACTERS = "\\x00-\\x1f\\x7f-\\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029"
_CONTROL = re.compile(f"[{CONTROL_CHARACTERS}]")


def check_path_text(path: Path | str, what: str) -> None:
    """Refuse a path holding a control character (a newline, ESC, ...): it would be printed to
    terminals, written into logs and passed on to the launcher as it is."""
    text = str(path)
    found = _CONTROL.search(text)
    if found is not None:
        raise ConfigError(
            f"{what} {quote(text)} holds the control character {found[0]!r}: a path with a"
            " newline or a terminal escape cannot be shown or passed on safely; use another path"
        )


def parse_path(raw: str, what: str) -> Path:
    if not raw:
        raise ConfigError(f"{what} must not be empty")
    check_path_text(raw, what)
    return Path(raw)


def parse_text(raw: str, what: str) -> str:
    return raw


def parse_bool(raw: str, what: str) -> bool:
    """The one boolean parser: 1/true/yes/on, 0/false/no/off or empty (any case, spaces
    ignored); anything else is an error that names ``what`` (e.g. the variable)."""
    lowered = raw.strip().lower()
    if lowered in TRUE_WORDS:
        return True
    if lowered in FALSE_WORDS:
        return False
    raise ConfigError(
        f"{what} must be one of {'/'.join(TRUE_WORDS)} (true) or "
        f"{'/'.join(FALSE_WORDS[:-1])} or empty (false), got {quote(raw)}"
    )


def env_flag(environ: Mapping[str, str], var: str) -> bool:
    """A boolean environment variable, unset = false; errors name the variable."""
    return parse_bool(environ.get(var, ""), f"environment variable {var}")


def dry_run_requested(environ: Mapping[str, str]) -> bool:
    """``NVRX_DRY_RUN``: true/yes/on/1 ask for a dry run, like ``--dry-run``."""
    return env_flag(environ, DRY_RUN_ENV)
