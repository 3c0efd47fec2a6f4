"""The self-test (#25) for real: ``python -m pytest_nvrx selftest --workload reference --json -``
runs an unplanted control and every plant of the catalogue through the real ft_launcher (2 ranks,
CPU), and must exit 0 with each plant caught by its documented criterion.

One self-test per session (a module-scoped fixture; tests/conftest.py keeps this module on one
xdist worker), and every test here reads its runs:

* the outcomes it printed as JSON, the plant records its workers wrote, the run.json of each run;
* the outcome rules on doctored copies of its runs (never the originals): a planted run without
  a record of the plant acting, or with a stranger's or a corrupt record, or that qualified, is
  never "caught";
* its runs judged the way tests of broken recoveries judge them (the self-test's planted bugs are
  the silent versions of the reference workload's ``--break-restore`` / ``--break-save``): the
  control replays exactly, each restore plant shows at the replayed iteration and value where it
  must, and each planted run fails the criterion that names it, quoting the lines that prove it.
  The loud versions the self-test has no plant for are test_broken_resumes.py (the optimizer left
  out) and test_broken_runs.py (the tracker at submit with a ``finalize``-window kill).

Plus the self-test's bad input, refused before anything launches.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_nvrx.criteria import judge_run_dir
from pytest_nvrx.criteria.outcome import run_outcome
from pytest_nvrx.criteria.selftest_outcome import PlantOutcome, Status, exit_status, plant_outcome
from pytest_nvrx.evidence import load_run
from pytest_nvrx.evidence.plant_records import PlantRecord, PlantRecords, read_plant_records
from pytest_nvrx.evidence.workload import LoadCompleted
from pytest_nvrx.layout import MANIFEST_NAME, MARKER_NAME
from pytest_nvrx.layout import PLANT_RECORDS_DIR as RECORDS_DIR
from pytest_nvrx.selftest.cli import selftest_main
from pytest_nvrx.selftest.run import preflight, selftest_scenario
from pytest_nvrx.settings import NvrxSettings, PartialRunConfig
from pytest_nvrx.settings.plants import PLANTS, Plant, plant_named
from pytest_nvrx.worker.plant_hook.nvrx_plants import ITERATION_JUMP
from tests.helpers.reference_runs import Resume, read_resume
from tests.helpers.selftest_runs import SELFTEST_TEST_TIMEOUT_S, Selftest

#: The reference scenarios' run size, which the self-test's runs have (the run.json test holds
#: each run to it): the fault comes in the step after the tracker names 5 (seeded plants start
#: from the control's checkpoint 5, so theirs comes after 10).
TRAIN_ITERS = 20
SAVE_INTERVAL = 5

pytestmark = pytest.mark.timeout(SELFTEST_TEST_TIMEOUT_S)


@pytest.fixture(scope="module")
def selftest(reference_selftest: Selftest) -> Selftest:
    """The session's one run of the command (tests/helpers/selftest_runs.py)."""
    return reference_selftest


# ----------------------------------------------------------------------------------------------
# What the command says


def test_the_selftest_exits_0_and_says_it_passed(selftest: Selftest) -> None:
    assert selftest.returncode == 0, selftest.tail()
    assert selftest.document["exit_status"] == 0
    summary = selftest.document["summary"]
    assert summary == (
        f"selftest reference: PASSED: {len(PLANTS)} of {len(PLANTS)} plants caught as"
        " documented, control qualified"
    ), summary
    assert selftest.text.rstrip().endswith(summary)  # the text went to stderr, the JSON alone
    assert selftest.document["workload"] == "reference"
    assert selftest.document["continuity_rtol"] == 0.0
    assert selftest.document["schema_version"] == 2 and "schema" not in selftest.document


def test_the_control_qualified(selftest: Selftest) -> None:
    control = selftest.document["outcomes"][0]
    assert control["plant"] == "control", control
    assert control["status"] == "qualified", control
    assert control["expected_criterion"] is None and control["caught_by"] == []


