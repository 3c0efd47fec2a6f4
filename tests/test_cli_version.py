"""``python -m pytest_nvrx --version``: the tool's version and the stack it would qualify with,
read from installed metadata (issue #23: there was no ``--version``)."""

from __future__ import annotations

import importlib.metadata
import platform
import subprocess
import sys

from pytest_nvrx import __version__


def test_version_names_the_tool_nvrx_torch_and_python() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest_nvrx", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    nvrx = importlib.metadata.version("nvidia-resiliency-ext")
    torch = importlib.metadata.version("torch")
    assert done.stdout == (
        f"pytest-nvrx {__version__} (NVRx {nvrx}, torch {torch},"
        f" Python {platform.python_version()})\n"
    )
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, runpy; sys.argv = ['x', '--version']\n"
            "try:\n    runpy.run_module('pytest_nvrx', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "print('torch' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert probe.stdout.splitlines()[-1] == "False", probe.stdout + probe.stderr
