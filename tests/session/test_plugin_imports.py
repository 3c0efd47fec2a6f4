"""What the plugin imports where it is not used (issue #38): importing ``pytest_nvrx.plugin``, and
a whole session of a project that has no scenario of ours and gives no ``--nvrx-*`` option, load
none of the criteria, the evidence parsers, the launch, the session's runs or the report; a
session that collects our scenarios, or is given an ``--nvrx-*`` option, loads what it needs.
The time it saves: benchmarks/bench_plugin_import.py (docs/performance.md).

Fresh interpreters (subprocesses): this test session has imported everything long ago."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

#: the stages a session of a project that does not use pytest-nvrx must not import
HEAVY = (
    "pytest_nvrx.criteria",
    "pytest_nvrx.evidence",
    "pytest_nvrx.report",
    "pytest_nvrx.launch",
    "pytest_nvrx.session",
    "pytest_nvrx.selftest",
    "pytest_nvrx.compare",
    "pytest_nvrx.outputs",
)

#: a conftest that records, at the session's very end, which of our modules were imported
RECORDER = """
import json, os, sys

def pytest_unconfigure(config):
    ours = sorted(m for m in sys.modules if m.startswith("pytest_nvrx"))
    with open(os.environ["IMPORTED_OUT"], "w") as fh:
        json.dump(ours, fh)
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "NVRX_"))}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if m.startswith(HEAVY)]


def test_importing_the_plugin_imports_no_stage_of_the_run(tmp_path: Path) -> None:
    code = (
        "import json, sys; import pytest_nvrx.plugin; "
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('pytest_nvrx'))))"
    )
    # (from elsewhere than a checkout: python -c puts its directory first on sys.path)
    argv = [sys.executable, "-c", code]
    env = _env()
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    imported = json.loads(done.stdout)
    assert "pytest_nvrx.plugin" in imported and "pytest_nvrx.fixtures" in imported
    assert heavy(imported) == [], imported


def _session(project: Path, *args: str) -> list[str]:
    """Our modules imported by a pytest session in ``project`` (run with ``args``)."""
    out = project / "imported.json"
    out.unlink(missing_ok=True)
    env = {**_env(), "IMPORTED_OUT": str(out)}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"]
    done = subprocess.run(
        [*argv, "-p", "no:xdist", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode in (0, 5), done.stdout[-3000:] + done.stderr[-3000:]
    imported: list[str] = json.loads(out.read_text())
    return imported


def test_a_project_that_does_not_use_the_plugin_loads_none_of_it(tmp_path: Path) -> None:
    """A project's own session (its tests run, pass and are reported, -rA): the plugin's hooks
    run for every item and at every stage, and import nothing heavy; a session of ours does."""
    (tmp_path / "conftest.py").write_text(RECORDER)
    (tmp_path / "test_trivial.py").write_text(
        "import pytest\n\n@pytest.mark.parametrize('x', [1, 2])\n"
        "def test_one(x):\n    assert x + 1 > x\n"
    )
    own = _session(tmp_path, "-rA", "--junitxml", str(tmp_path / "junit.xml"))
    assert "pytest_nvrx.plugin" in own, own  # the plugin was loaded and its hooks ran
    assert heavy(own) == [], own
    # what does load them: our scenarios collected, or an --nvrx-* option used
    suite = _session(tmp_path, "--pyargs", "pytest_nvrx.suite", "--collect-only", "-m", "not gpu")
    assert "pytest_nvrx.session.scenarios" in suite and "pytest_nvrx.criteria" in suite, suite
    option = _session(tmp_path, "--nvrx-report", str(tmp_path / "r.html"))
    assert "pytest_nvrx.outputs" in option, option