@pytest.mark.parametrize("plant", PLANTS, ids=lambda p: p.name)
def test_every_plant_is_caught_by_its_documented_criterion(
    selftest: Selftest, plant: Plant
) -> None:
    outcome = selftest.outcome(plant.name)
    assert outcome["status"] == "caught", outcome
    assert outcome["expected_criterion"] == plant.caught_by
    assert plant.caught_by in outcome["caught_by"], outcome
    assert outcome["reason"].startswith(f"caught by {plant.caught_by}: "), outcome
    assert outcome["first_cause"] is None, outcome  # the fault landed: the plant made it fail
    # the outcome quotes the plant's record first, then the criterion's evidence
    assert outcome["evidence"][0].startswith(f"{RECORDS_DIR}/{plant.name}-"), outcome["evidence"]


def test_the_outcomes_list_the_control_then_the_catalogue(selftest: Selftest) -> None:
    names = [o["plant"] for o in selftest.document["outcomes"]]
    assert names == ["control", *(p.name for p in PLANTS)]


def test_a_caught_outcome_quotes_what_the_plant_did(selftest: Selftest) -> None:
    for plant in PLANTS:
        records = read_plant_records(selftest.run_dir(plant.name))
        quoted = selftest.outcome(plant.name)["evidence"][0]
        assert records.applied[0].action in quoted, quoted


# ----------------------------------------------------------------------------------------------
# The plant records: written by the workers that acted, naming the plant


#: The ranks whose workers act: the restore plants act on every rank, rank-checkpoint on the
#: last rank only, tracker-at-submit on rank 0 (the one that writes the tracker).
ACTING_RANKS = {"rank-checkpoint": {1}, "tracker-at-submit": {0}}

_STARTED = re.compile(r" rank (\d+) started pid (\d+) world_size \d+ restart_count (\d+)")


def worker_pids(run_dir: Path) -> dict[tuple[int, int], int]:
    """(rank, restart_count) -> pid, from each worker's ``started`` line in the cycle logs."""
    found: dict[tuple[int, int], int] = {}
    for log in sorted((run_dir / "logs").glob("train_cycle*.log")):
        for m in _STARTED.finditer(log.read_text(errors="replace")):
            found[(int(m[1]), int(m[3]))] = int(m[2])
    return found


@pytest.mark.parametrize("plant", PLANTS, ids=lambda p: p.name)
def test_each_planted_run_has_records_from_the_workers_that_acted(
    selftest: Selftest, plant: Plant
) -> None:
    run_dir = selftest.run_dir(plant.name)
    records = read_plant_records(run_dir)
    assert records.problems == (), records.problems
    assert records.records, f"{run_dir}: no plant record"
    assert records.refused == (), [r.action for r in records.refused]
    pids = worker_pids(run_dir)
    for r in records.records:
        assert r.plant == plant.name, r
        assert r.pid not in (None, selftest.pid, os.getpid()), r
        assert r.rank is not None and r.restart_count is not None, r
        # the worker of that rank in that cycle wrote it, nobody else
        assert pids.get((r.rank, r.restart_count)) == r.pid, (r, pids)
        if plant.in_restore:
            assert r.restart_count >= 1, r  # a replacement's restore, never cycle 0's start
    assert {r.rank for r in records.records} == ACTING_RANKS.get(plant.name, {0, 1})


def test_the_control_has_no_plant_record(selftest: Selftest) -> None:
    assert not (selftest.run_dir("control") / RECORDS_DIR).exists()


@pytest.mark.parametrize("name", ["control", *(p.name for p in PLANTS)])
def test_each_run_json_records_the_plant_and_the_selftest(selftest: Selftest, name: str) -> None:
    manifest = json.loads((selftest.run_dir(name) / MANIFEST_NAME).read_text())
    config = manifest["config"]
    assert config["selftest"] is True, config
    assert config["plant"] == (None if name == "control" else name), config
    assert (config["train_iters"], config["save_interval"]) == (TRAIN_ITERS, SAVE_INTERVAL)
    assert (config["fault"], config["window"], config["world_size"]) == ("kill", "step", 2)
    seeded = name != "control" and plant_named(name).seeded
    assert (config["seed_checkpoint"] is not None) == seeded, config


# ----------------------------------------------------------------------------------------------
# The outcome rules, on doctored copies of the real runs


def copy_run(run_dir: Path, tmp_path: Path) -> Path:
    """A copy of ``run_dir`` to edit (the fixture's runs stay as they ran)."""
    copy = tmp_path / run_dir.name
    shutil.copytree(run_dir, copy, symlinks=True)
    return copy


