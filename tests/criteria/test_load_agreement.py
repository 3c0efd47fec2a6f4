"""Every rank of the replacement loads the same checkpoint iteration from the same directory, at
the same data position (issue #21 item 1): doctored copies of real passing runs, each with one
load line edited, that passed 6/6 before.

The runs: ``ref-kill-save`` (the CPU reference workload, 2 ranks, every rank printing its own
``load checkpoint iteration 5 (...) consumed_samples 20 path .../iter_0000005`` line, 4 samples
an iteration) and ``g2-kill-30`` (Megatron on 2 x H200, rank 0 printing ``loading distributed
checkpoint from <dir> at iteration 5`` and ``successfully loaded checkpoint from <dir> ...``).
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from pytest_nvrx.criteria import judge_run_dir
from pytest_nvrx.criteria.outcome import run_outcome
from pytest_nvrx.criteria.verdict import Verdict
from pytest_nvrx.evidence.megatron import MEGATRON
from pytest_nvrx.evidence.reference import REFERENCE
from pytest_nvrx.evidence.refs import LineCursor
from pytest_nvrx.evidence.workload import LoadCompleted, LoadStarted, stated_rank
from pytest_nvrx.verify import verify_main
from tests.helpers.doctor import CYCLE0, CYCLE1, Doctor

DATA = Path(__file__).parents[1] / "data"
REF_KILL = DATA / "windows" / "cpu" / "ref-kill-save"
G2_KILL = DATA / "gpu-continuity" / "g2-kill-30"

RANK0_LOAD = (
    "rank 0 load checkpoint iteration 5 (model, optimizer, scheduler, rng, data) consumed_samples"
)
RANK1_LOAD = (
    "rank 1 load checkpoint iteration 5 (model, optimizer, scheduler, rng, data) consumed_samples"
)
G2_DIR = "/tmp/w/runs/g2-kill-30/checkpoints"
G2_LOADING = f"loading distributed checkpoint from {G2_DIR} at iteration 5"
G2_LOADED = f"successfully loaded checkpoint from {G2_DIR} [ t 1/1"


def _load_failure(run: Doctor) -> Verdict:
    verdict = judge_run_dir(run.root).verdict("optimizer_state_load")
    assert not verdict.passed, verdict.render()
    assert verify_main([str(run.root)], io.StringIO(), io.StringIO()) == 1
    return verdict


def _where(verdict: Verdict) -> list[str]:
    return [e.location for e in verdict.evidence]


def test_the_unchanged_runs_pass(ref: Doctor, g2: Doctor) -> None:
    for run in (ref, g2):
        judgement = judge_run_dir(run.root)
        assert judgement.passed, run_outcome(judgement).summary


# --- the checkpoint a load line names is the one of the iteration it names --------------------


def test_a_load_naming_the_checkpoint_of_another_iteration_fails(ref: Doctor) -> None:
    """Rank 1 says iteration 5 but names iter_0000010, the save in flight at the fault."""
    ref.replace(
        CYCLE1,
        f"{RANK1_LOAD} 20 path /tmp/wt/runs/ks1/checkpoints/iter_0000005",
        f"{RANK1_LOAD} 20 path /tmp/wt/runs/ks1/checkpoints/iter_0000010",
    )
    verdict = _load_failure(ref)
    assert verdict.reason == (
        "cycle 1 rank 1 reports iteration 5 loaded from"
        " /tmp/wt/runs/ks1/checkpoints/iter_0000010, not iteration 5's checkpoint"
        " (iter_0000005); that path is the save of iteration 10"
    )
    assert _where(verdict) == [f"{CYCLE1}:6", f"{CYCLE0}:20", f"{CYCLE1}:5"]


# --- every rank restores one data position, the one trained on and the checkpoint's -----------


def test_ranks_restoring_different_data_positions_fail(ref: Doctor) -> None:
    ref.replace(CYCLE1, f"{RANK1_LOAD} 20 ", f"{RANK1_LOAD} 24 ")
    verdict = _load_failure(ref)
    assert verdict.reason == (
        "the ranks of cycle 1 restored iteration 5 at different data positions (rank 0"
        " consumed_samples 20, rank 1 consumed_samples 24): one training state cannot be resumed"
        " from two"
    )
    assert _where(verdict) == [f"{CYCLE1}:5", f"{CYCLE1}:6"]


def test_one_rank_restoring_another_data_position_fails(ref: Doctor) -> None:
    """The adversary's one-line edit: rank 0 alone says 16; the ranks then disagree."""
    ref.replace(CYCLE1, f"{RANK0_LOAD} 20 ", f"{RANK0_LOAD} 16 ")
    assert "at different data positions (rank 0 consumed_samples 16, rank 1" in (
        _load_failure(ref).reason
    )


def test_a_restored_data_position_the_next_iteration_did_not_train_from_fails(
    ref: Doctor,
) -> None:
    """Both ranks say 16, yet iteration 6 shows 24 (20 + 4): training went on from 20."""
    ref.replace(CYCLE1, f"{RANK0_LOAD} 20 ", f"{RANK0_LOAD} 16 ")
    ref.replace(CYCLE1, f"{RANK1_LOAD} 20 ", f"{RANK1_LOAD} 16 ")
    verdict = _load_failure(ref)
    assert verdict.reason == (
        "cycle 1 rank 0 restored consumed_samples 16 with iteration 5, but its first iteration"
        " after, 6, shows 24 consumed samples; with 4 samples an iteration"
        f" ({CYCLE1}:7, {CYCLE1}:8) it would show 20: the restored data position is not the one"
        " trained on"
    )
    assert _where(verdict) == [f"{CYCLE1}:5", f"{CYCLE1}:7", f"{CYCLE1}:8"]


