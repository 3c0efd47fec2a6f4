"""The streaming line reader and small helpers every parser relies on."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from pytest_nvrx.evidence import refs
from pytest_nvrx.evidence.refs import (
    EvidenceRef,
    iter_lines,
    iter_raw_lines,
    read_json_file,
    split_rank_prefix,
)


def raw_lines(
    data: bytes, chunk: int | None = None, monkeypatch: pytest.MonkeyPatch | None = None
) -> list[bytes]:
    if chunk is not None and monkeypatch is not None:
        monkeypatch.setattr(refs, "_CHUNK_BYTES", chunk)
    return list(iter_raw_lines(io.BytesIO(data)))


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 1 << 20])
def test_raw_lines_split_like_splitlines_for_any_chunk_size(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = b"a\nbb\n\nccc\r\nlast-without-newline"
    assert raw_lines(data, chunk, monkeypatch) == [
        b"a",
        b"bb",
        b"",
        b"ccc\r",
        b"last-without-newline",
    ]


def test_raw_lines_empty_and_newline_only() -> None:
    assert raw_lines(b"") == []
    assert raw_lines(b"\n") == [b""]
    assert raw_lines(b"x\n") == [b"x"]


@pytest.mark.parametrize("chunk", [5, 1 << 20])
def test_overlong_lines_are_capped_and_count_as_one_line(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(refs, "MAX_LINE_BYTES", 8)
    data = b"short\n" + b"x" * 50 + b"\nafter\n" + b"\0" * 30  # NUL tail without newline
    lines = raw_lines(data, chunk, monkeypatch)
    assert lines == [b"short", b"x" * 8, b"after", b"\0" * 8]


def test_iter_lines_decodes_junk_and_strips_crlf(tmp_path: Path) -> None:
    path = tmp_path / "junk.log"
    path.write_bytes(b"ok line\r\n\xff\xfe binary \x00 junk\n0: tail cut mid-li")
    got = list(iter_lines(path))
    assert got[0] == (1, "ok line")
    assert got[1][0] == 2 and "\ufffd" in got[1][1] and "junk" in got[1][1]
    assert got[2] == (3, "0: tail cut mid-li")


def test_iter_lines_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.log"
    path.write_bytes(b"")
    assert list(iter_lines(path)) == []


@pytest.mark.parametrize(
    ("line", "rank", "body"),
    [
        ("0: hello", 0, "hello"),
        ("12: a: b", 12, "a: b"),
        ("0:  [2026-11-29 11:03:47] iteration", 0, " [2026-11-29 11:03:47] iteration"),
        (" 3: padded", 3, "padded"),
        ("unprefixed line", None, "unprefixed line"),
        ("WARNING: not a rank", None, "WARNING: not a rank"),
        ("[rank0]: Traceback", None, "[rank0]: Traceback"),
        ("", None, ""),
    ],
)
def test_split_rank_prefix(line: str, rank: int | None, body: str) -> None:
    assert split_rank_prefix(line) == (rank, body)


def test_evidence_ref_renders_file_line_text() -> None:
    assert EvidenceRef("logs/a.log", 12, "text").render() == "logs/a.log:12: text"
    assert (
        EvidenceRef("fault_injected.json", None, "(absent)").render()
        == "fault_injected.json: (absent)"
    )
    assert EvidenceRef("f", 1, "x" * 50).render(width=10) == "f:1: xxxxxxxxx…"


def test_json_key_lines(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text('{\n  "fault": "kill",\n  "rank": 0\n}\n')
    doc = read_json_file(path)
    assert doc.key_lines["rank"] == (3, '  "rank": 0')


@pytest.mark.parametrize(
    ("content", "why"),
    [(b"", "empty"), (b"{not json", "not JSON"), (b"\xff\xfe", "not UTF-8"), (b"   \n", "empty")],
)
def test_json_errors_say_what_is_wrong(tmp_path: Path, content: bytes, why: str) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=why):
        read_json_file(path)
