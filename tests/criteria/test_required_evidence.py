"""Absence of evidence is never a PASS (#36 items 1-5): every line and file a criterion needs,
derived from what the run itself says it did (criteria/required_evidence.py), is required; a
missing one is FAIL or "cannot judge", naming what is missing and why it was required.

Each class of edit is made on every committed run of its kind (doctored copies under tmp_path,
the originals never touched); on f714a1a the issue's edits passed (24/24 fault runs, 10 schedules,
the planted runs), and every test of a class failed there but for the edits that already failed.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from pytest_nvrx.criteria import Judgement, judge, judge_run_dir
from pytest_nvrx.criteria.outcome import run_outcome
from pytest_nvrx.evidence import load_run
from pytest_nvrx.evidence.checkpoint import MAX_METADATA_BYTES
from pytest_nvrx.evidence.rundir import RESULT_KEYS, RunEvidence
from pytest_nvrx.evidence.workload import LoadCompleted, get_adapter
from pytest_nvrx.layout import MARKER_NAME
from pytest_nvrx.verify import verify_main
from tests.helpers.doctor import copy_run
from tests.helpers.parse_once import parsing_once

DATA = Path(__file__).parents[1] / "data"
#: every committed run directory (one with logs/)
RUN_DIRS = sorted({p.parent for p in DATA.rglob("logs") if p.is_dir()})
#: those of a fault (their marker says one was injected)
FAULT_RUNS = [d for d in RUN_DIRS if (d / MARKER_NAME).is_file()]


def _id(run_dir: Path) -> str:
    return str(run_dir.relative_to(DATA))


@pytest.fixture(autouse=True, scope="module")
def _parse_once() -> Iterator[None]:
    """Each copy's unchanged files are parsed once (tests/helpers/parse_once.py)."""
    with parsing_once():
        yield


@cache
def _evidence(run_dir: Path) -> RunEvidence:
    with parsing_once():  # at collection too: the copies' unchanged files are these
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
# 1. the failed cycle's lines of what the replacement trained again


def _replays(run_dir: Path) -> list[tuple[str, int]]:
    """(cycle log, iteration restored by the next restoring cycle that trained) for every
    cycle that printed iterations past that restore: what a replacement computed again."""
    logs = _evidence(run_dir).cycle_logs
    out = []
    for i, log in enumerate(logs):
        later = next((g for g in logs[i + 1 :] if g.of_type(LoadCompleted) and g.iterations), None)
        if later is None or not log.iterations:
            continue
        restored = later.of_type(LoadCompleted)[0].iteration
        if any(e.iteration > restored for e in log.iterations):
            out.append((log.file, restored))
    return out


REPLAY_CASES = [(d, f, r) for d in FAULT_RUNS for f, r in _replays(d)]


@pytest.mark.parametrize(
    ("run_dir", "log", "restored"),
    REPLAY_CASES,
    ids=[f"{_id(d)}:{Path(f).name}" for d, f, _ in REPLAY_CASES],
)
def test_a_cycle_without_its_lines_past_the_restore_is_never_a_pass(
    run_dir: Path, log: str, restored: int, tmp_path: Path
) -> None:
    """Every iteration line past the next restore deleted from a cycle (a SIGKILLed rank
    losing its last buffered lines is a real way to get there): training_continuity was "not
    applicable" and the run passed; now it cannot be judged, the verdict naming the iterations
    and the statement (marker, save line, printed line) that proves the cycle trained them."""
    original = _original(run_dir)
    doc = copy_run(run_dir, tmp_path / run_dir.name)
    lines = doc.lines(log)
    iteration = re.compile(
        r"(?:\] iteration +|\[ref\] \S+ rank \d+ iteration )(\d+)/"  # Megatron, reference
    )
    kept = [line for line in lines if not ((m := iteration.search(line)) and int(m[1]) > restored)]
    assert len(kept) < len(lines)
    doc.write_lines(log, kept)
    j = judge_run_dir(doc.root)
    tc = j.verdict("training_continuity")
    assert not j.passed, run_outcome(j).summary
    assert not tc.passed and not tc.not_applicable, tc.render()
    if original.passed or original.planted is not None:
        # the edit alone turned a judged replay into a verdict that names what is missing
        said = re.search(
            r"printed no line of iteration [\d., ]+, although|nothing in the run shows that"
            r" cycle \d+ trained past iteration \d+",
            tc.reason,
        )
        assert said, tc.render()
        assert re.search(r"(fault_injected(_\d+)?\.json|logs/train_cycle\d+\.log):\d+", tc.reason)


