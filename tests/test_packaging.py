"""The built wheel is what users install: entry point, typed marker, shipped suite, metadata.

Installed apart from the repository, it must find its plugin through the entry point and run
the shipped suite with ``--pyargs`` (collection only: no run is launched here).
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(out)],
        cwd=REPO, check=True, capture_output=True,
    )  # fmt: skip
    (built,) = out.glob("pytest_nvrx-*.whl")
    return built


def test_wheel_contents(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "pytest_nvrx/py.typed",
        "pytest_nvrx/plugin.py",
        "pytest_nvrx/injector.py",
        "pytest_nvrx/suite/test_recovery.py",
        "pytest_nvrx/workloads/reference.py",
        "pytest_nvrx/evidence/megatron.py",
        "pytest_nvrx/evidence/replay.py",
        "pytest_nvrx/criteria/__init__.py",
        "pytest_nvrx/criteria/training_continuity.py",
    ):
        assert needed in names
    assert not any(n.startswith("tests/") for n in names)
    dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
    zf = zipfile.ZipFile(wheel)
    entry_points = zf.read(f"{dist_info}/entry_points.txt").decode()
    assert "[pytest11]" in entry_points and "nvrx = pytest_nvrx.plugin" in entry_points
    metadata = zf.read(f"{dist_info}/METADATA").decode()
    for requirement in ("pytest", "pytest-timeout", "torch", "megatron-core", "filelock"):
        assert f"Requires-Dist: {requirement}" in metadata
    assert "Requires-Dist: nvidia-resiliency-ext<0.8,>=0.7" in metadata
    assert "Requires-Python: >=3.12" in metadata
    assert "Classifier: Framework :: Pytest" in metadata


def test_installed_wheel_runs_the_shipped_suite(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    # A pure-Python wheel installs by unpacking it onto the path (the venv has no pip).
    zipfile.ZipFile(wheel).extractall(site)
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("MEGATRON_PATH", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "pytest_nvrx.suite", "--collect-only",
         "-q", "-p", "no:cacheprovider", "-m", "gpu and kill"],
        cwd=tmp_path, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # run finished + six criteria for megatron-kill-save, out of 7 x 14 default scenarios
    assert "7/98 tests collected" in proc.stdout
    # collected from the installed copy (relative to cwd), not from the checkout
    assert "site/pytest_nvrx/suite/test_recovery.py::" in proc.stdout
