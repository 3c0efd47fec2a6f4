"""Absence of evidence is never a PASS (#36 items 1-5): every line and file a criterion needs,
derived from what the run itself says it did (criteria/required_evidence.py), is required; a
missing one is FAIL or "cannot judge", naming what is missing and why it was required.

Each class of edit is made on every committed run of its kind (doctored copies under tmp_path,
the originals never touched): each passed before this check existed (the issue's sweep: 24/24
fault runs, 10 schedules, the planted runs).
"""

from __future__ import annotations

import io
import re
from functools import cache
from pathlib import Path

import pytest

from pytest_nvrx.criteria import Judgement, judge, judge_run_dir
from pytest_nvrx.evidence import load_run
from pytest_nvrx.evidence.checkpoint import MAX_METADATA_BYTES
from pytest_nvrx.evidence.rundir import RunEvidence
from pytest_nvrx.evidence.workload import get_adapter
from pytest_nvrx.layout import MARKER_NAME
from pytest_nvrx.verify import verify_main
from tests.doctor import copy_run

DATA = Path(__file__).parent / "data"
#: every committed run directory (one with logs/)
RUN_DIRS = sorted({p.parent for p in DATA.rglob("logs") if p.is_dir()})
#: those of a fault (their marker says one was injected)
FAULT_RUNS = [d for d in RUN_DIRS if (d / MARKER_NAME).is_file()]


def _id(run_dir: Path) -> str:
    return str(run_dir.relative_to(DATA))


@cache
def _evidence(run_dir: Path) -> RunEvidence:
    return load_run(run_dir)


@cache
def _original(run_dir: Path) -> Judgement:
    """The committed run's judgement (the evidence read once, for the selection too)."""
    return judge(_evidence(run_dir))


def _texts(j: Judgement) -> list[str]:
    """What the judgement says is wrong: fatal problems, then failing verdicts' reasons."""
    fatal = [p.message for p in j.problems if p.severity == "fatal"]
    return fatal + [v.reason for v in j.verdicts if not v.passed]


def _verify(run_dir: Path) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = verify_main([str(run_dir)], out, err)
    return code, out.getvalue() + err.getvalue()


# ----------------------------------------------------------------------------------------------
# 3. a value the comparison needs, printed on one side only


def _replayed_lines(run_dir: Path) -> list[tuple[str, int, str, int]]:
    """(failed-cycle file, line, replacement file, line) of the first replayed iteration
    training_continuity compared, in committed runs where it passed comparing a replay."""
    j = _original(run_dir)
    if not j.passed or j.schedule:
        return []
    tc = j.verdict("training_continuity")
    if "replayed" not in tc.reason or len(tc.evidence) < 2:
        return []
    cand, ref = tc.evidence[0], tc.evidence[1]
    assert cand.line is not None and ref.line is not None
    return [(ref.file, ref.line, cand.file, cand.line)]


#: a value a line may go without, per workload: (the name a verdict shows, its pattern in the
#: line); the reference workload's consumed samples and loss make its iteration line
FIELDS = {
    "megatron": [
        ("loss" if name == "lm loss" else name, rf" {re.escape(name)}: [^|]*\|")
        for name in ("lm loss", "learning rate", "grad norm", "loss scale", "consumed samples")
    ],
    "reference": [("learning rate", r" lr \S+"), ("grad norm", r" grad_norm \S+")],
}


def _prints(run_dir: Path, pattern: str) -> bool:
    """Both replayed lines print the value (the oldest reference runs print no grad norm)."""
    ((ref_file, ref_line, cand_file, cand_line),) = _replayed_lines(run_dir)
    return all(
        re.search(pattern, (run_dir / f).read_text(errors="replace").splitlines()[n - 1])
        for f, n in ((ref_file, ref_line), (cand_file, cand_line))
    )


FIELD_CASES = [
    (d, name, pattern, side)
    for d in FAULT_RUNS
    if _replayed_lines(d)
    for name, pattern in FIELDS.get(_evidence(d).workload, [])
    if _prints(d, pattern)
    for side in ("failed", "replacement")
]


