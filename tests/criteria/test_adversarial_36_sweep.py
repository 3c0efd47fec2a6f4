"""#36's adversarial classes D, E, I, M, O and X over every committed run of their kind: each
committed run that passes as committed is copied (under tmp_path), doctored by one edit of the
class, and judged; no copy may exit 0 (X: no copy may raise). One test per class, each listing
every copy that still passed, so a regression names its runs. The single-run cases, with the
class's causes, are in tests/criteria/test_adversarial_review_36.py.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers.adversarial import committed_verdict, verify_run
from tests.helpers.doctor import Doctor, copy_run
from tests.helpers.parse_once import parsing_once

DATA = Path(__file__).parents[1] / "data"
LAUNCHER = "logs/launcher.log"
MARKER = "fault_injected.json"
INJ = r"^\d+: \[pytest-nvrx injector\] rank \d+ pid \d+: "
_ARABIC = str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")

Edit = Callable[[Doctor], bool]  # False: the edit does not apply to this run (no such line)


@pytest.fixture(autouse=True, scope="module")
def _parse_once() -> Iterator[None]:
    """Each copy's unchanged files are parsed once (tests/helpers/parse_once.py)."""
    with parsing_once():
        yield


@functools.cache
def _passing() -> list[Path]:
    """The committed runs that pass as committed (verified when a test first asks, not at
    collection: every xdist worker collects this module, one runs it)."""
    runs = sorted({p.parent for p in DATA.rglob("run.json")})
    return [run for run in runs if committed_verdict(run)[0] == 0]


def _cycle_logs(run: Path) -> list[str]:
    logs = sorted((run / "logs").glob("train_cycle*.log"), key=lambda p: len(p.name))
    return [f"logs/{p.name}" for p in sorted(logs, key=lambda p: (len(p.name), p.name))]


def _text(run: Path, rel: str) -> str:
    return (run / rel).read_text(encoding="utf-8", errors="replace")


def _workload(run: Path) -> str:
    data = json.loads(_text(run, "run.json"))
    return str((data.get("config") or {}).get("workload", ""))


def _drop(rel: str, pattern: str) -> Edit:
    def edit(doc: Doctor) -> bool:
        lines = doc.lines(rel)
        kept = [line for line in lines if re.search(pattern, line) is None]
        doc.write_lines(rel, kept)
        return len(kept) < len(lines)

    return edit


def _still_passing(tmp_path: Path, cases: Iterator[tuple[Path, str, Edit]]) -> list[str]:
    passed: list[str] = []
    applied = 0
    for i, (src, what, edit) in enumerate(cases):
        doc = copy_run(src, tmp_path / f"{i}")
        if not edit(doc):
            continue
        applied += 1
        code, _ = verify_run(doc.root)
        if code == 0:
            passed.append(f"{src.relative_to(DATA)}: {what}")
    assert applied, "no committed run of the kind: the sweep tests nothing"
    return passed


def test_every_megatron_dump_removed(tmp_path: Path) -> None:
    def strip(rel: str) -> Edit:
        def edit(doc: Doctor) -> bool:
            out, inside, hit = [], False, False
            for line in doc.lines(rel):
                if re.match(r"^\d+: -+ arguments -+\s*$", line):
                    inside = hit = True
                    continue
                if re.match(r"^\d+: -+ end of arguments -+\s*$", line):
                    inside = False
                    continue
                if inside and re.match(r"^\d+: \s+[a-z][a-z0-9_]* \.{3,} ", line):
                    continue
                out.append(line)
            doc.write_lines(rel, out)
            return hit

        return edit

    def cases() -> Iterator[tuple[Path, str, Edit]]:
        for run in _passing():
            if _workload(run) == "megatron":
                for rel in _cycle_logs(run):
                    if "consumed samples:" in _text(run, rel):
                        yield run, f"{rel}'s dump removed", strip(rel)

    assert _still_passing(tmp_path, cases()) == []


def test_every_run_with_a_second_contradicting_launch_block(tmp_path: Path) -> None:
    def second(rx: str, rep: str) -> Edit:
        def edit(doc: Doctor) -> bool:
            lines = doc.lines(LAUNCHER)
            heads = [i for i, x in enumerate(lines) if "Starting elastic_operator with" in x]
            if not heads:
                return False
            end = heads[0] + 1
            while end < len(lines) and (lines[end].startswith("  ") or not lines[end].strip()):
                end += 1
            block = [re.sub(rx, rep, x) for x in lines[heads[0] : end]]
            doc.write_lines(LAUNCHER, lines[:end] + block + lines[end:])
            return True

        return edit

    def cases() -> Iterator[tuple[Path, str, Edit]]:
        for run in _passing():
            if (run / LAUNCHER).is_file():
                yield run, "max_restarts 0", second(r"(max_restarts\s*: )\d+", r"\g<1>0")
                yield run, "run_id other", second(r"(run_id\s*: ).*", r"\g<1>other-run")

    assert _still_passing(tmp_path, cases()) == []


def test_every_schema2_marker_without_a_key(tmp_path: Path) -> None:
    def without(key: str) -> Edit:
        def edit(doc: Doctor) -> bool:
            data = doc.json(MARKER)
            del data[key]
            doc.path(MARKER).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
            return True

        return edit

    def cases() -> Iterator[tuple[Path, str, Edit]]:
        for run in _passing():
            if (run / MARKER).is_file() and json.loads(_text(run, MARKER)).get(
                "schema_version"
            ) == 2:
                for key in ("run_id", "argv", "world_size", "host", "tracker", "pid"):
                    yield run, f"marker {key} deleted", without(key)
                yield run, "marker restart_count deleted", without("restart_count")

    assert _still_passing(tmp_path, cases()) == []


