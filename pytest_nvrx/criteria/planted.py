"""Is a run planted: every label a self-test plant leaves, and whether they agree.

A planted run (the self-test's known recovery bug) is never a qualification, whatever its
verdicts, and any one of its labels makes it planted:

* run.json's ``config.plant``;
* the marker's ``plant`` (the injector copies ``PYTEST_NVRX_PLANT``);
* the launch environment run.json records (``env`` and the ``command`` that spelled it:
  ``PYTEST_NVRX_PLANT``, ``PYTEST_NVRX_PLANT_RECORDS``, the plant hook on the workers'
  ``PYTHONPATH``: ``Manifest.plant_labels``);
* a record under ``plant-records/`` (written by the worker whose plant acted);
* a self-test run (``config.selftest`` true) whose run id names a plant
  (``<workload>-selftest-<plant>-<time>``; the unplanted control's says ``control``).

``selftest`` alone does not: the control is a self-test run too, and the one that must qualify.
The plant's name is the first label that gives one (:data:`UNNAMED` where none does). A label
that contradicts run.json's ``config.plant`` (a plant named where it names none or another, a
plant installed where it names none) is fatal (:func:`plant_label_problems`): the marker's and the
records' own disagreements are judged by marker_agreement.py and consistency.py.
"""

from __future__ import annotations

import re

from pytest_nvrx.evidence.manifest import PlantLabel
from pytest_nvrx.evidence.plant_records import read_plant_records
from pytest_nvrx.evidence.refs import Problem
from pytest_nvrx.evidence.rundir import RunEvidence
from pytest_nvrx.settings.plants import PLANTS

#: the name of a plant that a label installs without naming it
UNNAMED = "unnamed"
_RUN_ID = re.compile(r"-selftest-(?P<rest>.+)$")


def _run_id_label(run: RunEvidence) -> PlantLabel | None:
    """The plant a self-test run's id names (``megatron-selftest-rng-20261202T...``)."""
    manifest = run.manifest
    if manifest is None or not manifest.is_selftest or manifest.run_id is None:
        return None
    m = _RUN_ID.search(str(manifest.run_id.value))
    if m is None:
        return None
    rest = m["rest"]
    named = [p.name for p in PLANTS if rest == p.name or rest.startswith(f"{p.name}-")]
    if not named:
        return None
    name = max(named, key=len)
    return PlantLabel(name, f"the self-test run id names plant {name!r}", manifest.run_id.ref)


def plant_labels(run: RunEvidence) -> list[PlantLabel]:
    """Every label of a plant the run carries, besides run.json's ``config.plant``."""
    labels: list[PlantLabel] = []
    marker = run.marker
    if marker is not None and marker.ok and marker.plant is not None:
        labels.append(PlantLabel(marker.plant, "the marker's plant", marker.ref("plant")))
    if run.manifest is not None:
        labels += run.manifest.plant_labels
    records = read_plant_records(run.run_dir)
    labels += [PlantLabel(r.plant, "a plant record", r.ref) for r in records.records[:1]]
    by_id = _run_id_label(run)
    if by_id is not None:
        labels.append(by_id)
    return labels


def planted_name(run: RunEvidence) -> str | None:
    """The plant the run carries: run.json's, else the first label's that names one, else
    :data:`UNNAMED` where a label installs one unnamed; None: no label of a plant."""
    manifest = run.manifest
    if manifest is not None and manifest.planted is not None:
        return manifest.planted
    labels = plant_labels(run)
    if not labels:
        return None
    return next((label.name for label in labels if label.name is not None), UNNAMED)


def plant_label_problems(run: RunEvidence) -> tuple[Problem, ...]:
    """The launch environment's or the run id's label against run.json's ``config.plant``:
    naming another plant, or one where run.json names none, or installing one where it names
    none (fatal: a planted run cannot be judged as another run)."""
    manifest = run.manifest
    if manifest is None:
        return ()
    claimed = manifest.planted
    where = (
        f"{manifest.plant.ref.location} (config.plant)"
        if manifest.plant is not None
        else f"{manifest.file} (no config.plant)"
    )
    labels = list(manifest.plant_labels)
    by_id = _run_id_label(run)
    if by_id is not None:
        labels.append(by_id)
    for label in labels:
        if label.name == claimed or (label.name is None and claimed is not None):
            continue
        named = "no plant" if claimed is None else f"plant {claimed!r}"
        return (
            Problem(
                "fatal",
                f"{label.ref.location}: {label.what}, but {where} names {named}: a planted run"
                " cannot be judged as another run",
                label.ref,
            ),
        )
    return ()
