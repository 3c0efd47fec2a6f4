"""run.json against the settings the run printed (criteria/manifest_agreement.py), on doctored
copies of committed real runs: the launcher's launch-config block is compared as text (the
launcher prints run.json's values as they are), Megatron's argument dump as numbers (its floats
and ints print their own ways); a disagreement is a run that cannot be judged (exit 2), both
lines named.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from pytest_nvrx.criteria import judge_run_dir
from pytest_nvrx.verify import verify_main
from tests.helpers.doctor import CYCLE0, CYCLE1, LAUNCHER, Doctor, copy_run

DATA = Path(__file__).parents[1] / "data"
REF_KILL_SAVE = DATA / "windows" / "cpu" / "ref-kill-save"
MEG_KILL_SAVE = DATA / "windows" / "gpu" / "g2-kill-save"
RUN_JSON = "run.json"


def _cannot_judge(run: Doctor, said: str) -> None:
    judgement = judge_run_dir(run.root)
    assert not judgement.judgeable and not judgement.passed
    out, err = io.StringIO(), io.StringIO()
    code = verify_main([str(run.root)], out, err)
    text = out.getvalue() + err.getvalue()
    assert code == 2, text
    assert f"{said}: run.json is not the record of the run that printed it" in text, text


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        (
            "  run_id           : ks1",
            "  run_id           : zz9",
            "run_id zz9, but run.json:7 records ks1",
        ),
        # the launcher prints max_restarts as the int it was given: 3.0 is no text it prints
        (
            "  max_restarts     : 3",
            "  max_restarts     : 3.0",
            "max_restarts 3.0, but run.json:26 records 3",
        ),
        (
            "  min_nodes        : 1",
            "  min_nodes        : 01",
            "min_nodes 01, but run.json:13 records 1",
        ),
    ],
)
def test_a_launch_config_value_other_than_run_jsons_cannot_be_judged(
    tmp_path: Path, old: str, new: str, said: str
) -> None:
    run = copy_run(REF_KILL_SAVE, tmp_path / "run")
    at = run.line_no(LAUNCHER, old)
    run.replace(LAUNCHER, old, new)
    _cannot_judge(run, f"{LAUNCHER}:{at} says {said}")


def test_an_argument_dump_entry_other_than_run_jsons_cannot_be_judged(tmp_path: Path) -> None:
    run = copy_run(MEG_KILL_SAVE, tmp_path / "run")
    old = "0:   train_iters ..................................... 30"
    at = run.line_no(CYCLE0, old)
    run.replace(CYCLE0, old, old.replace("30", "31"))
    _cannot_judge(run, f"{CYCLE0}:{at} says train_iters 31, but run.json:17 records 30")


def test_an_argument_dump_number_printed_another_way_agrees(tmp_path: Path) -> None:
    before = judge_run_dir(MEG_KILL_SAVE)
    run = copy_run(MEG_KILL_SAVE, tmp_path / "run")
    old = "0:   save_interval ................................... 5"
    for log in (CYCLE0, CYCLE1):  # every cycle alike: resume_settings compares them as text
        run.replace(log, old, old + ".0")
    after = judge_run_dir(run.root)
    assert after.judgeable == before.judgeable
    assert [v.headline() for v in after.verdicts] == [v.headline() for v in before.verdicts]