@pytest.mark.parametrize(
    ("run_dir", "name", "pattern", "side"),
    FIELD_CASES,
    ids=[f"{_id(d)}:{n}:{s}" for d, n, _, s in FIELD_CASES],
)
def test_a_value_printed_on_one_side_only_cannot_be_judged(
    run_dir: Path, name: str, pattern: str, side: str, tmp_path: Path
) -> None:
    """A replayed line without one of its values (``lm loss:`` dropped from the failed cycle's
    line) and the other side's value changed: the value went uncompared and the run passed."""
    ((ref_file, ref_line, cand_file, cand_line),) = _replayed_lines(run_dir)
    doc = copy_run(run_dir, tmp_path / run_dir.name)
    adapter = get_adapter(_evidence(run_dir).workload)
    drop, change = (
        ((ref_file, ref_line), (cand_file, cand_line))
        if side == "failed"
        else ((cand_file, cand_line), (ref_file, ref_line))
    )
    lines = doc.lines(drop[0])
    lines[drop[1] - 1], n = re.subn(pattern, "", lines[drop[1] - 1], count=1)
    assert n == 1
    body = lines[drop[1] - 1].split(": ", 1)[1]
    assert adapter.iteration_of(body) is not None  # still an iteration line, one value short
    doc.write_lines(drop[0], lines)
    other = doc.lines(change[0])
    other[change[1] - 1], n = re.subn(
        r"((?:lm loss:| loss) +\d\.)(\d)",
        lambda m: m[1] + str((int(m[2]) + 1) % 10),
        other[change[1] - 1],
        count=1,
    )
    assert n == 1  # the other side's loss is another now
    doc.write_lines(change[0], other)
    j = judge_run_dir(doc.root)
    tc = j.verdict("training_continuity")
    assert tc.cannot_judge and not j.judgeable, tc.render()
    assert re.match(
        rf"cannot judge: iteration \d+'s {name} is printed by cycle \d+"
        rf" \(logs/train_cycle\d+\.log:\d+\) but not by cycle \d+'s line of it"
        rf" \({re.escape(drop[0])}:{drop[1]}\): the comparison needs it on both sides",
        tc.reason,
    ), tc.reason


# ----------------------------------------------------------------------------------------------
# 4. an evidence file too large to read


def _restored_metadata(run_dir: Path) -> list[str]:
    """The restored checkpoint's DCP metadata optimizer_state_load read, in passing runs."""
    j = _original(run_dir)
    if not j.passed:
        return []
    refs = j.verdict("optimizer_state_load").evidence
    # the restored checkpoint's, quoted first (an in-flight save's is quoted for its directory:
    # whether it is on disk, not what it holds)
    return [r.file for r in refs if r.text.startswith("torch DCP metadata: ")][:1]


METADATA_CASES = [(d, m) for d in FAULT_RUNS for m in _restored_metadata(d)]


@pytest.mark.parametrize(
    ("run_dir", "metadata"), METADATA_CASES, ids=[_id(d) for d, _ in METADATA_CASES]
)
def test_restored_metadata_too_large_to_read_cannot_be_judged(
    run_dir: Path, metadata: str, tmp_path: Path
) -> None:
    """``truncate -s +33M .metadata`` (after removing its optimizer keys, say): the load
    passed, saying nothing of the file that went unread."""
    doc = copy_run(run_dir, tmp_path / run_dir.name)
    path = doc.path(metadata)
    with path.open("ab") as f:
        f.truncate(path.stat().st_size + (33 << 20))  # sparse: no disk used
    code, text = _verify(doc.root)
    assert code == 2, text
    assert "optimizer_state_load: " in text
    size = path.stat().st_size
    assert (
        f"cannot judge: checkpoint {metadata.split('/')[-2][5:].lstrip('0')}"
        f" on disk: torch DCP metadata not read: {metadata} is {size} bytes, over the"
        f" {MAX_METADATA_BYTES}-byte read cap: whether it holds the optimizer state the"
        " replacement had to restore is unknown"
    ) in text