def test_the_issue_s_quoted_run_cannot_be_judged(tmp_path: Path) -> None:
    """``sed -i -E '/\\] iteration +[6-9]\\//d' train_cycle0.log`` on g2-kill-no-load-rng (a
    run that fails continuity): it passed 5 of 6 with continuity N/A."""
    doc = copy_run(DATA / "gpu-continuity" / "g2-kill-no-load-rng", tmp_path / "f1")
    doc.write_lines(
        "logs/train_cycle0.log",
        [
            line
            for line in doc.lines("logs/train_cycle0.log")
            if not re.search(r"\] iteration +[6-9]/", line)
        ],
    )
    code, text = _verify(doc.root)
    assert code == 2, text
    assert (
        "training_continuity: cannot judge: nothing in the run shows that cycle 0 trained past"
        " iteration 5, the one cycle 1 restored (the marker read the tracker at 5,"
        " fault_injected.json:49): nothing was computed twice"
    ) in text


def test_the_failed_cycle_s_lines_are_not_required_against_a_baseline(tmp_path: Path) -> None:
    """A baseline is a reference for every iteration after the restore: the failed cycle's lost
    lines are then not needed, and the replacement is judged against it."""
    continuity = DATA / "gpu-continuity"
    doc = copy_run(continuity / "g2-kill-30", tmp_path / "kill")
    for it in (6, 7, 8, 9):
        doc.delete("logs/train_cycle0.log", f"iteration        {it}/")
    j = judge_run_dir(doc.root, baseline=continuity / "g2-baseline-30")
    assert j.passed, run_outcome(j).summary
    assert "baseline g2-baseline-30: iterations 6..30 compared, 25/25 equal" in (
        j.verdict("training_continuity").reason
    )


def test_a_replacement_whose_counter_skips_the_replay_is_no_pass() -> None:
    """The planted ``iteration`` run (the restored counter jumps past the replay): nothing can
    be matched, continuity says why, and progress_past_restore fails the sequence by the same
    print rule: the run is never a pass."""
    j = judge_run_dir(DATA / "gpu-selftest" / "core_v0.19.0" / "iteration")
    tc = j.verdict("training_continuity")
    assert tc.not_applicable
    assert tc.reason == (
        "not applicable: cycle 1 printed none of iterations 6..10 that cycle 0 trained (the"
        " marker says the save of 10 was in flight at the fault (fault_injected.json:41)): its"
        " first line is iteration 11 after restoring 5, where the first after it is 6"
        " (progress_past_restore judges that sequence), so no replayed iteration can be matched"
    )
    assert not j.verdict("progress_past_restore").passed and not j.passed


def test_a_replacement_missing_a_replayed_line_fails(tmp_path: Path) -> None:
    """The replacement's last replayed line deleted (ref-kill-save: it restored 5, cycle 0
    trained through 10): what it computed again for 10 is not in the log."""
    doc = copy_run(DATA / "windows" / "cpu" / "ref-kill-save", tmp_path / "ref")
    doc.delete("logs/train_cycle1.log", "rank 0 iteration 10/20 ")
    tc = judge_run_dir(doc.root).verdict("training_continuity")
    assert not tc.passed and not tc.cannot_judge
    assert tc.reason == (
        "cycle 1 printed no line of iteration 10, although cycle 0 trained through 10 (the"
        " marker says the save of 10 was in flight at the fault (fault_injected.json:13)) and"
        " cycle 1 trained through 20 after restoring 5 (it scheduled the save of 20,"
        " logs/train_cycle1.log:25): what it computed again there is not in the log"
    ), tc.reason


# ----------------------------------------------------------------------------------------------
# 2. every rank the world size names prints what its role requires


def _multi_rank_cycles(run_dir: Path) -> list[tuple[str, int]]:
    """(cycle log, rank) for every rank of every cycle that trained, in runs of several ranks.
    A cycle a fault struck while it loaded trained nothing: its ranks may die before their
    first line, and the marker and the launcher judge it."""
    return [
        (log.file, rank)
        for log in _evidence(run_dir).cycle_logs
        if len(log.ranks) > 1 and log.iterations
        for rank in log.ranks
    ]


