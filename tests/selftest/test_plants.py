"""The self-test's plants (#25): the catalogue, the patch-point check, and the import hook that
plants a bug into Megatron's modules as they load, in a real interpreter started the way a worker
is (the hook's directory first on PYTHONPATH).

The hook is driven twice: over a fake checkout whose functions are plain stand-ins (so each patch
is seen acting, or refusing), and over the Megatron-LM installed in this venv (megatron-core), where
the patched names must be the ones ``megatron.training.training`` imports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_nvrx.settings import plants
from pytest_nvrx.worker.plant_hook import nvrx_plants

HOOK_DIR = Path(nvrx_plants.__file__).parent


def test_the_hook_repeats_the_catalogue_names() -> None:
    assert tuple(p.name for p in plants.PLANTS) == nvrx_plants.PLANT_NAMES
    assert set(nvrx_plants.MEGATRON_POINTS) == set(nvrx_plants.PLANT_NAMES)
    assert set(nvrx_plants.RESTORE_PLANTS) == {p.name for p in plants.PLANTS if p.in_restore}


def test_every_plant_names_a_criterion_that_exists() -> None:
    from pytest_nvrx.criteria.verdict import CRITERIA_IDS

    for plant in plants.PLANTS:
        assert plant.caught_by in CRITERIA_IDS, plant
    with pytest.raises(KeyError, match="the catalogue: rng, optimizer-reset"):
        plants.plant_named("nope")


FAKE_CHECKPOINTING = """
import os
LOADS = []

def get_checkpoint_tracker_filename(path):
    return os.path.join(path, "latest_checkpointed_iteration.txt")

def read_metadata(tracker_filename):
    with open(tracker_filename) as f:
        return int(f.read()), False

def load_checkpoint(ddp_model, optimizer, opt_param_scheduler, load_arg="load"):
    import megatron.training.global_vars as g
    it, _ = read_metadata(get_checkpoint_tracker_filename(g.get_args().load))
    LOADS.append((it, g.get_args().no_load_rng))
    return it, 0.0

def save_checkpoint(iteration, model, optimizer, opt_param_scheduler, flops, **kw):
    return None
"""
FAKE_TRAINING = """
from megatron.training.checkpointing import load_checkpoint, save_checkpoint
from megatron.training.datasets.data_samplers import build_pretraining_data_loader
"""
FAKE_GLOBAL_VARS = """
import types
ARGS = types.SimpleNamespace(no_load_rng=None, load=None, save=None, async_save=True)
def get_args():
    return ARGS
"""
FAKE_SAMPLERS = """
def build_pretraining_data_loader(dataset, consumed_samples):
    return ("loader", consumed_samples)
"""
FAKE_SCHEDULER = """
class OptimizerParamScheduler:
    def __init__(self):
        self.num_steps = 0
    def load_state_dict(self, state_dict):
        self.num_steps = state_dict["num_steps"]