def outcome_of(plant: Plant, run_dir: Path, *, rtol: float = 0.0) -> PlantOutcome:
    return plant_outcome(plant, judge_run_dir(run_dir), read_plant_records(run_dir), rtol=rtol)


def one_record(run_dir: Path) -> Path:
    return sorted((run_dir / RECORDS_DIR).glob("*.json"))[0]


def test_the_copy_of_a_caught_run_is_caught(selftest: Selftest, tmp_path: Path) -> None:
    """The doctored tests below start from this: the copy alone is judged as the original."""
    copy = copy_run(selftest.run_dir("rng"), tmp_path)
    outcome = outcome_of(plant_named("rng"), copy)
    assert outcome.status == "caught", outcome.reason
    assert outcome.reason == selftest.outcome("rng")["reason"]


def test_a_run_without_plant_records_was_not_applied(selftest: Selftest, tmp_path: Path) -> None:
    copy = copy_run(selftest.run_dir("rng"), tmp_path)
    shutil.rmtree(copy / RECORDS_DIR)
    outcome = outcome_of(plant_named("rng"), copy)
    assert outcome.status == "not-applied", outcome
    assert outcome.reason.startswith("plant not applied: no worker recorded acting; "), outcome
    assert not outcome.good


def test_records_that_only_refused_were_not_applied(selftest: Selftest, tmp_path: Path) -> None:
    copy = copy_run(selftest.run_dir("previous-checkpoint"), tmp_path)
    refused = "cannot plant: no complete checkpoint before iteration 5"
    for path in (copy / RECORDS_DIR).glob("*.json"):
        data = json.loads(path.read_text())
        data.update(applied=False, action=refused)
        path.write_text(json.dumps(data, indent=1))
    outcome = outcome_of(plant_named("previous-checkpoint"), copy)
    assert outcome.status == "not-applied", outcome
    assert outcome.reason.startswith(f"plant not applied: {refused} [{RECORDS_DIR}/"), outcome
    assert len(outcome.evidence) == 2 and all(
        ref.file.startswith(f"{RECORDS_DIR}/") for ref in outcome.evidence
    ), outcome.evidence


def test_a_record_of_another_plant_cannot_be_judged(selftest: Selftest, tmp_path: Path) -> None:
    copy = copy_run(selftest.run_dir("rng"), tmp_path)
    path = one_record(copy)
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "plant": "data"}))
    outcome = outcome_of(plant_named("rng"), copy)
    assert outcome.status == "cannot-judge", outcome
    assert re.fullmatch(
        rf"{RECORDS_DIR}/{re.escape(path.name)}(:\d+)? records plant 'data' in the run of 'rng'",
        outcome.reason,
    ), outcome.reason
    assert exit_status([outcome]) == 2


def test_a_corrupt_record_cannot_be_judged(selftest: Selftest, tmp_path: Path) -> None:
    copy = copy_run(selftest.run_dir("data"), tmp_path)
    path = one_record(copy)
    path.write_text(path.read_text()[:40])  # cut off mid-record: not JSON
    outcome = outcome_of(plant_named("data"), copy)
    assert outcome.status == "cannot-judge", outcome
    assert outcome.reason.startswith(f"plant record {RECORDS_DIR}/{path.name}: "), outcome.reason


def test_a_planted_run_that_qualifies_is_missed(selftest: Selftest, tmp_path: Path) -> None:
    """The control's run, as if the rng plant had acted in it (its record copied in, run.json
    and the marker naming it as a planted run's do): every criterion passes, so the plant was
    missed, saying at which tolerance and what it did."""
    copy = copy_run(selftest.run_dir("control"), tmp_path)
    record = one_record(selftest.run_dir("rng"))
    (copy / RECORDS_DIR).mkdir()
    shutil.copy(record, copy / RECORDS_DIR / record.name)
    manifest = json.loads((copy / MANIFEST_NAME).read_text())
    assert manifest["config"]["plant"] is None
    manifest["config"]["plant"] = "rng"
    (copy / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2))
    marker = json.loads((copy / MARKER_NAME).read_text())
    assert marker.get("plant") is None
    (copy / MARKER_NAME).write_text(json.dumps({**marker, "plant": "rng"}, indent=2))
    judgement = judge_run_dir(copy)
    assert judgement.passed, run_outcome(judgement).summary
    rng = plant_named("rng")
    outcome = plant_outcome(rng, judgement, read_plant_records(copy), rtol=1e-6)
    assert outcome.status == "missed", outcome
    assert (
        f"on this stack, at rtol 1e-06, {rng.models} would be QUALIFIED: every criterion passed"
        " although restore of iteration 5 left out the rng state"
    ) in outcome.reason, outcome.reason
    assert outcome.evidence[0].file == f"{RECORDS_DIR}/{record.name}"
    assert exit_status([outcome]) == 1