def test_a_restored_data_position_other_than_the_failed_cycle_printed_fails(
    ref: Doctor,
) -> None:
    """Cycle 0 printed iteration 5 at 16 consumed samples; the replacement restored 20 with it."""
    ref.replace(
        CYCLE0,
        "rank 0 iteration 5/20 consumed_samples 20 ",
        "rank 0 iteration 5/20 consumed_samples 16 ",
    )
    verdict = _load_failure(ref)
    assert verdict.reason == (
        "cycle 1 rank 0 restored consumed_samples 20 with iteration 5, but cycle 0 printed 16"
        " consumed samples at iteration 5: the restored data position is not the checkpoint's"
    )
    assert _where(verdict) == [f"{CYCLE1}:5", f"{CYCLE0}:11"]


# --- a line is the rank's it says it is --------------------------------------------------------


def _cannot_judge(run: Doctor, where: str) -> None:
    judgement = judge_run_dir(run.root)
    assert not judgement.judgeable and not judgement.passed, run_outcome(judgement).summary
    fatal = [p for p in judgement.problems if p.severity == "fatal"]
    assert fatal[0].message.startswith(f"{where} is prefixed as rank 1's line but says rank 0")
    assert verify_main([str(run.root)], io.StringIO(), io.StringIO()) == 2


def test_a_load_line_under_another_ranks_prefix_cannot_be_judged(ref: Doctor) -> None:
    """``1: ... rank 0 load ...``: rank 1 has no load line of its own; which rank loaded what is
    unknown."""
    ref.replace(
        CYCLE1,
        "+00:00 rank 1 load checkpoint iteration 5",
        "+00:00 rank 0 load checkpoint iteration 5",
    )
    _cannot_judge(ref, f"{CYCLE1}:6")


def test_a_block_of_lines_moved_to_another_rank_cannot_be_judged(ref: Doctor) -> None:
    """``sed -i '7,28s#^0: #1: #'``: rank 0's iteration and save lines shown as rank 1's."""
    lines = ref.lines(CYCLE1)
    for i in range(6, 28):
        assert lines[i].startswith("0: "), lines[i]
        lines[i] = "1: " + lines[i][3:]
    ref.write_lines(CYCLE1, lines)
    _cannot_judge(ref, f"{CYCLE1}:7")


def test_only_a_workload_that_states_its_rank_is_held_to_it() -> None:
    line = "[ref] 2026-11-30T16:22:18.173+00:00 rank 1 load checkpoint iteration 5 (model)"
    assert stated_rank(REFERENCE, line) == 1
    assert stated_rank(REFERENCE, "[pytest-nvrx injector] rank 1 pid 692: ...") is None
    assert stated_rank(MEGATRON, " [2026-11-30 13:44:09] iteration 6/ 30 | rank 1") is None


# --- Megatron's load lines name the directory they load from -----------------------------------


def test_megatron_load_lines_carry_their_directory() -> None:
    at = LineCursor("logs/train_cycle1.log")
    started = MEGATRON.parse_line(f" {G2_LOADING}", at)
    loaded = MEGATRON.parse_line(f"  {G2_LOADED}, gtp_remat 1/1, p 1/1 ] at iteration 5", at)
    assert isinstance(started, LoadStarted) and started.directory == G2_DIR
    assert isinstance(loaded, LoadCompleted) and loaded.directory == G2_DIR
    assert loaded.path is None and loaded.iteration == 5


@pytest.mark.parametrize(
    ("edited", "first"),
    [((G2_LOADING, G2_LOADED), 957), ((G2_LOADING,), 957), ((G2_LOADED,), 976)],
    ids=["both", "loading", "loaded"],
)
def test_megatron_loading_from_another_directory_fails(
    g2: Doctor, edited: tuple[str, ...], first: int
) -> None:
    for line in edited:
        g2.replace(CYCLE1, line, line.replace("/g2-kill-30/", "/OTHER/"))
    verdict = _load_failure(g2)
    assert verdict.reason == (
        "replacement cycle 1 loads from /tmp/w/runs/OTHER/checkpoints, not from"
        f" {G2_DIR}, its own load setting"
    )
    # the load line, the setting it contradicts, then the completed load
    assert (
        _where(verdict)
        == [f"{CYCLE1}:{first}", f"{CYCLE1}:395", f"{CYCLE1}:976"][: 2 if first == 976 else 3]
    )


def test_megatron_loading_from_its_load_setting_that_is_not_the_failed_save_fails(
    g2: Doctor,
) -> None:
    """The replacement's load setting and its load lines agree on another directory than the
    failed cycle's save: the setting check (load vs save) says so first."""
    g2.replace(CYCLE1, f"load ............................................ {G2_DIR}", "")
    g2.replace(CYCLE1, G2_LOADING, G2_LOADING.replace("/g2-kill-30/", "/OTHER/"))
    verdict = _load_failure(g2)
    assert verdict.reason == (
        "replacement cycle 1 loads from /tmp/w/runs/OTHER/checkpoints, not from"
        f" {G2_DIR} where cycle 0 saved its checkpoints"
    )
    assert _where(verdict) == [f"{CYCLE1}:957", f"{CYCLE0}:716", f"{CYCLE1}:976"]