"""


def _fake_checkout(root: Path, *, without: str | None = None) -> Path:
    files = {
        "megatron/__init__.py": "",
        "megatron/training/__init__.py": "",
        "megatron/training/checkpointing.py": FAKE_CHECKPOINTING,
        "megatron/training/training.py": FAKE_TRAINING,
        "megatron/training/global_vars.py": FAKE_GLOBAL_VARS,
        "megatron/training/datasets/__init__.py": "",
        "megatron/training/datasets/data_samplers.py": FAKE_SAMPLERS,
        "megatron/core/__init__.py": "",
        "megatron/core/optimizer_param_scheduler.py": FAKE_SCHEDULER,
    }
    for rel, text in files.items():
        if without is not None:
            text = text.replace(f"def {without}(", f"def renamed_{without}(")
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def _worker(
    checkout: Path, plant: str, code: str, records: Path, restarts: int = 1, **env: str
) -> str:
    """Run ``code`` as a worker of a planted run would start: the hook first on PYTHONPATH."""
    environ = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HOOK_DIR), str(checkout)]),
        nvrx_plants.PLANT_ENV: plant,
        nvrx_plants.RECORDS_ENV: str(records),
        nvrx_plants.RESTART_COUNT_ENV: str(restarts),
        "RANK": "1",
        "WORLD_SIZE": "2",
        **env,
    }
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=environ,
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _records(folder: Path) -> list[dict[str, object]]:
    if not folder.is_dir():
        return []
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


def _checkpoints(root: Path, *iterations: int, tracker: int) -> Path:
    ckpt = root / "ckpt"
    for n in iterations:
        (ckpt / f"iter_{n:07d}").mkdir(parents=True)
        (ckpt / f"iter_{n:07d}" / ".metadata").write_text("x")
    (ckpt / "latest_checkpointed_iteration.txt").write_text(str(tracker))
    return ckpt


LOAD = """
import megatron.training.global_vars as g
g.ARGS.load = {ckpt!r}
from megatron.training import training
import megatron.training.checkpointing as c
print(training.load_checkpoint(None, "OPT", None), c.LOADS)
"""


def test_iteration_plant_moves_the_counter_in_a_replacement_only(tmp_path: Path) -> None:
    checkout = _fake_checkout(tmp_path / "meg")
    ckpt = _checkpoints(tmp_path, 5, 10, tracker=10)
    records = tmp_path / "records"
    out = _worker(checkout, "iteration", LOAD.format(ckpt=str(ckpt)), records)
    assert out.strip() == "(15, 0.0) [(10, None)]"
    (rec,) = _records(records)
    assert rec["plant"] == "iteration" and rec["applied"] is True and rec["rank"] == 1
    assert rec["action"] == "restored iteration counter set to 15 after loading iteration 10"
    assert rec["restart_count"] == 1 and rec["pid"] != os.getpid()
    # cycle 0 is no replacement: nothing planted, nothing recorded
    fresh = tmp_path / "fresh"
    out = _worker(checkout, "iteration", LOAD.format(ckpt=str(ckpt)), fresh, restarts=0)
    assert out.strip() == "(10, 0.0) [(10, None)]"
    assert _records(fresh) == []


def test_rng_plant_loads_with_no_load_rng_and_puts_it_back(tmp_path: Path) -> None:
    checkout = _fake_checkout(tmp_path / "meg")
    ckpt = _checkpoints(tmp_path, 5, tracker=5)
    code = LOAD.format(ckpt=str(ckpt)) + "print(g.ARGS.no_load_rng)\n"
    out = _worker(checkout, "rng", code, tmp_path / "r")
    assert out.split("\n")[:2] == ["(5, 0.0) [(5, True)]", "None"]
    (rec,) = _records(tmp_path / "r")
    assert "left every RNG state" in str(rec["action"])


def test_previous_checkpoint_plant_reads_the_tracker_as_the_complete_one_before(
    tmp_path: Path,
) -> None:
    checkout = _fake_checkout(tmp_path / "meg")
    ckpt = _checkpoints(tmp_path, 5, 10, tracker=15)
    (ckpt / "iter_0000015").mkdir()  # 15 is named but incomplete: still the tracker's
    (ckpt / "iter_0000012").mkdir()  # incomplete: never the one fallen back to
    out = _worker(checkout, "previous-checkpoint", LOAD.format(ckpt=str(ckpt)), tmp_path / "r")
    assert out.strip() == "(10, 0.0) [(10, None)]"
    (rec,) = _records(tmp_path / "r")
    assert rec["tracker"] == 15 and rec["loaded"] == 10
    # rank-checkpoint acts on the last rank only
    out = _worker(
        checkout, "rank-checkpoint", LOAD.format(ckpt=str(ckpt)), tmp_path / "r0", RANK="0"
    )
    assert out.strip() == "(15, 0.0) [(15, None)]"
    assert _records(tmp_path / "r0") == []


def test_a_plant_with_nothing_to_fall_back_to_records_that_it_did_not_act(tmp_path: Path) -> None:
    checkout = _fake_checkout(tmp_path / "meg")
    ckpt = _checkpoints(tmp_path, 5, tracker=5)
    out = _worker(checkout, "previous-checkpoint", LOAD.format(ckpt=str(ckpt)), tmp_path / "r")
    assert out.strip() == "(5, 0.0) [(5, None)]"
    (rec,) = _records(tmp_path / "r")
    assert rec["applied"] is False
    assert rec["action"] == "cannot plant: no complete checkpoint before iteration 5"


def test_data_plant_builds_the_training_loader_from_sample_zero_once(tmp_path: Path) -> None:
    checkout = _fake_checkout(tmp_path / "meg")
    code = """
    from megatron.training import training
    build = training.build_pretraining_data_loader
    print(build("ds", 40), build("v", 8))
    """
    out = _worker(checkout, "data", code, tmp_path / "r")
    assert out.strip() == "('loader', 0) ('loader', 8)"
    (rec,) = _records(tmp_path / "r")
    assert rec["consumed_samples"] == 40


def test_scheduler_plant_leaves_the_schedule_fresh(tmp_path: Path) -> None:
    checkout = _fake_checkout(tmp_path / "meg")
    code = """
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    s = OptimizerParamScheduler()
    s.load_state_dict({"num_steps": 7})
    print(s.num_steps)
    """
    assert _worker(checkout, "scheduler", code, tmp_path / "r").strip() == "0"
    (rec,) = _records(tmp_path / "r")
    assert rec["num_steps"] == 7


def test_tracker_at_submit_plant_writes_the_tracker_when_a_save_is_submitted(
    tmp_path: Path,
) -> None:
    checkout = _fake_checkout(tmp_path / "meg")
    ckpt = _checkpoints(tmp_path, 5, tracker=5)
    code = f"""
    import megatron.training.global_vars as g
    g.ARGS.save = {str(ckpt)!r}
    from megatron.training import training
    training.save_checkpoint(10, None, None, None, 0.0)
    print(open({str(ckpt / "latest_checkpointed_iteration.txt")!r}).read())
    """
    # every cycle, not only replacements
    out = _worker(checkout, "tracker-at-submit", code, tmp_path / "r", restarts=0)
    assert out.strip() == "10"
    (rec,) = _records(tmp_path / "r")
    assert rec["iteration"] == 10 and rec["restart_count"] == 0


def test_a_missing_patch_point_is_found_before_and_recorded_when_loading(tmp_path: Path) -> None:
    checkout = _fake_checkout(tmp_path / "meg", without="load_checkpoint")
    plant = plants.plant_named("iteration")
    assert plants.missing_patch_points(checkout, plant) == (
        "megatron.training.checkpointing.load_checkpoint",
    )
    complete = _fake_checkout(tmp_path / "full")
    assert all(plants.missing_patch_points(complete, p) == () for p in plants.PLANTS)
    assert plants.missing_patch_points(tmp_path / "nowhere", plant) == (
        "megatron.training.checkpointing.load_checkpoint",
    )
    _worker(checkout, "iteration", "import megatron.training.checkpointing", tmp_path / "r")
    (rec,) = _records(tmp_path / "r")
    assert rec["applied"] is False
    assert rec["action"] == ("cannot plant: megatron.training.checkpointing has no load_checkpoint")


def test_the_hook_runs_the_sitecustomize_it_hides(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("print('theirs ran')\n")
    checkout = _fake_checkout(tmp_path / "meg")
    out = _worker(
        checkout,
        "iteration",
        "import sys; print(type(sys.meta_path[0]).__name__)",
        tmp_path / "r",
        PYTHONPATH=os.pathsep.join([str(HOOK_DIR), str(other), str(checkout)]),
    )
    assert out.split() == ["theirs", "ran", "_Finder"]


def test_no_plant_asked_for_installs_nothing(tmp_path: Path) -> None:
    checkout = _fake_checkout(tmp_path / "meg")
    code = "import sys; print(any(type(f).__name__ == '_Finder' for f in sys.meta_path))"
    assert _worker(checkout, "", code, tmp_path / "r").strip() == "False"


#: Two interpreters of real Megatron (each ~7 s of imports): the checkpointing module's patches
#: and the data loader's, both names ``training`` imports from them before it runs; the fake
#: checkout above drives every plant's patch.
REAL_PLANTS = ("previous-checkpoint", "data")


def test_real_megatron_modules_are_patched_where_training_imports_them(tmp_path: Path) -> None:
    """megatron-core of this venv: every plant's points exist, and after ``import
    megatron.training.training`` the names it imported are the wrapped ones."""
    pytest.importorskip("megatron.training.checkpointing")
    code = """
    import warnings; warnings.simplefilter("ignore")
    import megatron.training.training as t
    import megatron.training.checkpointing as c
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler as S
    print(hasattr(t.load_checkpoint, "__wrapped__"), hasattr(c.read_metadata, "__wrapped__"),
          hasattr(t.build_pretraining_data_loader, "__wrapped__"),
          hasattr(S.load_state_dict, "__wrapped__"), hasattr(t.save_checkpoint, "__wrapped__"))
    """
    empty = tmp_path / "empty"
    empty.mkdir()
    got = {plant: _worker(empty, plant, code, tmp_path / plant).split() for plant in REAL_PLANTS}
    assert got == {
        "previous-checkpoint": ["True", "True", "False", "False", "False"],
        "data": ["False", "False", "True", "False", "False"],
    }
    for plant in REAL_PLANTS:
        assert _records(tmp_path / plant) == []  # nothing acted, nothing refused


def test_a_run_that_plants_nothing_refuses_a_plant_in_its_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The workers inherit the harness's environment: a qualification run (CLI or plugin, both
    plan through plan_launch) started where PYTEST_NVRX_PLANT is set would carry the plant."""
    from pytest_nvrx.cli import main

    monkeypatch.setenv(nvrx_plants.PLANT_ENV, "rng")
    argv = ["run", "--workload", "reference", "--work-dir", str(tmp_path), "--dry-run"]
    assert main(argv, environ={}) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "PYTEST_NVRX_PLANT='rng' is set in this environment" in err[0]
    assert "a planted run is never a qualification" in err[0]
    assert not (tmp_path / "runs").exists()  # nothing written, nothing launched
    monkeypatch.delenv(nvrx_plants.PLANT_ENV)
    assert main(argv, environ={}) == 0
