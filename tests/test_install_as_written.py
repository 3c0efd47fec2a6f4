"""The docs' clone, build and git-URL install lines, run as written (issue #23 item 6).

GitHub is not reachable from CI, so git itself is told, through its own configuration
(``url.<base>.insteadOf`` in ``GIT_CONFIG_*``), that ``https://github.com/pytest-nvrx/pytest-nvrx``
lives in a bare clone of this checkout. The command lines stay exactly as the docs print them;
git, uv and pip fetch ``HEAD`` of that clone as they would fetch GitHub's.

What the machine decides is checked as the docs say it: a plain ``pip install`` with dependencies
needs glibc >= 2.39 (NVRx ships only manylinux_2_39 wheels); on an older glibc the docs promise
pip stops with "No matching distribution found for nvidia-resiliency-ext<0.8,>=0.7", and that is
what the test expects there. On glibc >= 2.39 the same line runs with ``PIP_DRY_RUN=1`` (pip
resolves everything, downloading only metadata, not 3 GB of CUDA wheels).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.test_packaging import (
    DOCS,
    PROJECT_URL,
    REPO,
    RUNTIME_MODULES,
    Venv,
    fenced_lines,
    find_uv,
    hatchling_build,
    no_deps_route,
    nvrx_install,
    section,
    torch_install,
)

GIT_URL_SPEC = f"pytest-nvrx @ git+{PROJECT_URL}"
PIP_REFUSAL = "No matching distribution found for nvidia-resiliency-ext<0.8,>=0.7"


def glibc() -> tuple[int, int]:
    name, _, version = (os.confstr("CS_GNU_LIBC_VERSION") or "").partition(" ")
    assert name == "glibc", f"not a glibc system: {name!r}"
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


class Origin:
    """A bare clone of this checkout that git serves for the project's GitHub URL."""

    def __init__(self, root: Path) -> None:
        if not (REPO / ".git").exists():
            pytest.skip("not a git checkout: nothing to serve as the project's git URL")
        self.bare = root / "pytest-nvrx.git"
        subprocess.run(["git", "clone", "-q", "--bare", str(REPO), str(self.bare)], check=True)
        self.head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=self.bare, check=True, capture_output=True, text=True
        ).stdout.strip()
        self.git_env = {
            "GIT_CONFIG_COUNT": "1",
            "GIT_CONFIG_KEY_0": f"url.{self.bare.as_uri()}.insteadOf",
            "GIT_CONFIG_VALUE_0": PROJECT_URL,
            "GIT_TERMINAL_PROMPT": "0",
        }


@pytest.fixture(scope="module")
def origin(tmp_path_factory: pytest.TempPathFactory) -> Origin:
    return Origin(tmp_path_factory.mktemp("origin"))