RANK_CASES = [(d, f, r) for d in RUN_DIRS for f, r in _multi_rank_cycles(d)]


@pytest.mark.parametrize(
    ("run_dir", "log", "rank"),
    RANK_CASES,
    ids=[f"{_id(d)}:{Path(f).name}:rank{r}" for d, f, r in RANK_CASES],
)
def test_a_rank_missing_from_a_cycle_that_trained_is_never_a_pass(
    run_dir: Path, log: str, rank: int, tmp_path: Path
) -> None:
    """``sed -i '/^1: /d'`` on a cycle log: the reference workload's rank 1 prints only its
    start (a load, or no checkpoint found), Megatron's last rank every iteration, its rank 0
    the loads and saves; without them the run passed although run.json names the rank."""
    doc = copy_run(run_dir, tmp_path / run_dir.name)
    doc.write_lines(log, [line for line in doc.lines(log) if not line.startswith(f"{rank}: ")])
    j = judge_run_dir(doc.root)
    assert not j.passed, run_outcome(j).summary
    if not _original(run_dir).passed:
        return  # it failed before the edit: what it fails for is its own
    named = (
        f"rank {rank}",
        "printed no line",
        "no iteration",
        "no checkpoint load",
        "no completed save",
        "never submitted",
        "nothing in the run shows",
    )
    assert any(n in t for t in _texts(j) for n in named), "\n".join(_texts(j))


def test_the_issue_s_rank_edit_names_the_rank_and_the_world_size(tmp_path: Path) -> None:
    doc = copy_run(DATA / "windows" / "cpu" / "ref-kill-save", tmp_path / "ref")
    log = "logs/train_cycle1.log"
    doc.write_lines(log, [line for line in doc.lines(log) if not line.startswith("1: ")])
    code, text = _verify(doc.root)
    assert code == 1, text
    assert (
        "FAIL optimizer_state_load: cycle 1 rank 1 shows no checkpoint load while rank(s) 0"
        " loaded iteration 5: every rank of the workload prints its own load line (rank 1"
        " printed no line at all in logs/train_cycle1.log, one of the 2 ranks run.json:31 names)"
    ) in text
    assert '    run.json:31:     "world_size": 2\n' in text


def test_a_fresh_start_some_rank_never_announced_cannot_be_judged(tmp_path: Path) -> None:
    """The reference baseline's rank 1 says nothing in cycle 0 (its run.json predates
    world_size: the launcher's launch configs name 2 ranks on 1 node)."""
    doc = copy_run(DATA / "cpu" / "reference-baseline", tmp_path / "base")
    log = "logs/train_cycle0.log"
    doc.write_lines(log, [line for line in doc.lines(log) if not line.startswith("1: ")])
    code, text = _verify(doc.root)
    assert code == 2, text
    assert (
        "logs/train_cycle0.log: rank 1 of the 2 logs/launcher.log:3 names printed no start (no"
        " checkpoint load, no fresh start) while rank 0 did (logs/train_cycle0.log:3), and cycle 0"
        " trained: the reference workload prints one on every rank before it trains, so what"
        " that rank trained from is unknown"
    ) in text


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


# ----------------------------------------------------------------------------------------------
# 5. how the launch ended: result.json of a run our harness launched


HARNESS_RUNS = [d for d in RUN_DIRS if (d / "run.json").is_file() and (d / "result.json").is_file()]


@pytest.mark.parametrize("run_dir", HARNESS_RUNS, ids=[_id(d) for d in HARNESS_RUNS])
def test_a_harness_run_without_its_result_json_cannot_be_judged(
    run_dir: Path, tmp_path: Path
) -> None:
    """Harness and watchdog both SIGKILLed leave no result.json (the launcher runs on,
    unwatched, past our deadline): the run passed on its logs alone. Cannot judge, not FAIL:
    nothing says the recovery went wrong, only that how the launch ended was never recorded
    (the watchdog's own record of a dead harness, interrupted, is "cannot judge" too)."""
    doc = copy_run(run_dir, tmp_path / run_dir.name)
    doc.remove("result.json")
    code, text = _verify(doc.root)
    assert code == 2, text
    assert (
        "run.json says our harness launched this run, but there is no result.json: the harness"
        " writes it when the launch ends (its watchdog, when the harness dies first), so how the"
        " launch ended (its exit code, our deadline, a stop signal) is unknown, or it has not"
        " ended"
    ) in text


