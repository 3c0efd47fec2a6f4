"""Hostile run directories (issue #22 items 5 and 6): JSON nested to exhaust the stack, times no
clock reads, and log lines that would drive a terminal.

* every JSON record is read depth-bounded (:data:`~pytest_nvrx.evidence.refs.MAX_JSON_DEPTH`)
  and size-capped: ``'[' * 100000`` in the marker, run.json, result.json or a cycle record
  makes the run "cannot judge" (exit 2) naming the file and why;
* every parsed time lies in 1970..2199: a marker, manifest or cycle-record time outside, or a
  log line stamped outside (or with an impossible date), is "cannot judge" naming the field or
  the line; no OverflowError in verify, report or the plugin;
* control characters of the run's text reach a terminal or JUnit escaped (``\\x1b``); the JSON
  outputs keep the exact text.

Each case doctors a copy of a committed real run (tests/helpers/doctor.py); each fails on the code
before these items (a RecursionError or OverflowError traceback, or raw ESC bytes printed).
"""

from __future__ import annotations

import html
import io
import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_nvrx.evidence.refs import MAX_JSON_DEPTH, parse_json, printable
from pytest_nvrx.report.main import report_main
from pytest_nvrx.verify import verify_main
from tests.helpers.doctor import LAUNCHER, MARKER, Doctor, copy_run

pytest_plugins = ["pytester"]

DATA = Path(__file__).parents[1] / "data"
REF_KILL_SAVE = DATA / "windows" / "cpu" / "ref-kill-save"
MEGATRON_KILL = DATA / "gpu-continuity" / "g2-kill-30"
SUITE_ARGS = ["--pyargs", "pytest_nvrx.suite", "-p", "no:cacheprovider"]
CYCLE_RECORD = "cycle_infos/cycle_info..0.0"
CYCLE1 = "logs/train_cycle1.log"
# what a hostile log line carries: retitle the window, clear the screen, return the carriage
HOSTILE = "\x1b]0;owned\x07\x1b[2J\rverify: PASSED (6 of 6)"
SHOWN = "\\x1b]0;owned\\x07\\x1b[2J\\x0dverify: PASSED (6 of 6)"
# ref-kill-save's first replayed iteration line (training_continuity quotes it)
REPLAYED = (
    "0: [ref] 2026-11-30T16:22:18.385+00:00 rank 0 iteration 6/20 consumed_samples 24"
    " loss 4.945107460021973 lr 0.009397114317029975 grad_norm 0.5321506261825562"
)


def verify(run: Path, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = verify_main([str(run), *argv], out, err)
    return status, out.getvalue(), err.getvalue()


def report(run: Path, tmp_path: Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    html = tmp_path / "out" / "report.html"
    html.parent.mkdir(exist_ok=True)
    status = report_main([str(run), "-o", str(html)], out, err)
    assert html.is_file(), err.getvalue()
    return status, out.getvalue(), err.getvalue()


@pytest.fixture
def ref_run(tmp_path: Path) -> Doctor:
    return copy_run(REF_KILL_SAVE, tmp_path / "run")


# -- item 5: JSON nested too deep ------------------------------------------------------------

DEEP = ["[" * 100_000, '{"a": ' * 100_000]


@pytest.mark.parametrize("text", DEEP, ids=["arrays", "objects"])
@pytest.mark.parametrize("rel", [MARKER, "run.json", "result.json"])
def test_a_record_nested_too_deep_cannot_be_judged(
    ref_run: Doctor, tmp_path: Path, rel: str, text: str
) -> None:
    ref_run.path(rel).write_text(text)
    status, _, err = verify(ref_run.root)
    assert status == 2, err
    assert rel in err and f"deeper than {MAX_JSON_DEPTH}" in err
    status, _, err = report(ref_run.root, tmp_path)
    assert status == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("[" * 100_000, "nested 100000 deep"),
        ('{"cycle_number": 1, "cycle_start', "not JSON"),
        ("[1, 2]", "a JSON list, not an object"),
    ],
    ids=["too-deep", "truncated", "a-list"],
)
def test_an_unreadable_cycle_record_cannot_be_judged(
    ref_run: Doctor, tmp_path: Path, text: str, why: str
) -> None:
    """NVRx writes each record whole (temp name, rename): one that is no JSON object is not the
    launcher's record (as test_cycle_infos_refuse_junk_and_skip_symlinks)."""
    ref_run.path(CYCLE_RECORD).write_text(text)
    status, _, err = verify(ref_run.root)
    assert status == 2, err
    assert f"cycle record {CYCLE_RECORD} unreadable: " in err and why in err
    status, _, err = report(ref_run.root, tmp_path)
    assert status == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    ("key", "value", "shown"),
    [
        ("cycle_number", "NaN", "the number nan"),
        ("cycle_number", '"0"', "the string '0'"),
        ("cycle_number", "false", "the boolean false"),
        ("cycle_number", "1", "the number 1"),
        ("cycle_number", "0.0", "the number 0.0"),
        ("attempt_index", "Infinity", "the number inf"),
        ("attempt_index", "null", "null"),
    ],
)
def test_a_cycle_record_numbered_otherwise_than_its_name_cannot_be_judged(
    ref_run: Doctor, key: str, value: str, shown: str
) -> None:
    """NVRx names each record after the numbers it holds: a NaN cycle_number fell back to the
    file name and passed 6/6 (the adversarial sweep of #22)."""
    ref_run.replace(CYCLE_RECORD, f'"{key}": 0', f'"{key}": {value}', 1)
    status, _, err = verify(ref_run.root)
    assert status == 2, err
    named = f"cycle record {CYCLE_RECORD}: {key} is {shown} but its name says 0"
    assert named in err and "which cycle it records is unknown" in err, err