def _outcome(status: Status) -> PlantOutcome:
    control = status in ("qualified", "not-qualified")
    return PlantOutcome(None if control else PLANTS[0], status, status)


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [
        (["qualified", "caught", "caught", "skipped"], 0),
        (["qualified", "caught", "missed", "not-applied"], 1),
        (["qualified", "caught-elsewhere"], 1),
        (["qualified", "caught", "not-applied"], 2),
        (["not-qualified", "caught"], 2),
        (["qualified", "cannot-plant"], 2),
        (["qualified", "cannot-judge", "caught"], 2),
    ],
)
def test_exit_status(statuses: list[Status], expected: int) -> None:
    """0 only when every run is good; a finding about the criteria (missed, caught elsewhere)
    outweighs a run that shows nothing (2)."""
    assert exit_status([_outcome(s) for s in statuses]) == expected


# ----------------------------------------------------------------------------------------------
# The runs judged as broken recoveries: the control and the plants that leave part of the state
# out replay the iterations between the restored checkpoint and the fault


@dataclass(frozen=True)
class Replay:
    """What a restore plant's replay must show (``plant`` None: the control's, exact)."""

    plant: str | None
    differs: str | None = None  # the printed value that shows it first
    offset: int = 1  # at which replayed iteration, counted from the restored one
    left_out: str | None = None  # the part of the checkpoint the plant does not restore

    @property
    def name(self) -> str:
        return self.plant or "control"


REPLAYS = (
    Replay(None),
    Replay("rng", "loss", left_out="rng"),
    # the first replayed loss depends only on the restored weights; the reset moments show next
    Replay("optimizer-reset", "loss", offset=2),
    Replay("data", "loss", left_out="data"),
    Replay("scheduler", "learning_rate", left_out="scheduler"),
)


@pytest.fixture(params=REPLAYS, ids=lambda r: r.name)
def replay(request: pytest.FixtureRequest) -> Replay:
    param: Replay = request.param
    return param


@pytest.fixture(scope="module")
def resumes(selftest: Selftest) -> dict[str, Resume]:
    return {r.name: read_resume(selftest.run_dir(r.name)) for r in REPLAYS}


@pytest.fixture
def resume(resumes: dict[str, Resume], replay: Replay) -> Resume:
    return resumes[replay.name]


def test_the_launcher_recovered(resume: Resume, replay: Replay) -> None:
    resume.assert_launcher_recovered(TRAIN_ITERS)
    if replay.plant is None:
        assert resume.judgement.passed, resume.verdicts()


def test_the_failed_cycle_ran_past_the_restored_checkpoint(resume: Resume) -> None:
    """At least two replayed iterations: the first replayed loss depends only on the restored
    weights, so reset optimizer moments show from the second on. The fault comes in the first
    step after the tracker names 5, when the save of 5 was finalized at iteration 10."""
    assert resume.restored == SAVE_INTERVAL
    assert resume.replayed == list(range(resume.restored + 1, max(resume.cycles[0]) + 1))
    assert len(resume.replayed) >= 2, (resume.restored, sorted(resume.cycles[0]))


def test_optimizer_state_load_passes_a_load_that_says_it_is_complete(resume: Resume) -> None:
    verdict = resume.judgement.verdict("optimizer_state_load")
    assert verdict.passed, verdict.render()