#: each key the harness and its watchdog always write dropped, or the exit code made null
RECORD_EDITS = (*RESULT_KEYS, "exit_code=null")


def _timed_out(run_dir: Path) -> bool:
    return bool(json.loads((run_dir / "result.json").read_text(encoding="utf-8")).get("timed_out"))


#: a null exit code is what our deadline may leave (it stopped the launch): not a missing record
RECORD_CASES = [
    (d, edit)
    for i, d in enumerate(HARNESS_RUNS)
    if not ((edit := RECORD_EDITS[i % len(RECORD_EDITS)]) == "exit_code=null" and _timed_out(d))
]


@pytest.mark.parametrize(
    ("run_dir", "edit"), RECORD_CASES, ids=[f"{_id(d)}:{e}" for d, e in RECORD_CASES]
)
def test_a_result_json_without_what_it_records_cannot_be_judged(
    run_dir: Path, edit: str, tmp_path: Path
) -> None:
    """result.json emptied of its record (in turn over the committed runs: each key the harness
    and its watchdog always write, or the exit code null with no stop that explains it): the
    run was judged from its logs as if it had none."""
    doc = copy_run(run_dir, tmp_path / run_dir.name)
    data = doc.json("result.json")
    if edit == "exit_code=null":
        # a launch that ended on its own (older records say so with false)
        assert data["exit_code"] is not None and data["interrupted"] in (None, False)
        data["exit_code"] = None
        said = "result.json records no exit code (null), yet neither a stop signal nor our"
    else:
        del data[edit]
        said = f"result.json records no {edit!r}: the harness and its watchdog write"
    doc.path("result.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    code, text = _verify(doc.root)
    assert code == 2, text
    assert said in text


def test_a_later_node_judges_with_its_own_result_file(tmp_path: Path) -> None:
    """Node 1 of a run started node by node judges the combined run dir as soon as its own
    launch ended, with its own result.node1.json: node 0's result.json may be due yet."""
    doc = copy_run(DATA / "shapes" / "plugin-nodes-tp2-kill-save", tmp_path / "nodes")
    record = doc.json("result.json")
    doc.remove("result.json")
    doc.path("result.node1.json").write_text(json.dumps(record), encoding="utf-8")
    assert judge(load_run(doc.root, node_index=1)).passed
    node0 = judge(load_run(doc.root))
    assert not node0.judgeable
    assert any("there is no result.json" in p.message for p in node0.problems)


WALKTHROUGH_RUNS = [d for d in RUN_DIRS if not (d / "run.json").exists()]


@pytest.mark.parametrize("run_dir", WALKTHROUGH_RUNS, ids=[_id(d) for d in WALKTHROUGH_RUNS])
def test_a_run_made_by_hand_is_judged_from_its_logs(run_dir: Path) -> None:
    """The walkthrough's runs have neither file: no run.json claims nothing, and they are
    judged as before (the kill passes; the baseline, judged as a fault run, fails)."""
    j = _original(run_dir)
    assert not any("result.json" in p.message for p in j.problems), j.problems
    assert j.judgeable
    assert j.passed is (run_dir.name == "gpu-kill-100"), run_outcome(j).summary


def test_every_class_was_made_on_the_committed_runs() -> None:
    """The sweeps above edit what the issue found passing: every fault run's replay, every
    multi-rank run's ranks, every Megatron and reference replay's values, every restored
    checkpoint's metadata (a change of the committed data must not empty them silently)."""
    assert len({d for d, _, _ in REPLAY_CASES}) >= 60
    assert len({d for d, _, _ in RANK_CASES}) >= 40
    assert {_evidence(d).workload for d, *_ in FIELD_CASES} == {"megatron", "reference"}
    assert len(METADATA_CASES) >= 40
    assert len(HARNESS_RUNS) >= 90 and {d.name for d in WALKTHROUGH_RUNS} == {
        "gpu-kill-100",
        "gpu-baseline-20",
    }
