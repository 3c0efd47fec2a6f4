"""Typed fields of the JSON records a run directory holds (marker, run.json, result.json).

A field of the wrong type is not "absent": a marker whose ``time`` has no timezone or a
result.json whose ``exit_code`` is the string ``"0"`` says something other than what the
criteria would read into it. Each reader returns the value or says, in a few words, what is
wrong with it; the caller turns that into an unusable record ("cannot judge").
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from pytest_nvrx.evidence.refs import TIME_RANGE, time_in_range
from pytest_nvrx.settings.values import quote

# How much of a bad value a message quotes (issue #9: no message echoes more than 80 characters).
_MAX_SHOWN = 40


class FieldError(ValueError):
    """A present field whose value is not of the type its record defines."""


def shown(value: object) -> str:
    """A bad value for a message: its JSON type and at most a short excerpt."""
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if value is None:
        return "null"
    if isinstance(value, str):
        return f"the string {quote(value, _MAX_SHOWN)}"
    if isinstance(value, int | float):
        text = repr(value)
        return f"the number {text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 1] + '…'}"
    return {"dict": "an object", "list": "an array"}.get(type(value).__name__, "another type")


def int_field(
    data: Mapping[str, object], key: str, *, required: bool = False, minimum: int | None = None
) -> int | None:
    """``data[key]`` as an int (a JSON integer; booleans are not); None when absent or null.

    A required field that is missing or not an integer is "no integer 'key'"; an optional one
    of the wrong type names what it is instead.
    """
    value = data.get(key)
    wrong = value is not None and (not isinstance(value, int) or isinstance(value, bool))
    if required and (value is None or wrong):
        raise FieldError(f"no integer {key!r}")
    if value is None:
        return None
    if wrong or not isinstance(value, int):
        raise FieldError(f"{key!r} must be an integer, not {shown(value)}")
    if minimum is not None and value < minimum:
        raise FieldError(f"{key!r} must be at least {minimum}, not {value}")
    return value


def str_field(
    data: Mapping[str, object],
    key: str,
    *,
    required: bool = False,
    choices: tuple[str, ...] | None = None,
) -> str | None:
    """``data[key]`` as a string (one of ``choices`` when given); None when absent or null."""
    value = data.get(key)
    if required and not isinstance(value, str):
        raise FieldError(f"no {key!r}")
    if value is None:
        return None
    if not isinstance(value, str):
        raise FieldError(f"{key!r} must be a string, not {shown(value)}")
    if choices is not None and value not in choices:
        raise FieldError(f"{key!r} must be one of {', '.join(choices)}, not {shown(value)}")
    return value


def bool_field(data: Mapping[str, object], key: str, *, required: bool = False) -> bool | None:
    """``data[key]`` as a JSON boolean (``0``/``"true"`` are not); None when absent or null."""
    value = data.get(key)
    if value is None:
        if required:
            raise FieldError(f"no boolean {key!r}")
        return None
    if not isinstance(value, bool):
        raise FieldError(f"{key!r} must be a boolean, not {shown(value)}")
    return value


def seconds_field(data: Mapping[str, object], key: str) -> float | None:
    """``data[key]`` as a finite, non-negative number of seconds; None when absent or null."""
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e9:
        raise FieldError(f"{key!r} must be a number of seconds, not {shown(value)}")
    return float(value)


_RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,200}")


def names_field(data: Mapping[str, object], key: str) -> tuple[str, ...] | None:
    """``data[key]`` as a list of distinct run IDs (letters, digits, ``_``, ``-``, as every
    run ID is); None when absent or null."""
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(
        isinstance(v, str) and _RUN_ID.fullmatch(v) for v in value
    ):
        raise FieldError(f"{key!r} must be a list of run IDs, not {shown(value)}")
    if len(set(value)) != len(value):
        raise FieldError(f"{key!r} names a run twice")
    return tuple(value)


def strings_field(data: Mapping[str, object], key: str) -> tuple[str, ...] | None:
    """``data[key]`` as a list of strings (an argv); None when absent or null."""
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise FieldError(f"{key!r} must be a list of strings, not {shown(value)}")
    return tuple(value)


def time_field(data: Mapping[str, object], key: str, *, required: bool = False) -> datetime | None:
    """``data[key]``, an ISO-8601 time *with* its timezone (``Z`` or an offset), in UTC.

    A naive time is refused rather than assumed UTC: the records compared with it (launcher
    events, Megatron's local stamps) are in known zones, and a guess of the wrong one moves the
    fault by hours.
    """
    value = data.get(key)
    if value is None and not required:
        return None
    try:
        if not isinstance(value, str):
            raise ValueError(value)
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        if required:
            raise FieldError(f"no valid {key!r}") from None
        raise FieldError(f"{key!r} is not an ISO-8601 time: {shown(value)}") from None
    if not time_in_range(parsed):
        raise FieldError(
            f"{key!r} is out of range ({shown(value)}): a run's clock reads {TIME_RANGE}"
        )
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise FieldError(f"{key!r} has no timezone ({shown(value)}): add 'Z' or an offset")
    return parsed.astimezone(UTC)


class Fields:
    """Reads the typed fields of one record, collecting what is wrong instead of stopping."""

    def __init__(self, data: Mapping[str, object]) -> None:
        self.data = data
        self.problems: list[str] = []
        self.bad_keys: list[str] = []  # the keys of those problems, in order

    def get[T](self, read: Callable[..., T | None], key: str, **kwargs: Any) -> T | None:
        """``read(data, key, **kwargs)``; None (and the problem noted) when the value is wrong."""
        try:
            return read(self.data, key, **kwargs)
        except FieldError as exc:
            self.problems.append(str(exc))
            self.bad_keys.append(key)
            return None
