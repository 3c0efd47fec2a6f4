"""Evidence references and the streaming line reader every parser uses.

Every fact a parser extracts carries an :class:`EvidenceRef` (file relative to the run directory,
1-based line, the raw line) so that a verdict can quote the line that proves it. Logs can be many
gigabytes, truncated by a kill, or contain junk: :func:`iter_lines` reads them in bounded chunks,
caps overlong lines and decodes each line with ``errors="replace"``.

A run directory is untrusted input. Every read goes through :func:`open_regular`: a FIFO, device,
socket or directory where a file is expected is refused before it is read (opened, if at all,
with ``O_NONBLOCK`` so that nothing blocks), and so is a symlink leaving the directory the file
belongs to. Whole-file reads are capped (:func:`read_capped`), and a message shows what a file
holds through the one :func:`~pytest_nvrx.settings.values.quote` (a ``repr``, cut short).
"""

from __future__ import annotations

import errno
import html
import json
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from pathlib import Path
from typing import BinaryIO, Literal

from pytest_nvrx.settings.values import finite_float, quote

# A longer line keeps its head; the rest of it is skipped (a file of NUL bytes has no newline).
MAX_LINE_BYTES = 64 * 1024
# How much of a line a reference keeps: enough to quote, bounded for memory.
MAX_REF_CHARS = 400
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
        text = self.text if width is None else clip_line(self.text, width)
        return f"{self.location}: {text}"

    def __str__(self) -> str:
        return self.render()


@dataclass(frozen=True, slots=True)
class Instant:
    """A stamp in the evidence, a recovery's milestone among them: when it was (None: the
    evidence does not show it) and the line that shows it."""

    time: datetime | None
    ref: EvidenceRef | None = None


#: What a log with no stamped line has for its first, last, earliest and latest stamp.
NO_INSTANT = Instant(None)


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


