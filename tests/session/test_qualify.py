"""``./qualify``: the JUnit report is replaced only when tests ran, and ``--lf`` works.

Each test runs the real script from a copy of it in a scratch directory, so that its
``qualification-junit.xml`` and ``.pytest_cache`` are the test's own. The copy's
``scripts/bootstrap.sh`` does nothing (the real one syncs ``.venv``; the copy's ``.venv`` is the
environment running these tests, already synced). One test qualifies a real reference scenario
(marked real_run); the other selections collect only, or pick GPU scenarios that skip without a
Megatron checkout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
JUNIT = "qualification-junit.xml"
PREVIOUS = '<?xml version="1.0"?><testsuites name="the last real qualification"/>\n'


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A copy of ``./qualify`` with a no-op bootstrap and this interpreter's environment."""
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    shutil.copy2(REPO / "qualify", root / "qualify")
    bootstrap = root / "scripts" / "bootstrap.sh"
    bootstrap.write_text("#!/bin/sh\nexit 0\n")
    bootstrap.chmod(0o755)
    (root / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    return root


def qualify(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # no Megatron: GPU scenarios skip; none of this session's pytest/xdist state leaks in
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "MEGATRON_PATH" and not k.startswith(("PYTEST_", "NVRX_"))
    }
    return subprocess.run(
        [str(root / "qualify"), *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def collected(proc: subprocess.CompletedProcess[str]) -> list[str]:
    """Node IDs listed by ``--co -qq`` (the script adds ``-v``: net ``-q``)."""
    return [line for line in proc.stdout.splitlines() if "::" in line]


def test_collect_only_leaves_the_previous_report(checkout: Path) -> None:
    (checkout / JUNIT).write_text(PREVIOUS)
    proc = qualify(checkout, "--co", "-qq")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    nodes = collected(proc)
    assert any("test_run_finished[reference-baseline]" in n for n in nodes), proc.stdout
    assert (checkout / JUNIT).read_text() == PREVIOUS
    assert f"qualify: no test ran; {JUNIT} left as it was" in proc.stdout


def test_collect_only_writes_no_report_where_there_was_none(checkout: Path) -> None:
    proc = qualify(checkout, "--collect-only", "-qq")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert collected(proc)
    assert not (checkout / JUNIT).exists()


def test_tests_that_ran_replace_the_report(checkout: Path) -> None:
    (checkout / JUNIT).write_text(PREVIOUS)
    # the GPU baseline without a Megatron checkout: its tests run and skip, nothing launches
    # (the plugin exits 5: nothing was qualified; the report says so with its skips)
    proc = qualify(checkout, "-m", "gpu", "-k", "baseline")
    assert proc.returncode == 5, proc.stdout + proc.stderr
    assert "every selected scenario was skipped" in proc.stdout
    assert f"qualify: JUnit report in {JUNIT}" in proc.stdout
    suite = ET.parse(checkout / JUNIT).getroot().find("testsuite")
    assert suite is not None
    cases = suite.findall("testcase")
    assert len(cases) == int(suite.attrib["tests"]) == int(suite.attrib["skipped"]) > 0
    assert all("megatron-baseline" in case.attrib["name"] for case in cases)


def test_last_failed_reruns_only_the_cached_failure(checkout: Path) -> None:
    everything = collected(qualify(checkout, "--co", "-qq"))
    failed = next(n for n in everything if "test_run_finished[reference-kill-save]" in n)
    cache = checkout / ".pytest_cache" / "v" / "cache"
    cache.mkdir(parents=True)
    (cache / "lastfailed").write_text(f'{{"{failed}": true}}\n')
    proc = qualify(checkout, "--co", "--lf", "-qq")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert collected(proc) == [failed]
    assert len(everything) > 1


@pytest.mark.real_run
def test_a_real_qualification_ends_with_the_table_and_writes_the_report(checkout: Path) -> None:
    """One real reference scenario through ./qualify with -qq (net -q): no progress lines, no
    repeated PASSED lines (no -rA), the verdict table last, the HTML report and its JSON
    (qualification-report.json, named after the page) written beside the JUnit report."""
    proc = qualify(checkout, "-qq", "-k", "reference-kill-save")
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "iteration 10/20" not in out and "cycle 1 starting" not in out  # -q: no progress
    assert "PASSED" not in out  # -rA repeated every passed test in the summary
    table = out[out.index("nvrx verdict table") :]
    rows = [line for line in table.splitlines() if line.startswith("reference-kill-save")]
    assert len(rows) == 1 and rows[0].split()[1] == "QUALIFIED", table
    html, json_path = checkout / "qualification-report.html", checkout / "qualification-report.json"
    assert f"nvrx report: {html} and {json_path} (1 scenario); JUnit: {checkout / JUNIT}" in table
    assert (checkout / "qualification-report.html").is_file()
    assert json_path.is_file() and (checkout / JUNIT).is_file()
    assert out.rstrip().splitlines()[-1] == f"qualify: JUnit report in {JUNIT}"


def test_the_readme_gpu_qualify_line_refuses_a_host_without_gpus(checkout: Path) -> None:
    """README's ``MEGATRON_PATH=/workspace/Megatron-LM ./qualify``, as written (the checkout
    moved to a stand-in), on a host without GPUs: red with the reason, nothing launched."""
    if shutil.which("nvidia-smi"):
        pytest.skip("this host has nvidia-smi: the line would qualify its GPUs")
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    (line,) = [ln.split("  #")[0].strip() for ln in readme.splitlines()
               if ln.startswith("MEGATRON_PATH=") and "./qualify" in ln]  # fmt: skip
    assert line == "MEGATRON_PATH=/workspace/Megatron-LM ./qualify", line
    megatron = checkout / "Megatron-LM"
    megatron.mkdir()
    (megatron / "pretrain_gpt.py").write_text("raise SystemExit('not a real Megatron')\n")
    env = {k: v for k, v in os.environ.items()
           if k != "MEGATRON_PATH" and not k.startswith(("PYTEST_", "NVRX_"))}  # fmt: skip
    proc = subprocess.run(
        ["bash", "-c", line.replace("/workspace/Megatron-LM", str(megatron))],
        cwd=checkout, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr
    assert "this host cannot run GPU scenarios: no NVIDIA GPU" in proc.stdout, proc.stdout[-3000:]
    assert "megatron-baseline" in proc.stdout
    assert not list(checkout.glob("**/runs/*")), "a run was launched"


def test_a_junitxml_given_to_qualify_is_pytests_alone(checkout: Path) -> None:
    """``./qualify --junitxml=mine.xml``: pytest writes that one; the script leaves its own
    report as it was and says nothing about it."""
    (checkout / JUNIT).write_text(PREVIOUS)
    proc = qualify(checkout, "-m", "gpu", "-k", "baseline", "--junitxml=mine.xml")
    assert proc.returncode == 5, proc.stdout + proc.stderr
    assert (checkout / JUNIT).read_text() == PREVIOUS
    assert "<testcase" in (checkout / "mine.xml").read_text()
    assert "qualify:" not in proc.stdout