def test_every_run_with_unicode_digits_in_its_iteration_lines(tmp_path: Path) -> None:
    def arabic(rel: str) -> Edit:
        def edit(doc: Doctor) -> bool:
            out, hit = [], False
            for line in doc.lines(rel):
                m = re.search(r"(?<=rank \d) iteration \d|\] iteration +\d", line)
                if m is not None and ("[ref]" in line or "consumed samples" in line):
                    line = line[: m.start()] + line[m.start() :].translate(_ARABIC)
                    hit = True
                out.append(line)
            doc.write_lines(rel, out)
            return hit

        return edit

    def cases() -> Iterator[tuple[Path, str, Edit]]:
        for run in _passing():
            logs = _cycle_logs(run)
            if logs:
                yield run, f"{logs[-1]}'s iteration lines", arabic(logs[-1])

    assert _still_passing(tmp_path, cases()) == []


@pytest.mark.parametrize("prefix", ["\u00b2", "\u0661", "\uff13"])
def test_every_run_with_a_foreign_digit_rank_prefix_cannot_be_judged(
    tmp_path: Path, prefix: str
) -> None:
    bad: list[str] = []
    for i, run in enumerate(_passing()):
        logs = _cycle_logs(run)
        if not logs:
            continue
        doc = copy_run(run, tmp_path / f"{i}")
        lines = doc.lines(logs[-1])
        at = next((j for j, x in enumerate(lines) if re.match(r"^0: ", x)), None)
        if at is None:
            continue
        lines[at] = prefix + lines[at][1:]
        doc.write_lines(logs[-1], lines)
        try:
            code, text = verify_run(doc.root)
        except ValueError as exc:
            bad.append(f"{run.relative_to(DATA)}: raised {exc!r}")
            continue
        if code != 2 or "Traceback" in text:
            bad.append(f"{run.relative_to(DATA)}: exit {code}")
    assert bad == []


def _prints_versions(run: Path) -> bool:
    """run.json's stack names Megatron-Core 0.19 or later, which prints its versions first
    thing in every process (pretrain_gpt.py's __main__; core_v0.18.2 prints none)."""
    stack = json.loads(_text(run, "run.json")).get("stack") or {}
    m = re.match(r"(\d+)\.(\d+)", str(stack.get("megatron") or ""))
    return _workload(run) == "megatron" and m is not None and (int(m[1]), int(m[2])) >= (0, 19)


def _drop_everywhere(run: Path, *patterns: str) -> Edit:
    def edit(doc: Doctor) -> bool:
        hit = False
        for rel in _cycle_logs(run):
            for pattern in patterns:
                hit = _drop(rel, pattern)(doc) or hit
        return hit

    return edit


READING = INJ.replace(r"rank \d+", "rank 0") + "checkpoint tracker reads "
ANNOUNCEMENT = INJ.replace(r"rank \d+", "rank 0") + "reading checkpoint tracker "


def test_every_run_without_a_line_only_a_cross_check_reads(tmp_path: Path) -> None:
    def cases() -> Iterator[tuple[Path, str, Edit]]:
        for run in _passing():
            logs = _cycle_logs(run)
            has_marker = (run / MARKER).is_file()
            trained_logs = [
                rel for rel in logs if re.search(r"consumed[ _]samples", _text(run, rel))
            ]
            release = _prints_versions(run)
            announced = any(re.search(ANNOUNCEMENT, _text(run, rel), re.M) for rel in logs)
            read_in = [rel for rel in logs if re.search(READING, _text(run, rel), re.M)]
            if release and trained_logs:
                yield (
                    run,
                    "every cycle's version lines",
                    _drop_everywhere(run, r"^\d+: > .+ version \.+ "),
                )
            if announced:
                yield run, "every reading of every cycle", _drop_everywhere(run, READING)
                yield run, "every announcement", _drop_everywhere(run, ANNOUNCEMENT)
            for n, rel in enumerate(logs):
                text = _text(run, rel)
                # a version line is required where another cycle printed it (one build), and in
                # every cycle of a release that prints them in every process
                several = len(trained_logs) > 1 or release
                trained = "consumed samples" in text or "consumed_samples" in text
                # rank 0's tracker readings: where another cycle has some or the run announces
                # them, in a cycle that trained and read the tracker
                if trained and rel in read_in and (announced or len(read_in) > 1):
                    yield run, f"{rel}'s tracker readings", _drop(rel, READING)
                if trained and announced:
                    yield run, f"{rel}'s announcement", _drop(rel, ANNOUNCEMENT)
                if trained and " started pid " in text:
                    yield run, f"{rel}'s started lines", _drop(rel, r"\] \S+ rank \d+ started pid ")
                if several and trained and re.search(r"(?m)^\d+: > PyTorch version ", text):
                    yield (
                        run,
                        f"{rel}'s PyTorch version line",
                        _drop(rel, r"^\d+: > PyTorch version "),
                    )
                    yield run, f"{rel}'s version lines", _drop(rel, r"^\d+: > .+ version \.+ ")
                if trained and n == 0:
                    yield (
                        run,
                        f"{rel}'s fresh-start lines",
                        _drop(
                            rel,
                            r"no checkpoint found|could not find the metadata file"
                            r"|will not load any checkpoints",
                        ),
                    )
                if has_marker and re.search(INJ + "watching ", text, re.M):
                    yield run, f"{rel}'s injector start line", _drop(rel, INJ + "watching ")
                if has_marker and "fault already injected" in text:
                    yield run, f"{rel}'s 'already injected' line", _drop(rel, "already injected")

    assert _still_passing(tmp_path, cases()) == []
