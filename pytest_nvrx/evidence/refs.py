"""Evidence references and the streaming line reader every parser uses.

Every fact a parser extracts carries an :class:`EvidenceRef` (file relative to the run directory,
1-based line, the raw line) so that a verdict can quote the line that proves it. Logs can be many
gigabytes, truncated by a kill, or contain junk: :func:`iter_lines` reads them in bounded chunks,
caps overlong lines and decodes each line with ``errors="replace"``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from pathlib import Path
from typing import BinaryIO, Literal

# A longer line keeps its head; the rest of it is skipped (a file of NUL bytes has no newline).
MAX_LINE_BYTES = 64 * 1024
# How much of a line a reference keeps: enough to quote, bounded for memory.
MAX_QUOTE_CHARS = 400
_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class EvidenceRef:
    """Where a fact came from: ``file`` (relative to the run dir), ``line`` (1-based) and text.

    ``line`` is ``None`` for facts about a whole file (it is absent, or a binary's metadata);
    ``text`` is then a description rather than a quote.
    """

    file: str
    line: int | None
    text: str

    @property
    def location(self) -> str:
        return self.file if self.line is None else f"{self.file}:{self.line}"

    def render(self, width: int | None = None) -> str:
        text = self.text
        if width is not None and len(text) > width:
            text = text[: width - 1] + "…"
        return f"{self.location}: {text}"

    def __str__(self) -> str:
        return self.render()


Severity = Literal["fatal", "warning"]


@dataclass(frozen=True, slots=True)
class Problem:
    """Something wrong with the artifacts themselves.

    ``fatal`` means the run cannot be judged at all (``verify`` exits 2); a ``warning`` is shown
    but the criteria still decide.
    """

    severity: Severity
    message: str
    ref: EvidenceRef | None = None


def quote(text: str) -> str:
    return text if len(text) <= MAX_QUOTE_CHARS else text[: MAX_QUOTE_CHARS - 1] + "…"


def display_path(path: Path, run_dir: Path) -> str:
    """``path`` relative to the run directory when inside it, else as given (absolute)."""
    try:
        return path.relative_to(run_dir).as_posix()
    except ValueError:
        return path.as_posix()


def absent(file: str, what: str = "absent") -> EvidenceRef:
    """A reference to a file that is not there (absence is evidence too)."""
    return EvidenceRef(file, None, f"({what})")


def iter_raw_lines(f: BinaryIO) -> Iterator[bytes]:
    """Lines of a binary stream without their ``\\n``; each capped at ``MAX_LINE_BYTES``.

    Reads fixed-size chunks, so neither a huge file nor a huge newline-free line is held in
    memory. A last line without a newline (a writer killed mid-line) is yielded as it is.
    """
    head = b""
    while chunk := f.read(_CHUNK_BYTES):
        parts = chunk.split(b"\n")
        if len(parts) == 1:
            if len(head) < MAX_LINE_BYTES:
                head += chunk[: MAX_LINE_BYTES - len(head)]
            continue
        if len(head) < MAX_LINE_BYTES:
            head += parts[0][: MAX_LINE_BYTES - len(head)]
        yield head
        last = len(parts) - 1
        for i in range(1, last):
            part = parts[i]
            yield part if len(part) <= MAX_LINE_BYTES else part[:MAX_LINE_BYTES]
        head = parts[last][:MAX_LINE_BYTES]
    if head:
        yield head


def decode_line(raw: bytes) -> str:
    text = raw.decode("utf-8", "replace")
    return text[:-1] if text.endswith("\r") else text


def iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` for each line of a file, streamed (see :func:`iter_raw_lines`)."""
    with path.open("rb") as f:
        for lineno, raw in enumerate(iter_raw_lines(f), start=1):
            yield lineno, decode_line(raw)


def split_rank_prefix(text: str) -> tuple[int | None, str]:
    """Split NVRx's per-cycle-log rank prefix (``"0: "``, ``"12: "``) from a line.

    Lines without a prefix (interleaved output, continuation lines) come back with rank None.
    """
    colon = text.find(": ", 0, 8)
    if colon > 0:
        head = text[:colon].strip()
        if head.isdigit():
            return int(head), text[colon + 2 :]
    return None, text


class LineCursor:
    """The line a parser is looking at; turned into an :class:`EvidenceRef` only on a match.

    One mutable cursor per file keeps the per-line cost of the hot loop down: an adapter calls
    :meth:`ref` only for the few lines it recognises.
    """

    __slots__ = ("file", "lineno", "raw", "tz")

    def __init__(self, file: str, tz: tzinfo = UTC) -> None:
        self.file = file
        self.lineno = 0
        self.raw = ""
        # The zone the workload's naive timestamps are in (derived from the launcher log).
        self.tz = tz

    def ref(self) -> EvidenceRef:
        return EvidenceRef(self.file, self.lineno, quote(self.raw))

    def local_time(self, text: str) -> datetime | None:
        """A naive ``YYYY-MM-DD HH:MM:SS[.ffffff]`` stamp in the run host's zone, as UTC."""
        try:
            return datetime.fromisoformat(text).replace(tzinfo=self.tz).astimezone(UTC)
        except ValueError:
            return None


def parse_iso_utc(value: object, assume: tzinfo = UTC) -> datetime | None:
    """An ISO-8601 time (``Z``, offset or naive in ``assume``) as an aware UTC datetime."""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=assume)
    return parsed.astimezone(UTC)


def seconds_between(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return round((end - start) / timedelta(seconds=1), 3)


@dataclass(frozen=True, slots=True)
class JsonFile:
    """A small JSON document with the line of each top-level key, for quoting."""

    data: object
    key_lines: dict[str, tuple[int, str]]


MAX_JSON_BYTES = 1 << 20


def read_json_file(path: Path) -> JsonFile:
    """Parse a small JSON file; raises ``ValueError`` saying what is wrong with it.

    Line numbers of keys come from a plain text scan (``"key":``) because ``json`` keeps none;
    good enough for the flat objects NVRx, the injector and the manifest write.
    """
    size = path.stat().st_size
    if size > MAX_JSON_BYTES:
        raise ValueError(f"{size} bytes, too large for a JSON record")
    raw = path.read_bytes()
    if not raw.strip():
        raise ValueError("empty file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    key_lines: dict[str, tuple[int, str]] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith('"'):
            end = stripped.find('"', 1)
            if end > 0 and stripped[end + 1 :].lstrip().startswith(":"):
                key_lines.setdefault(stripped[1:end], (lineno, quote(line)))
    return JsonFile(data, key_lines)


def json_key_ref(file: str, doc: JsonFile, key: str) -> EvidenceRef:
    """Reference to the line holding ``key`` in a JSON file (the whole file if not found)."""
    found = doc.key_lines.get(key)
    if found is None:
        return EvidenceRef(file, None, f"(no {key!r} key)")
    return EvidenceRef(file, found[0], found[1])