def clip_line(text: str, limit: int = MAX_REF_CHARS) -> str:
    """A line as a reference keeps it: at most ``limit`` characters, "…" last where it is cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


# C0 controls but tab, DEL, C1 controls: what a terminal obeys rather than shows; and what
# reorders or breaks a line on a terminal without being a control: bidi marks, embeddings,
# overrides and isolates, line and paragraph separators
_TRICKS = "\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029"
_CONTROL = re.compile(f"[\\x00-\\x08\\x0a-\\x1f\\x7f-\\x9f{_TRICKS}]")
_CONTROL_BUT_NEWLINE = re.compile(f"[\\x00-\\x08\\x0b-\\x1f\\x7f-\\x9f{_TRICKS}]")


def _escaped(m: re.Match[str]) -> str:
    code = ord(m[0])
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, *, lines: bool = False) -> str:
    """Text from a judged run as it may reach a terminal: control characters shown escaped
    (``\\x1b``, ``\\x0d``), so that a log line cannot clear the screen, retitle the window or
    overwrite a FAIL line with "PASSED". Used where text leaves for a terminal or JUnit (verify,
    report's console, the plugin's lines, sections and properties); JSON outputs keep the exact
    text. ``lines``: keep ``\\n`` (text of several lines that we joined)."""
    return (_CONTROL_BUT_NEWLINE if lines else _CONTROL).sub(_escaped, text)


def html_text(text: str, quote: bool = True) -> str:
    """Text from a judged run as it goes into an HTML page: :func:`printable` (a terminal escape
    in a log line shows as ``\\x1b``, never as a raw byte someone may ``cat`` or copy into a
    terminal), then ``html.escape``; newlines kept."""
    return html.escape(printable(text, lines=True), quote)


#: What a full disk or an exhausted quota makes a write say (ENOSPC, EDQUOT), as the launcher
#: and the workers log it: a run that says it lost writes to it.
DISK_FULL_WORDS = tuple(os.strerror(code) for code in (errno.ENOSPC, errno.EDQUOT))


def says_disk_full(text: str) -> str | None:
    """The words of :data:`DISK_FULL_WORDS` that ``text`` holds, None when none."""
    return next((words for words in DISK_FULL_WORDS if words in text), None)


class RefusedFile(OSError):
    """A path that is not read as evidence; the message says why, naming the path."""


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISREG, "a regular file"),
)


def file_kind(mode: int) -> str:
    """``"a FIFO"``, ``"a directory"``, ...: what ``stat`` says a path is."""
    return next((name for test, name in _KINDS if test(mode)), "a special file")


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def file_refusal(path: Path, root: Path | None = None, *, want_dir: bool = False) -> str | None:
    """Why ``path`` cannot be read as evidence, or None when it can be (or does not exist).

    Refused: anything but a regular file (a directory with ``want_dir``), a symlink to nothing,
    a path whose real location lies outside ``root``, through a symlink at any component (a
    file of the run must not be another user's file), and a directory that cannot be listed or
    searched (its permissions: its files cannot be read, and absence is no evidence). Only
    ``stat`` is used on a file: nothing is opened, so a FIFO or device has no effect; only a
    directory is opened (``O_DIRECTORY``).
    The reason is a phrase to put after the path ("is a FIFO, not a regular file").
    """
    try:
        link = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None  # absent (a parent that is not a directory is reported as itself)
    except OSError as exc:
        return f"cannot be examined ({exc.strerror})"
    st = link
    if stat.S_ISLNK(link.st_mode):
        try:
            st = os.stat(path)
        except OSError as exc:
            return f"is a symlink to nothing usable ({exc.strerror})"
    if root is not None:
        # every component, not only the last: a folder of the run symlinked out of it makes each
        # file under it another user's file as much as a symlinked file does
        target = os.path.realpath(path)
        if not _inside(target, os.path.realpath(root)):
            if stat.S_ISLNK(link.st_mode):
                return f"is a symlink leaving {root.name or root}/ (to {quote(target)})"
            return (
                f"is reached through a symlinked folder leaving {root.name or root}/"
                f" (it is {quote(target)})"
            )
    if want_dir:
        if not stat.S_ISDIR(st.st_mode):
            return f"is {file_kind(st.st_mode)}, not a directory"
        return _unreadable_dir(path)
    if stat.S_ISREG(st.st_mode):
        return None
    return f"is {file_kind(st.st_mode)}, not a regular file"


def _unreadable_dir(path: Path) -> str | None:
    """Why the directory cannot be listed (no read permission) or its entries examined (no
    search permission), None when both work."""
    try:
        with os.scandir(path):
            pass
        os.stat(os.path.join(path, os.curdir))
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    return None


_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)


def open_regular(path: Path, root: Path | None = None, *, shown: str | None = None) -> BinaryIO:
    """Open a regular file for reading; raise :class:`RefusedFile` for anything else.

    Checked before opening (:func:`file_refusal`, so a device is never opened) and again on the
    open descriptor (``O_NONBLOCK`` + ``fstat``), so a path swapped for a FIFO in between
    cannot block the reader. ``shown`` is the name the message uses (default: the path).
    """
    name = shown if shown is not None else str(path)
    why = file_refusal(path, root)
    if why is not None:
        raise RefusedFile(f"{name} {why}")
    fd = os.open(path, _OPEN_FLAGS)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise RefusedFile(f"{name} is {file_kind(mode)}, not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


class FileTooLarge(ValueError):
    """A file over the read cap of its kind."""

    def __init__(self, name: str, size: int, limit: int) -> None:
        super().__init__(f"{name} is {size} bytes, over the {limit}-byte cap")
        self.size = size
        self.limit = limit


def read_capped(
    path: Path, limit: int, root: Path | None = None, *, shown: str | None = None
) -> bytes:
    """A regular file's bytes; :class:`FileTooLarge` for one longer than ``limit``.

    Reads at most ``limit + 1`` bytes whatever ``stat`` claimed, so a file that grows meanwhile
    costs no more memory than the cap.
    """
    with open_regular(path, root, shown=shown) as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read(limit + 1)
    if size > limit or len(data) > limit:
        raise FileTooLarge(shown if shown is not None else str(path), max(size, len(data)), limit)
    return data


def display_path(path: Path, run_dir: Path) -> str:
    """``path`` relative to the run directory when inside it, else as given (absolute)."""
    try:
        return path.relative_to(run_dir).as_posix()
    except ValueError:
        return path.as_posix()


def absent(file: str, what: str = "absent") -> EvidenceRef:
    """A reference to a file that is not there (absence is evidence too)."""
    return EvidenceRef(file, None, f"({what})")


def iter_raw_line_batches(f: BinaryIO) -> Iterator[list[bytes]]:
    """Lines of a binary stream without their ``\\n``, a list per chunk read; each line capped at
    ``MAX_LINE_BYTES``.

    Reads fixed-size chunks, so neither a huge file nor a huge newline-free line is held in
    memory. A last line without a newline (a writer killed mid-line) is given as it is. A list
    per chunk spares a hot loop one generator step per line.
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
        last = len(parts) - 1
        parts[0] = head
        head = parts[last][:MAX_LINE_BYTES]
        del parts[last]
        if max(map(len, parts)) > MAX_LINE_BYTES:  # rare: a per-line loop only then
            parts = [part[:MAX_LINE_BYTES] for part in parts]
        yield parts
    if head:
        yield [head]


def iter_raw_lines(f: BinaryIO) -> Iterator[bytes]:
    """Lines of a binary stream without their ``\\n``; each capped at ``MAX_LINE_BYTES``
    (see :func:`iter_raw_line_batches`)."""
    for batch in iter_raw_line_batches(f):
        yield from batch


def decode_line(raw: bytes) -> str:
    text = raw.decode("utf-8", "replace")
    return text[:-1] if text.endswith("\r") else text


def iter_lines(path: Path, root: Path | None = None) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` for each line of a file, streamed (see :func:`iter_raw_lines`).

    Raises :class:`RefusedFile` (an ``OSError``) for anything but a regular file.
    """
    with open_regular(path, root) as f:
        for lineno, raw in enumerate(iter_raw_lines(f), start=1):
            yield lineno, decode_line(raw)


def split_rank_prefix(text: str) -> tuple[int | None, str]:
    """Split NVRx's per-cycle-log rank prefix (``"0: "``, ``"12: "``) from a line.

    Lines without a prefix (interleaved output, continuation lines) come back with rank None.
    Only ASCII digits are a prefix (:func:`is_ascii_number`): NVRx writes no other, and
    ``str.isdigit`` alone accepts ``'²'``, which ``int()`` refuses.
    """
    colon = text.find(": ", 0, 8)
    if colon > 0:
        head = text[:colon].strip()
        if is_ascii_number(head):
            return int(head), text[colon + 2 :]
    return None, text


#: The most digits a number read from a run's files may have. Every count a run writes (an
#: iteration, consumed samples, a pid, an exit code, a cycle, a rank) fits in 64 bits, 19
#: digits; a longer one is no count a run wrote, and ``int()`` of thousands of digits is
#: refused (past 4300) or slow. Its line cannot be read: the run cannot be judged by it.
MAX_DIGITS = 20
# any script's digits, as the parsers' patterns read numbers (\d)
_LONG_NUMBER = re.compile(f"\\d{{{MAX_DIGITS + 1},}}")
# a digit of another script (Arabic-Indic, Devanagari, fullwidth...): the parsers' \d reads it
_FOREIGN_DIGIT = re.compile(r"(?![0-9])\d")


class UnreadableNumber(ValueError):
    """A number in a line a parser reads that is no count a run writes: the line's event is
    dropped and the run cannot be judged by it (the caller records the line)."""


class NumberTooLong(UnreadableNumber):
    """A number of more than :data:`MAX_DIGITS` digits in a line a parser reads."""

    def __init__(self, digits: int) -> None:
        super().__init__(f"a number of {digits} digits (a run's counts have at most {MAX_DIGITS})")


class ForeignDigits(UnreadableNumber):
    """A number written in digits other than ASCII 0-9. Python, NVRx, Megatron and the
    reference workload print numbers in ASCII only, and the tracker reader
    (:mod:`pytest_nvrx.evidence.tracker`) refuses any other: a log parser reading
    ``'\u0666'`` as 6 would take a line no run printed as evidence."""

    def __init__(self, text: str) -> None:
        super().__init__(f"a number in digits other than ASCII 0-9 ({quote(text[:MAX_DIGITS])})")


def is_ascii_number(text: str) -> bool:
    """Whether ``text`` is ASCII digits only (``str.isdigit`` alone accepts any script's and
    superscripts, which ``int()`` reads or refuses)."""
    return text.isascii() and text.isdigit()


def read_int(text: str) -> int:
    """The one reader of a number in a run's text (a pattern's ``\\d+``, an optional sign):
    :class:`NumberTooLong` past :data:`MAX_DIGITS` digits, :class:`ForeignDigits` for any digit
    but ASCII 0-9, both checked before ``int()`` is asked."""
    digits = len(text) - (text[:1] in "+-")
    if digits > MAX_DIGITS:
        raise NumberTooLong(digits)
    if not text.isascii():
        raise ForeignDigits(text)
    return int(text)


def read_float(text: str) -> float:
    """A float of a run's text (a loss, a duration): ``float()`` of ASCII only
    (:class:`ForeignDigits` else); ValueError for text that is no float."""
    if not text.isascii():
        raise ForeignDigits(text)
    return float(text)


def read_loss(text: str) -> float | None:
    """A loss as a workload prints it: None for text no float reads ('nan' reads),
    :class:`ForeignDigits` for digits other than ASCII 0-9."""
    try:
        return read_float(text)
    except UnreadableNumber:
        raise
    except ValueError:
        return None


def read_deadline(text: str) -> float | None:
    """A deadline as printed (an NVRx section timeout): a finite float of ASCII text, else
    None (``float()`` reads any script's digits, and 'nan' and 'inf')."""
    return finite_float(text) if text.isascii() else None


def check_numbers(text: str) -> str:
    """``text`` when no run of digits in it is longer than :data:`MAX_DIGITS` and every digit
    is ASCII 0-9, else :class:`UnreadableNumber`: for a line whose numbers are read again
    later, as text."""
    found = _LONG_NUMBER.search(text)
    if found is not None:
        raise NumberTooLong(len(found[0]))
    if not text.isascii():
        foreign = _FOREIGN_DIGIT.search(text)
        if foreign is not None:
            raise ForeignDigits(text[foreign.start() :])
    return text


class LineCursor:
    """The line a parser is looking at; turned into an :class:`EvidenceRef` only on a match.

    One mutable cursor per file keeps the per-line cost of the hot loop down: an adapter calls
    :meth:`ref` only for the few lines it recognises.
    """

    __slots__ = ("bad_number", "bad_stamp", "file", "lineno", "raw", "tz")

    def __init__(self, file: str, tz: tzinfo = UTC) -> None:
        self.file = file
        self.lineno = 0
        self.raw = ""
        # The zone the workload's naive timestamps are in (derived from the launcher log).
        self.tz = tz
        # The first line whose stamp is no time (impossible, or outside TIME_RANGE): the
        # caller makes it "cannot judge" (a run's clock never reads such a time).
        self.bad_stamp: EvidenceRef | None = None
        # The first line a parser recognised but could not read for a number longer than
        # MAX_DIGITS or in digits other than ASCII 0-9 (UnreadableNumber): the caller makes
        # it "cannot judge".
        self.bad_number: EvidenceRef | None = None

    def ref(self) -> EvidenceRef:
        return EvidenceRef(self.file, self.lineno, clip_line(self.raw))

    def unreadable_number(self) -> None:
        """The line at the cursor holds a number past :data:`MAX_DIGITS` (its event dropped)."""
        if self.bad_number is None or (self.bad_number.line or 0) > self.lineno:
            self.bad_number = self.ref()

    def _unusable(self) -> None:
        if self.bad_stamp is None or (self.bad_stamp.line or 0) > self.lineno:
            self.bad_stamp = self.ref()

    def local_time(self, text: str) -> datetime | None:
        """A naive ``YYYY-MM-DD HH:MM:SS[.ffffff]`` stamp in the run host's zone, as UTC; None
        (and :attr:`bad_stamp` set) for a stamp no clock reads."""
        parsed = parse_time(text)
        if parsed is None:
            self._unusable()
            return None
        return parsed.replace(tzinfo=self.tz).astimezone(UTC)

    def aware_time(self, text: str) -> datetime | None:
        """A stamp with its offset, as UTC; None (and :attr:`bad_stamp` set) for one no clock
        reads or one without an offset."""
        parsed = parse_time(text)
        if parsed is None or parsed.tzinfo is None:
            self._unusable()
            return None
        return parsed.astimezone(UTC)


#: The years a run's clock can read (``FIRST_YEAR <= year < END_YEAR``). A stamp outside them
#: (year 1, year 9999) is no reading: it is refused where it is parsed, so that no zone
#: conversion or slack (``t - CLOCK_SLACK``) downstream can overflow.
FIRST_YEAR = 1970
END_YEAR = 2200
TIME_RANGE = f"{FIRST_YEAR}..{END_YEAR - 1}"


def time_in_range(value: datetime) -> bool:
    """Whether a parsed time (naive or aware) lies in the years a run's clock can read."""
    return FIRST_YEAR <= value.year < END_YEAR


def parse_time(text: str) -> datetime | None:
    """``datetime.fromisoformat``, None for an impossible time or one outside :data:`TIME_RANGE`
    (naive or aware, as written)."""
    try:
        parsed = datetime.fromisoformat(text)
    except (ValueError, OverflowError):
        return None
    return parsed if time_in_range(parsed) else None


def parse_iso_utc(value: object, assume: tzinfo = UTC) -> datetime | None:
    """An ISO-8601 time (``Z``, offset or naive in ``assume``) as an aware UTC datetime."""
    if not isinstance(value, str):
        return None
    parsed = parse_time(value.strip())
    if parsed is None:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=assume)
    return parsed.astimezone(UTC)


def seconds_between(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    try:
        return round((end - start) / timedelta(seconds=1), 3)
    except OverflowError:  # times not parsed by parse_time: no measurement
        return None


@dataclass(frozen=True, slots=True)
class JsonFile:
    """A small JSON document with the line of each top-level key, for quoting."""

    data: object
    key_lines: dict[str, tuple[int, str]]


MAX_JSON_BYTES = 1 << 20
#: The deepest nesting a JSON record may have (NVRx's, the injector's and our records are 3
#: deep): ``json`` recurses once per level and a ``'[' * 100000`` would exhaust the stack.
MAX_JSON_DEPTH = 64
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_JSON_BRACKET = re.compile(r"[\[\]{}]")


def json_depth(text: str) -> int:
    """How deep ``text``'s brackets nest, strings left out (``json`` never has to recurse)."""
    depth = deepest = 0
    for m in _JSON_BRACKET.finditer(_JSON_STRING.sub("", text)):
        if m[0] in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


class RepeatedKey(ValueError):
    """A JSON object naming one key twice: ``json`` would keep the last value silently, while
    a reader quoting the key's line would show the first, so the record contradicts itself (no
    writer of the records read here, ``json.dumps`` or NVRx, ever repeats a key)."""

    def __init__(self, key: str) -> None:
        super().__init__(
            f"key {quote(key)} given twice in one object: the record contradicts itself"
        )
        self.key = key


def _object_once(pairs: list[tuple[str, object]]) -> dict[str, object]:
    obj: dict[str, object] = {}
    for key, value in pairs:
        if key in obj:
            raise RepeatedKey(key)
        obj[key] = value
    return obj


def parse_json(text: str) -> object:
    """``json.loads`` for untrusted text (already size-capped by its reader): ``ValueError``
    saying what is wrong for malformed JSON, nesting deeper than :data:`MAX_JSON_DEPTH`, or a
    number ``int`` refuses; never a ``RecursionError``."""
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise ValueError(f"nested {depth} deep, deeper than {MAX_JSON_DEPTH}: not a record")
    try:
        return json.loads(text, object_pairs_hook=_object_once)
    except RepeatedKey:
        raise
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except (ValueError, RecursionError) as exc:  # a 5000-digit integer; a deep unclosed string
        raise ValueError(f"not usable JSON ({quote(str(exc))})") from None


def read_json_file(path: Path, root: Path | None = None, *, shown: str | None = None) -> JsonFile:
    """Parse a small JSON file; raises ``ValueError`` saying what is wrong with it.

    Raises :class:`RefusedFile` (an ``OSError`` whose message names the file as ``shown``) for
    anything but a regular file or for a symlink leaving ``root``. Line numbers of keys come
    from a plain text scan (``"key":``) because ``json`` keeps none; good enough for the flat
    objects NVRx, the injector and the manifest write.
    """
    try:
        raw = read_capped(path, MAX_JSON_BYTES, root, shown=shown)
    except FileTooLarge as exc:
        raise ValueError(f"{exc.size} bytes, too large for a JSON record") from None
    if not raw.strip():
        raise ValueError("empty file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    key_lines: dict[str, tuple[int, str]] = {}
    repeats: dict[str, list[tuple[int, str]]] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith('"'):
            end = stripped.find('"', 1)
            if end > 0 and stripped[end + 1 :].lstrip().startswith(":"):
                key = stripped[1:end]
                key_lines.setdefault(key, (lineno, clip_line(line)))
                repeats.setdefault(key, []).append((lineno, clip_line(line)))
    try:
        data = parse_json(text)
    except RepeatedKey as exc:
        # quote every line naming the key, so both values the file states are shown
        where = "; ".join(f"line {n}: {quote(t.strip())}" for n, t in repeats.get(exc.key, [])[:4])
        raise ValueError(f"{exc}{f' ({where})' if where else ''}") from None
    return JsonFile(data, key_lines)


def json_key_ref(file: str, doc: JsonFile, key: str) -> EvidenceRef:
    """Reference to the line holding ``key`` in a JSON file (the whole file if not found)."""
    found = doc.key_lines.get(key)
    if found is None:
        return EvidenceRef(file, None, f"(no {key!r} key)")
    return EvidenceRef(file, found[0], found[1])