def test_the_load_lines_are_silent_and_the_records_say_what_was_done(
    resume: Resume, replay: Replay
) -> None:
    """Every rank's load line lists a complete restore, planted or not, and no line of the
    run mentions the plant; only the replacement's workers' records say what they did."""
    parts = ("model", "optimizer", "scheduler", "rng", "data")
    ranks = [re.search(r" rank (\d+) load checkpoint ", e.ref.text) for e in resume.loads]
    assert sorted(m[1] for m in ranks if m is not None) == ["0", "1"]
    assert {e.parts for e in resume.loads} == {parts}
    logs = resume.run_dir / "logs"
    for log in logs.glob("train_cycle*.log"):
        text = log.read_text()
        assert "restore skipped" not in text and "on purpose" not in text, log
    cycle1 = (logs / "train_cycle1.log").read_text()
    assert "started pid" in cycle1 and " restart_count 1" in cycle1
    records = read_plant_records(resume.run_dir)
    if replay.plant is None:
        assert records == PlantRecords()
        return
    replacement = [r.rank for r in records.applied if r.restart_count == 1]
    assert len(replacement) == 2 and set(replacement) == {0, 1}, records
    actions = {r.action for r in records.records}
    if replay.left_out is not None:
        expected = f"restore of iteration {resume.restored} left out the {replay.left_out} state"
        assert actions == {expected}, actions
    else:
        assert all(
            a.startswith(f"after a complete load of iteration {resume.restored}, zeroed AdamW's")
            for a in actions
        ), actions


def test_the_replayed_iterations_show_the_plant(resume: Resume, replay: Replay) -> None:
    first = resume.first_difference()
    if replay.plant is None:
        assert first is None, first
        return
    assert first is not None, f"{replay.name}: replay {resume.replayed} printed identically"
    iteration, name, before, after = first
    assert (iteration, name) == (resume.restored + replay.offset, replay.differs), first
    print(f"\n{replay.name}: iteration {iteration} {name} {before} -> {after}")


def test_training_continuity_verdict(resume: Resume, replay: Replay) -> None:
    """Issue #8's criterion on real runs: it passes the exact replay and fails each planted
    one on the line of the first replayed iteration that printed something else."""
    verdict = resume.judgement.verdict("training_continuity")
    first = resume.first_difference()
    if replay.plant is None:
        assert verdict.passed, verdict.render()
        return
    assert verdict.status == "FAIL", verdict.render()
    assert first is not None
    quoted = verdict.evidence[0]
    assert quoted.file == "logs/train_cycle1.log", verdict.render()
    assert f" iteration {first[0]}/{TRAIN_ITERS} " in quoted.text, verdict.render()


# ----------------------------------------------------------------------------------------------
# The runs judged as broken recoveries: the counter, the checkpoint and the tracker plants


@dataclass(frozen=True)
class PlantedRun:
    resume: Resume
    records: tuple[PlantRecord, ...]

    def loads(self, cycle: int) -> tuple[LoadCompleted, ...]:
        log = load_run(self.resume.run_dir).cycle_log(cycle)
        assert log is not None, f"{self.resume.run_dir}: no log of cycle {cycle}"
        return log.of_type(LoadCompleted)

    def verdicts(self) -> str:
        cause = self.resume.judgement.first_cause
        head = f"first cause: {cause.text}\n" if cause is not None else ""
        return head + self.resume.verdicts()


def planted_run(selftest: Selftest, name: str) -> PlantedRun:
    run_dir = selftest.run_dir(name)
    records = read_plant_records(run_dir)
    assert records.problems == () and records.refused == (), records
    return PlantedRun(read_resume(run_dir), records.applied)


def by_rank(loads: tuple[LoadCompleted, ...]) -> dict[str, LoadCompleted]:
    return {e.ref.text.split(" rank ")[1].split()[0]: e for e in loads}