@pytest.fixture
def venvs(tmp_path: Path) -> Iterator[Path]:
    """Where a test's venvs go: on the file system of uv's cache, so that uv links the installed
    files from it rather than copying them (torch with its CUDA libraries is about 5 GB a venv;
    ./check keeps the tests' temporary files on /dev/shm, where two such copies took 11 GB of
    memory until the session ended). Removed after the test."""
    cache = Path(
        subprocess.run(
            [*find_uv(), "cache", "dir"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    cache.mkdir(parents=True, exist_ok=True)
    if os.stat(cache).st_dev == os.stat(tmp_path).st_dev:
        yield tmp_path
        return
    root = Path(tempfile.mkdtemp(prefix="pytest-nvrx-venvs-", dir=cache.parent))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def venv_with_pip(path: Path, cwd: Path, origin: Origin) -> Venv:
    """A venv as a user has one (pip in it), activated; git told where the project's URL is."""
    return Venv(find_uv(), path, cwd, seed=True,
                env=origin.git_env | {"PIP_DISABLE_PIP_VERSION_CHECK": "1"})  # fmt: skip


def shell(venv: Venv, line: str, *, extra_env: dict[str, str] | None = None,
          timeout: float = 240) -> subprocess.CompletedProcess[str]:  # fmt: skip
    return subprocess.run(
        ["bash", "-eo", "pipefail", "-c", line], cwd=venv.cwd, env=venv.env | (extra_env or {}),
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def direct_url(venv: Venv) -> dict[str, Any]:
    (record,) = (venv.path / "lib").glob("python3.*/site-packages/pytest_nvrx-*.dist-info")
    data = json.loads((record / "direct_url.json").read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def assert_installed_from_origin(venv: Venv, origin: Origin) -> None:
    """pytest-nvrx came from the git URL, at the origin's HEAD, and runs from the venv."""
    url = direct_url(venv)
    assert url.get("url") == PROJECT_URL, url
    assert url.get("vcs_info", {}).get("commit_id") == origin.head, url
    version = venv.run([str(venv.path / "bin" / "python"), "-m", "pytest_nvrx", "--version"])
    assert version.startswith("pytest-nvrx 0.1.0 ("), version


def pip_with_deps(venv: Venv, line: str) -> None:
    """A docs line that pip-installs pytest-nvrx with its dependencies: what glibc allows."""
    if glibc() >= (2, 39):
        proc = shell(venv, line, extra_env={"PIP_DRY_RUN": "1"})
        assert proc.returncode == 0, f"`{line}` (dry run):\n{proc.stdout[-3000:]}{proc.stderr}"
        assert "Would install" in proc.stdout and "pytest-nvrx-0.1.0" in proc.stdout, proc.stdout
        return
    proc = shell(venv, line)
    assert proc.returncode != 0, f"`{line}` installed on glibc {glibc()}: docs say pip cannot"
    assert PIP_REFUSAL in proc.stderr, (
        f"`{line}` on glibc {glibc()} failed otherwise than the docs say:\n{proc.stderr[-3000:]}"
    )


def git_url_lines() -> dict[str, str]:
    """The README's and install.md's git-URL lines, which must be the same two."""
    readme = [ln for ln in fenced_lines((REPO / "README.md").read_text(encoding="utf-8"))
              if GIT_URL_SPEC in ln]  # fmt: skip
    install = section((DOCS / "install.md").read_text(encoding="utf-8"), "Into an environment")
    ours = [ln for ln in fenced_lines(install) if GIT_URL_SPEC in ln]
    readme, ours = (
        [ln.split("  #")[0].strip() for ln in readme],
        [ln.split("  #")[0].strip() for ln in ours],
    )
    assert readme == ours, f"README and install.md give different git-URL lines: {readme}, {ours}"
    by_tool = {("uv" if ln.startswith("uv ") else "pip"): ln for ln in readme}
    assert sorted(by_tool) == ["pip", "uv"], readme
    return by_tool


def test_clone_build_and_install_lines_as_written(
    origin: Origin, tmp_path: Path, venvs: Path
) -> None:
    """install.md, in order, in one venv: the clone line and `uv build` (the wheel and sdist it
    names, holding what git tracks); the uv line for that wheel, then the two --help checks;
    then README's git-URL uv line, which replaces it with HEAD of the project URL (bytecode
    compiled both times: the second compile finds the first's). Each `pip install` with
    dependencies, in a venv of its own, does what glibc allows and the docs say."""
    text = (DOCS / "install.md").read_text(encoding="utf-8")
    (clone,) = [ln for ln in fenced_lines(section(text, "From a clone")) if ln.startswith("git ")]
    assert clone == f"git clone {PROJECT_URL} && cd pytest-nvrx", clone
    build_section = section(text, "Into an environment")
    lines = fenced_lines(build_section)
    assert "uv build" in lines, "install.md no longer builds with `uv build`"
    venv = venv_with_pip(venvs / "venv", tmp_path, origin)
    proc = shell(venv, f"{clone} && uv build", timeout=300)
    assert proc.returncode == 0, f"`{clone} && uv build`:\n{proc.stdout}{proc.stderr[-3000:]}"
    checkout = tmp_path / "pytest-nvrx"
    dist = checkout / "dist"
    built = sorted(p.name for p in dist.iterdir() if p.name != ".gitignore")  # uv writes one
    assert built == ["pytest_nvrx-0.1.0-py3-none-any.whl", "pytest_nvrx-0.1.0.tar.gz"], built
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip
    assert head == origin.head
    shipped = {n for n in zipfile.ZipFile(dist / built[0]).namelist()
               if n.startswith("pytest_nvrx/")}  # fmt: skip
    tracked = subprocess.run(["git", "ls-files", "pytest_nvrx"], cwd=checkout, check=True,
                             capture_output=True, text=True).stdout.split()  # fmt: skip
    assert shipped == set(tracked), sorted(shipped ^ set(tracked))

    (wheel_line,) = [ln for ln in lines if ln.startswith("uv pip install") and "dist/" in ln]
    argv = shlex.split(wheel_line)
    assert argv[3:5] == ["--python-platform", "x86_64-manylinux_2_39"], wheel_line
    assert "--compile-bytecode" in argv, wheel_line  # workers import torch: install.md says why
    assert argv[-1] == f"dist/{built[0]}", f"install.md installs {argv[-1]}, uv built {built[0]}"
    venv.cwd = checkout
    proc = shell(venv, wheel_line)
    assert proc.returncode == 0, f"`{wheel_line}`:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
    venv.cwd = tmp_path  # outside the clone: its source tree must not be what is imported
    python = str(venv.path / "bin" / "python")
    # install.md's two checks, as printed (the venv first on PATH: its pytest and python)
    commands = [ln.split("  #")[0].strip() for ln in fenced_lines(text)]
    checks = [c for c in commands if c.endswith("--help") or c.startswith("pytest --help")]
    assert checks == ["pytest --help | grep nvrx", "python -m pytest_nvrx --help"], checks
    pytest_help, cli_help = (shell(venv, line) for line in checks)
    assert pytest_help.returncode == 0, pytest_help.stdout + pytest_help.stderr
    assert any("--nvrx-megatron-path" in ln for ln in pytest_help.stdout.splitlines()), pytest_help
    assert all("nvrx" in ln for ln in pytest_help.stdout.splitlines()), pytest_help.stdout
    assert cli_help.returncode == 0, cli_help.stdout + cli_help.stderr
    assert "usage: python -m pytest_nvrx" in cli_help.stdout and "verify" in cli_help.stdout
    where = venv.run([python, "-c", "import pytest_nvrx; print(pytest_nvrx.__file__)"])
    assert where.startswith(str(venv.path)), f"pytest_nvrx imported from {where}, not the venv"
    assert direct_url(venv).get("url", "").endswith(f"dist/{built[0]}"), direct_url(venv)

    git_lines = git_url_lines()
    proc = shell(venv, git_lines["uv"])
    assert proc.returncode == 0, f"`{git_lines['uv']}`:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
    assert_installed_from_origin(venv, origin)
    # --compile-bytecode (install.md says why): the workers' imports find their .pyc files
    (site,) = (venv.path / "lib").glob("python3.*/site-packages")
    for package in ("torch", "pytest_nvrx", "nvidia_resiliency_ext"):
        assert list((site / package / "__pycache__").glob("__init__.*.pyc")), package

    (pip_line,) = [ln for ln in lines if ln.startswith("pip install dist/")]
    pip_venv = venv_with_pip(venvs / "pip-venv", checkout, origin)
    pip_with_deps(pip_venv, pip_line.split("  #")[0].strip())
    pip_venv.cwd = tmp_path
    pip_with_deps(pip_venv, git_lines["pip"])


#: What the install step may add to a container: the plugin, the four packages it imports and
#: theirs (pytest's pluggy, iniconfig, packaging, pygments). Anything else (megatron-core, a
#: torch, an NVRx) is the container's stack changed under qualification.
STEP_MAY_ADD = {"pytest-nvrx", "pytest", "pytest-timeout", "filelock", "psutil", "pluggy",
                "iniconfig", "packaging", "pygments"}  # fmt: skip


def installed(venv: Venv) -> dict[str, str]:
    """Distribution name -> version in the venv, as pip lists them."""
    out = venv.run([str(venv.path / "bin" / "python"), "-m", "pip", "list", "--format=json"])
    return {d["name"].lower().replace("_", "-"): d["version"] for d in json.loads(out)}


def workflow_install_step() -> str:
    """The `run:` block of the GitHub Actions job's install step, as the runner's shell gets it."""
    text = (DOCS / "ci" / "github-actions-gpu.yml").read_text(encoding="utf-8")
    lines = text.splitlines()
    start = lines.index("      - name: Install the plugin, keeping the container's stack")
    assert lines[start + 1] == "        run: |", lines[start + 1]
    block = []
    for line in lines[start + 2 :]:
        if not line.startswith("          "):
            break
        block.append(line.removeprefix("          "))
    assert len(block) == 4, block
    return "\n".join(block) + "\n"


def test_container_routes_keep_the_container_stack(
    origin: Origin, tmp_path: Path, venvs: Path
) -> None:
    """A 'container': torch, then install.md's NVRx lines (for one that has none). The Actions
    job's install step, verbatim, with real pip: the plugin from the git URL, torch and NVRx
    untouched, --version answers. Then install.md's container lines, as printed but for the
    wheel's path, with real pip: the built wheel replaces the plugin alone, and everything the
    launcher path imports is there. In a container without NVRx the step stops with its error
    before installing anything."""
    step = workflow_install_step()
    plugin, plugin_runtime, nvrx, nvrx_runtime = no_deps_route()
    for cmd in (plugin, plugin_runtime):
        assert shlex.join(cmd).split(" ")[:3] == ["pip", "install", cmd[2]]
    bare = venv_with_pip(venvs / "bare", tmp_path, origin)
    # the job pins the plugin (PYTEST_NVRX_REF: a tag or a commit): here, the origin's commit
    pin = {"PYTEST_NVRX_REF": origin.head}
    proc = shell(bare, step, extra_env=pin)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    refusal = "::error::no NVRx in this container (docs/install.md)"
    assert proc.stdout.strip() == refusal, proc.stdout
    assert not list((bare.path / "lib").glob("python3.*/site-packages/pytest_nvrx*"))

    venv = venv_with_pip(venvs / "container", tmp_path, origin)
    venv.uv_pip(["pip", "install", "torch"])
    venv.uv_pip(nvrx)
    venv.uv_pip(nvrx_runtime)
    before = torch_install(venv), nvrx_install(venv)
    had = installed(venv)
    proc = shell(venv, step, extra_env=pin)
    assert proc.returncode == 0, f"the install step:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
    assert (torch_install(venv), nvrx_install(venv)) == before, "the step replaced torch or NVRx"
    added = {name for name, version in installed(venv).items() if had.get(name) != version}
    assert added <= STEP_MAY_ADD, f"the step changed more than the plugin's own: {sorted(added)}"
    assert "pytest-nvrx" in added, added
    assert "pytest-nvrx 0.1.0 (NVRx 0.7.0, torch " in proc.stdout, proc.stdout[-2000:]
    assert_installed_from_origin(venv, origin)

    out = tmp_path / "dist"
    hatchling_build(REPO, out, "wheel")
    (wheel,) = out.glob("pytest_nvrx-*.whl")
    assert plugin[-1].endswith(wheel.name), f"install.md installs {plugin[-1]}, built {wheel}"
    # the other route into the same container: the git URL's copy goes first (pip would keep
    # an installed 0.1.0 as satisfying the wheel's)
    venv.run(
        [str(venv.path / "bin" / "python"), "-m", "pip", "uninstall", "-q", "-y", "pytest-nvrx"]
    )
    for cmd in ([*plugin[:-1], str(wheel)], plugin_runtime):
        venv.run(cmd)  # the venv's own pip, first on PATH
    assert (torch_install(venv), nvrx_install(venv)) == before, "install.md replaced torch or NVRx"
    assert direct_url(venv).get("url") == wheel.as_uri(), direct_url(venv)
    code = "import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)\nprint('ok')"
    imported = venv.run([str(venv.path / "bin" / "python"), "-W", "ignore", "-c", code,
                         *RUNTIME_MODULES])  # fmt: skip
    assert imported.strip().endswith("ok")