def test_parse_json_bounds() -> None:
    nested = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert parse_json(nested) is not None
    # brackets inside strings are text, not nesting
    assert parse_json(json.dumps({"a": "[" * 1000 + '\\"{'})) == {"a": "[" * 1000 + '\\"{'}
    for bad, why in [
        ("[" + nested + "]", "deeper than"),
        ("1" * 5000, "not usable JSON"),
        ("[1,", "not JSON"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_json(bad)


# -- item 5: times no clock reads ------------------------------------------------------------


@pytest.mark.parametrize(
    ("rel", "key", "value"),
    [
        (MARKER, "time", "0001-01-01T00:00:00+00:00"),
        (MARKER, "time", "0001-01-01T00:30:00+01:00"),
        (MARKER, "time", "9999-12-31T23:59:59-05:00"),
        (MARKER, "time", "9999-12-31T23:59:59+00:00"),
        ("result.json", "start_time", "0001-01-01T00:00:00+00:00"),
        ("result.json", "end_time", "9999-12-31T23:59:59+00:00"),
        ("run.json", "start_time", "0001-01-01T00:00:00Z"),
    ],
)
def test_a_record_time_out_of_range_cannot_be_judged(
    ref_run: Doctor, tmp_path: Path, rel: str, key: str, value: str
) -> None:
    ref_run.set_json(rel, **{key: value})
    status, _, err = verify(ref_run.root)
    assert status == 2, err
    assert f"{key!r} is out of range (the string {value!r}): a run's clock reads 1970..2199" in err
    status, _, err = report(ref_run.root, tmp_path)
    assert status == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    ("rel", "old", "new", "said"),
    [
        (CYCLE_RECORD, "2026-11-30T16:22:04.914203Z", "0001-01-01T00:00:00Z", "holds no usable"),
        (CYCLE_RECORD, "2026-11-30T16:22:11.250413Z", "9999-12-31T23:59:59Z", "holds no usable"),
        (CYCLE_RECORD, '"2026-11-30T16:22:11.250413Z"', "1764519731", "holds no usable"),
        (LAUNCHER, "2026-11-30 16:22:23,960", "9999-12-31 23:59:59,960", "is stamped with no"),
        (LAUNCHER, "2026-11-30 16:22:04,824", "0001-01-01 00:00:00,824", "is stamped with no"),
        (LAUNCHER, "2026-11-30 16:22:04,824", "2026-02-30 16:22:04,824", "is stamped with no"),
        (LAUNCHER, "Time: 2026-11-30 16:22:11", "Time: 9999-11-30 16:22:11", "is stamped with"),
        (CYCLE1, "16:22:18.170+00:00 rank 0 load", "16:22:78.170+00:00 rank 0 load", "stamped"),
    ],
    ids=[
        "record-start-year-1",
        "record-end-year-9999",
        "record-end-a-number",
        "launcher-year-9999",
        "launcher-year-1",
        "launcher-feb-30",
        "launcher-profiling-utc",
        "load-line-second-78",
    ],
)
def test_a_log_or_cycle_stamp_out_of_range_cannot_be_judged(
    ref_run: Doctor, tmp_path: Path, rel: str, old: str, new: str, said: str
) -> None:
    """A stamp no clock reads, like an impossible date, leaves the run's clocks unchecked: exit
    2 naming the line (criteria/clocks.py), and no traceback from verify or report."""
    ref_run.replace(rel, old, new, 1)
    status, _, err = verify(ref_run.root)
    assert status == 2 and said in err, err
    status, _, err = report(ref_run.root, tmp_path)
    assert status in (0, 1) and "Traceback" not in err


def test_a_tracker_reading_stamped_out_of_range_cannot_be_judged(tmp_path: Path) -> None:
    ref = copy_run(DATA / "durability" / "ref-kill-save", tmp_path / "run")
    ref.replace(
        "logs/train_cycle1.log", "at 2026-12-01T21:19:05.981588+00:00", "at 9999-12-01T21:19:05Z"
    )
    status, _, err = verify(ref.root)
    assert status == 2 and "logs/train_cycle1.log:20 is stamped with no usable time" in err, err
    assert "Traceback" not in report(ref.root, tmp_path)[2]


@pytest.mark.parametrize("new", ["9999-12-31T23:59:59-05:00", "0001-01-01T00:00:00+05:00"])
def test_an_iteration_stamp_out_of_range_cannot_be_judged(
    ref_run: Doctor, tmp_path: Path, new: str
) -> None:
    """Every iteration line is stamped: one no clock reads leaves the clocks unchecked (exit 2,
    criteria/clocks.py), and neither verify nor report prints a traceback."""
    ref_run.replace(CYCLE1, "2026-11-30T16:22:18.385+00:00", new, 1)
    status, _, err = verify(ref_run.root)
    assert status == 2 and "is stamped with no usable time" in err, err
    status, _, err = report(ref_run.root, tmp_path)
    assert status in (0, 1) and "Traceback" not in err


def test_a_megatron_stamp_out_of_range_cannot_be_judged(tmp_path: Path) -> None:
    run = copy_run(MEGATRON_KILL, tmp_path / "run")
    """The setup_done milestone's stamp (read for the load timing); Megatron's other
    ``datetime:`` lines are printed out of order, after the fact, and are not read."""
    run.replace(
        "logs/train_cycle0.log",
        "are built] datetime: 2026-11-30 13:43:16",
        "are built] datetime: 9999-11-30 13:43:16",
    )
    status, _, err = verify(run.root)
    assert status == 2 and "logs/train_cycle0.log:958 is stamped with no usable" in err, err
    assert report(run.root, tmp_path)[0] == 1


def test_glog_lines_alone_give_no_zone(ref_run: Doctor) -> None:
    """Glog lines carry no year (year 1 until an NVRx line names one): without any NVRx line,
    a profiling stamp is not read as a zone 2025 years off."""
    lines = ref_run.lines(LAUNCHER)
    glog = [line for line in lines if line[:1] in "EIW" and line[1:5].isdigit()]
    assert glog
    stamp = " Time: 2026-11-30 16:22:11.249 UTC"
    ref_run.write_lines(LAUNCHER, [glog[0].rstrip("\n") + stamp + "\n", *glog])
    _, out, err = verify(ref_run.root)
    assert out.splitlines()[-1].startswith("verify: "), err


# -- item 6: control characters --------------------------------------------------------------


def test_printable_escapes_controls_but_tab() -> None:
    shown = "a\tb\\x1b[2J\\x0d\\x07\\x00\\x7f\\x9b\\x0a"
    assert printable("a\tb\x1b[2J\r\x07\x00\x7f\x9b\n") == shown
    assert printable("one\x1b\ntwo", lines=True) == "one\\x1b\ntwo"
    assert printable("é ü — …") == "é ü — …"


@pytest.fixture
def hostile_run(ref_run: Doctor) -> Doctor:
    """The first replayed line ends with terminal controls and prints another loss: it is
    quoted by training_continuity's failure."""
    ref_run.replace(
        CYCLE1,
        REPLAYED,
        REPLAYED.replace("loss 4.945107460021973", "loss 4.945107460021974") + " " + HOSTILE,
    )
    return ref_run


def test_verify_text_escapes_the_run_s_control_characters(hostile_run: Doctor) -> None:
    status, out, err = verify(hostile_run.root)
    assert status == 1, err
    assert SHOWN in out and "\x1b" not in out and "\r" not in out and "\x07" not in out
    assert out.splitlines()[-1].startswith("verify: FAILED")


def test_verify_json_keeps_the_exact_text(hostile_run: Doctor) -> None:
    status, out, err = verify(hostile_run.root, "--json", "-")
    assert status == 1
    assert "\x1b" not in err and SHOWN in err  # the text report, on stderr
    evidence = [e for c in json.loads(out)["criteria"] for e in c["evidence"]]
    assert any(e.endswith(HOSTILE) for e in evidence)


@pytest.mark.parametrize("raw", [True, False], ids=["raw-controls", "json-escaped"])
def test_a_hostile_marker_field_is_quoted_exactly_in_json_and_escaped_on_a_terminal(
    ref_run: Doctor, raw: bool
) -> None:
    """The marker line that makes it unusable is the evidence: ``verify --json`` quotes that
    line as the file holds it (it kept the value only as a repr inside the message), the
    terminal shows it escaped."""
    lines = ref_run.lines(MARKER)
    at = ref_run.line_no(MARKER, '"fault": "kill"')
    value = "\x1b]0;owned\x07kill" if raw else "\\u001b]0;owned\\u0007kill"
    lines[at - 1] = f'  "fault": "{value}",\n'
    ref_run.write_lines(MARKER, lines)
    status, out, err = verify(ref_run.root, "--json", "-")
    assert status == 2, err
    exact = f"{MARKER}:{at}: " + lines[at - 1].rstrip("\n")
    if raw:  # no JSON string holds a raw control character
        exact = f"{MARKER}: {MARKER} is unreadable: not JSON (Invalid control character at"
    for criterion in json.loads(out)["criteria"]:
        if criterion["id"] in ("prior_checkpoint", "no_repeat_injection"):
            assert len(criterion["evidence"]) == 1
            assert criterion["evidence"][0].startswith(exact)
    assert "\x1b" not in err and "\x07" not in err
    status, text, _ = verify(ref_run.root)
    assert status == 2 and "\x1b" not in text
    assert (f"{MARKER}: " if raw else f"{MARKER}:{at}: ") in text


def test_messages_naming_a_run_dir_escape_it(tmp_path: Path) -> None:
    run = copy_run(REF_KILL_SAVE, tmp_path / "run\x1b[2J")
    status, out, _ = verify(run.root)
    assert status == 0 and "\x1b" not in out and "run\\x1b[2J" in out
    status, out, err = report(run.root, tmp_path)
    assert status == 0 and "\x1b" not in out and "run\\x1b[2J: QUALIFIED" in out, err


def test_plugin_output_escapes_the_run_s_control_characters(
    pytester: pytest.Pytester, hostile_run: Doctor, tmp_path: Path
) -> None:
    """The verdict block, the failure message, the log-tail section and the JUnit text."""
    junit = tmp_path / "junit.xml"
    result = pytester.runpytest(
        *SUITE_ARGS, "--nvrx-run-dir", str(hostile_run.root), f"--junitxml={junit}"
    )
    result.assert_outcomes(passed=6, failed=1)
    out = result.stdout.str()
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out
    assert SHOWN in out
    assert "nvrx: tail of logs/train_cycle1.log" in out
    xml = junit.read_text(encoding="utf-8")
    assert "\x1b" not in xml and "\r" not in xml
    failure = next(ET.parse(junit).getroot().iter("failure"))
    assert SHOWN in (failure.get("message") or "") + (failure.text or "")


# -- issue #36 item 16: the HTML report too ----------------------------------------------------

#: a C1 control (CSI), a bidi override, NUL and DEL besides the ESC sequences
MORE_HOSTILE = HOSTILE + "\x9b2J\u202etxt\x00\x7f"
#: what the page and the terminal show of them
MORE_SHOWN = SHOWN + "\\x9b2J\\u202etxt\\x00\\x7f"
_RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


@pytest.mark.parametrize("src", [REF_KILL_SAVE, MEGATRON_KILL], ids=["reference", "megatron"])
def test_report_html_shows_the_run_s_control_characters_escaped(src: Path, tmp_path: Path) -> None:
    """Before, report.html carried the log line's raw ESC, BEL, CR, CSI and bidi bytes (``cat
    report.html`` drove the terminal); now shown as the terminal output shows them, the
    report.json keeping the exact text."""
    run = copy_run(src, tmp_path / "run")
    rel, line = _a_replayed_line(run)
    number = re.search(r"(loss:? +)([0-9.E+-]+)", line)
    assert number is not None, line
    changed = line[: number.end()] + "1" + line[number.end() :] + " " + MORE_HOSTILE
    run.replace(rel, line, changed, count=1)
    status, out, err = report(run.root, tmp_path)
    assert status == 1, out + err
    page = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    assert _RAW_CONTROL.search(page) is None, repr(_RAW_CONTROL.search(page))
    assert MORE_SHOWN in html.unescape(page)
    document = json.loads((tmp_path / "out" / "report.json").read_text(encoding="utf-8"))
    assert any(MORE_HOSTILE in text for text in _strings(document))


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _a_replayed_line(run: Doctor) -> tuple[str, str]:
    """The replacement's first iteration line that training_continuity compares (the first
    after its load line), where a changed loss is quoted."""
    for line in run.lines(CYCLE1):
        if re.search(r"\biteration +\d+/ *\d+", line) and "loss" in line:
            return CYCLE1, line.rstrip("\n")
    raise AssertionError("no iteration line in the replacement")