def test_a_jumped_iteration_counter_breaks_the_sequence(selftest: Selftest) -> None:
    """The replacement restores 5 but its counter says 10, so it trains 11..20 and iterations
    6..10 are never trained: the iteration sequence breaks (``progress_past_restore``)."""
    run = planted_run(selftest, "iteration")
    judgement = run.resume.judgement
    assert run.resume.exit_code == 0, run.verdicts()  # the launcher recovered: the bug is silent
    loads = run.loads(1)
    assert {e.iteration for e in loads} == {SAVE_INTERVAL}, loads
    counter = SAVE_INTERVAL + ITERATION_JUMP
    assert {r.action for r in run.records} == {
        f"restored iteration counter set to {counter} after loading iteration {SAVE_INTERVAL}"
    }
    replacement = load_run(run.resume.run_dir).cycle_log(1)
    assert replacement is not None
    first = replacement.iterations[0]
    assert first.iteration == counter + 1  # restored 5, resumed at 11: 6..10 untrained
    assert max(e.iteration for e in replacement.iterations) == TRAIN_ITERS
    verdict = judgement.verdict("progress_past_restore")
    assert verdict.status == "FAIL", run.verdicts()
    assert verdict.reason.startswith("the iteration sequence is broken: "), verdict.render()
    assert first.ref in verdict.evidence, verdict.render()
    assert loads[0].ref in verdict.evidence or loads[-1].ref in verdict.evidence
    assert judgement.first_cause is None  # a fault run whose fault landed
    assert not judgement.passed


def test_ranks_restoring_different_checkpoints_fail_optimizer_state_load(
    selftest: Selftest,
) -> None:
    """Cycle 0 resumes the control's checkpoint 5, so two checkpoints are complete when the
    fault comes after 10; the replacement's rank 0 restores 10, its rank 1 the previous 5."""
    run = planted_run(selftest, "rank-checkpoint")
    judgement = run.resume.judgement
    assert run.resume.exit_code == 0, run.verdicts()
    cycle0 = run.loads(0)
    assert {e.iteration for e in cycle0} == {5}, cycle0  # resumed the seeded checkpoint
    loads = by_rank(run.loads(1))
    assert {r: e.iteration for r, e in loads.items()} == {"0": 10, "1": 5}, loads
    assert [(r.rank, r.action) for r in run.records] == [
        (1, "read the tracker's iteration 10 as 5, the complete checkpoint before it")
    ]
    verdict = judgement.verdict("optimizer_state_load")
    assert verdict.status == "FAIL", run.verdicts()
    assert verdict.reason.startswith(
        "the ranks of cycle 1 restored different checkpoints (rank 1 iteration 5, rank 0"
        " iteration 10)"
    ), verdict.render()
    assert loads["0"].ref in verdict.evidence and loads["1"].ref in verdict.evidence
    assert judgement.verdict("prior_checkpoint").passed, run.verdicts()
    assert judgement.first_cause is None


def test_every_rank_restoring_the_previous_checkpoint_fails_optimizer_state_load(
    selftest: Selftest,
) -> None:
    """The same seeded start; every rank of the replacement restores 5 although 10 completed
    before the fault: the load line is the one of a correct load of 5, the loss is the
    progress from 6 to 10."""
    run = planted_run(selftest, "previous-checkpoint")
    judgement = run.resume.judgement
    assert run.resume.exit_code == 0, run.verdicts()
    assert {e.iteration for e in run.loads(0)} == {5}
    loads = by_rank(run.loads(1))
    assert {r: e.iteration for r, e in loads.items()} == {"0": 5, "1": 5}, loads
    assert {r.action for r in run.records} == {
        "read the tracker's iteration 10 as 5, the complete checkpoint before it"
    }
    verdict = judgement.verdict("optimizer_state_load")
    assert verdict.status == "FAIL", run.verdicts()
    assert verdict.reason.startswith(
        "cycle 1 loaded iteration 5, older than the newest checkpoint completed before the"
        " failure (10)"
    ), verdict.render()
    quoted = [ref.text for ref in verdict.evidence]
    assert any(" load checkpoint iteration 5 " in t for t in quoted), quoted
    assert any(t.endswith("save completed iteration 10") for t in quoted), quoted
    assert judgement.verdict("prior_checkpoint").passed, run.verdicts()
    assert judgement.first_cause is None


