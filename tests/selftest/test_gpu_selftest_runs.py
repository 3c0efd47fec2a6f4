"""The Megatron self-test's real H200 runs (#25), re-judged here with the current criteria.

``tests/data/gpu-selftest/<revision>/``: one run per plant and the control, made on the device by
``scripts/device_gpu_suite.sh --selftest`` on Megatron ``core_v0.19.0`` and ``core_v0.18.2``
(README.md there). Each committed run must come out as the device's ``selftest.json`` says:
the control qualified, every plant caught by its documented criterion (``rank-checkpoint`` was
skipped: one GPU, one rank). Doctored copies must not: without their plant records they were not
applied; at a tolerance that admits the RNG plant's loss differences it is missed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from pytest_nvrx.criteria import judge_run_dir
from pytest_nvrx.criteria.selftest_outcome import PlantOutcome, control_outcome, plant_outcome
from pytest_nvrx.evidence.plant_records import read_plant_records
from pytest_nvrx.layout import PLANT_RECORDS_DIR
from pytest_nvrx.selftest.run import JSON_SCHEMA_VERSION, SelftestResult
from pytest_nvrx.settings.plants import PLANTS, plant_named

DATA = Path(__file__).parents[1] / "data" / "gpu-selftest"
REVISIONS = ("core_v0.19.0", "core_v0.18.2")


def _document(revision: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / revision / "selftest.json").read_text())
    return data


def _outcome(run_dir: Path, name: str, rtol: float = 0.0) -> PlantOutcome:
    judgement = judge_run_dir(run_dir, None, continuity_rtol=rtol)
    if name == "control":
        return control_outcome(judgement)
    return plant_outcome(plant_named(name), judgement, read_plant_records(run_dir), rtol=rtol)


CASES = [
    (revision, o["plant"])
    for revision in REVISIONS
    for o in _document(revision)["outcomes"]
    if o["status"] != "skipped"
]


def test_the_document_names_its_schema_as_verify_and_report_do() -> None:
    """``schema_version``, the key of verify's and the report's JSON (schema 1, the device's
    committed document, called it ``schema``); every other key as it was."""
    device = _document(REVISIONS[0])
    control = _outcome(DATA / REVISIONS[0] / "control", "control")
    doc = SelftestResult("megatron", 0.0, (control,)).as_dict()
    assert doc["schema_version"] == JSON_SCHEMA_VERSION == 2 and "schema" not in doc
    assert device["schema"] == 1 and set(device) - {"schema"} == set(doc) - {"schema_version"}
    assert doc["outcomes"][0].keys() == device["outcomes"][0].keys()


@pytest.mark.parametrize(("revision", "name"), CASES, ids=[f"{r}-{n}" for r, n in CASES])
def test_each_committed_run_is_judged_as_on_the_device(revision: str, name: str) -> None:
    device = next(o for o in _document(revision)["outcomes"] if o["plant"] == name)
    outcome = _outcome(DATA / revision / name, name)
    assert outcome.status == device["status"], outcome.reason
    assert list(outcome.failed) == device["caught_by"]
    if name == "control":
        assert outcome.status == "qualified"
        return
    plant = plant_named(name)
    assert outcome.status == "caught", outcome.reason
    assert outcome.reason.startswith(f"caught by {plant.caught_by}: ")
    # what the plant did, quoted from the record its worker wrote
    action = read_plant_records(DATA / revision / name).applied[0].action
    assert action in outcome.evidence[0].render()


@pytest.mark.parametrize("revision", REVISIONS)
def test_the_device_self_test_passed_on_the_revision_it_names(revision: str) -> None:
    document = _document(revision)
    assert document["exit_status"] == 0, document["summary"]
    assert document["stack"]["megatron_describe"] == revision
    assert document["stack"]["gpu"] == "NVIDIA H200"
    statuses = {o["plant"]: o["status"] for o in document["outcomes"]}
    assert statuses == {
        "control": "qualified",
        **{p.name: "caught" for p in PLANTS if p.min_world == 1},
        **{p.name: "skipped" for p in PLANTS if p.min_world > 1},
    }
    for o in document["outcomes"]:
        if o["status"] == "skipped":
            continue  # nothing launched
        run = json.loads((DATA / revision / o["plant"] / "run.json").read_text())
        assert run["config"]["selftest"] is True
        assert run["config"]["plant"] == (None if o["plant"] == "control" else o["plant"])


@pytest.mark.parametrize("revision", REVISIONS)
def test_a_copy_without_its_plant_records_was_not_applied(revision: str, tmp_path: Path) -> None:
    copy = tmp_path / "rng"
    shutil.copytree(DATA / revision / "rng", copy)
    shutil.rmtree(copy / PLANT_RECORDS_DIR)
    outcome = _outcome(copy, "rng")
    assert outcome.status == "not-applied", outcome.reason
    assert outcome.reason.startswith("plant not applied: no worker recorded acting")


@pytest.mark.parametrize("revision", REVISIONS)
def test_a_tolerance_that_admits_the_rng_plant_misses_it(revision: str) -> None:
    """On this stack, dropped RNG state moves the replayed loss by less than 5%: at rtol 0.05
    the qualification would pass that bug, and the self-test says so (exit 1)."""
    outcome = _outcome(DATA / revision / "rng", "rng", rtol=0.05)
    assert outcome.status == "missed", outcome.reason
    assert outcome.reason.startswith(
        "on this stack, at rtol 0.05, a replacement that restores weights, optimizer and"
        " counters but leaves every random generator as the fresh process seeded it"
    )
    assert "would be QUALIFIED" in outcome.reason
    assert _outcome(DATA / revision / "rng", "rng", rtol=0.01).status == "caught"