def test_a_step_fault_after_a_tracker_written_at_submit_lands_before_finalization(
    selftest: Selftest,
) -> None:
    """The fault lands (the tracker moved), but the checkpoint the tracker named was never
    finalized before it: prior_checkpoint fails on the scheduled-only save."""
    run_dir = selftest.run_dir("tracker-at-submit")
    judgement = judge_run_dir(run_dir)
    records = read_plant_records(run_dir)
    assert [(r.rank, r.restart_count) for r in records.records] == [(0, 0)], records
    assert records.records[0].action == (
        f"wrote the tracker {SAVE_INTERVAL} when save {SAVE_INTERVAL} was submitted, before its"
        " finalization"
    )
    marker = load_run(run_dir).marker
    assert marker is not None and marker.ok
    assert marker.tracker_iteration == SAVE_INTERVAL
    verdict = judgement.verdict("prior_checkpoint")
    assert verdict.status == "FAIL", verdict.render()
    assert f"{SAVE_INTERVAL}" in verdict.reason
    assert any(
        f"save scheduled iteration {SAVE_INTERVAL} " in ref.text for ref in verdict.evidence
    ), verdict.render()
    assert not judgement.passed


def test_the_tracker_named_a_checkpoint_before_its_finalization_line(selftest: Selftest) -> None:
    """Item 4's check, on the real run: a failing verdict says the durability order is broken,
    the tracker naming checkpoint 5 before any line finalized it, quoting the tracker reading."""
    judgement = judge_run_dir(selftest.run_dir("tracker-at-submit"))
    said = [
        v
        for v in judgement.verdicts
        if not v.passed
        and "durability order broken" in v.reason
        and f"naming {SAVE_INTERVAL} " in v.reason
        and any("tracker" in ref.text for ref in v.evidence)
    ]
    assert said, "\n".join(v.render() for v in judgement.verdicts)


# ----------------------------------------------------------------------------------------------
# Bad input: refused in one line, before anything launches


def test_an_unknown_plant_is_refused_before_anything_launches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stdout = io.StringIO()
    work = tmp_path / "work"
    code = selftest_main(["--plant", "rng", "--plant", "nope", "--work-dir", str(work)], {}, stdout)
    assert code == 2
    err = capsys.readouterr().err
    assert err == (
        "selftest: error: no plant 'nope'; the catalogue: "
        + ", ".join(p.name for p in PLANTS)
        + "\n"
    )
    assert stdout.getvalue() == "" and not work.exists()


def test_megatron_without_a_checkout_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stdout = io.StringIO()
    work = tmp_path / "work"
    code = selftest_main(["--workload", "megatron", "--work-dir", str(work)], {}, stdout)
    assert code == 2
    assert capsys.readouterr().err == (
        "selftest: error: --workload megatron needs --megatron-path (or MEGATRON_PATH)\n"
    )
    assert stdout.getvalue() == "" and not work.exists()


def test_a_plant_needing_more_ranks_than_the_run_has_is_skipped() -> None:
    settings = NvrxSettings(overrides=PartialRunConfig(gpus_per_node=1))
    plant = plant_named("rank-checkpoint")
    outcome = preflight(settings, selftest_scenario("reference", plant.name), plant)
    assert outcome is not None and outcome.status == "skipped", outcome
    assert outcome.reason == (
        "skipped: one rank restores another checkpoint needs 2 ranks or more; this run has 1"
    )
    assert outcome.good and outcome.run_dir is None
    rng = plant_named("rng")
    assert preflight(settings, selftest_scenario("reference", rng.name), rng) is None


def test_a_checkout_lacking_a_patch_point_cannot_be_planted(tmp_path: Path) -> None:
    checkout = tmp_path / "Megatron-LM"
    training = checkout / "megatron" / "training"
    training.mkdir(parents=True)
    (checkout / "pretrain_gpt.py").write_text("raise SystemExit('not a real Megatron')\n")
    (training / "checkpointing.py").write_text(
        "def read_metadata(tracker_filename):\n    return 0, False\n\n"
        "def save_checkpoint(*args, **kwargs):\n    return None\n\n"
        "def get_checkpoint_tracker_filename(path):\n    return path\n"
    )
    settings = NvrxSettings(megatron_path=checkout)
    rng = plant_named("rng")
    outcome = preflight(settings, selftest_scenario("megatron", rng.name), rng)
    assert outcome is not None and outcome.status == "cannot-plant", outcome
    assert outcome.reason == (
        f"cannot plant on this revision: {checkout} has no"
        " megatron.training.checkpointing.load_checkpoint"
    )
    assert exit_status([outcome]) == 2
    at_submit = plant_named("tracker-at-submit")  # its patch points are all there
    assert preflight(settings, selftest_scenario("megatron", at_submit.name), at_submit) is None
