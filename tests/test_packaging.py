"""The built wheel and sdist are what users install: entry point, typed marker, shipped suite,
metadata, a lean sdist, and install commands in the docs that really work.

Installed apart from the repository, the plugin must find itself through the entry point and run
the shipped suite with ``--pyargs`` (collection only: no run is launched here). The install
commands of docs/install.md run as written in new venvs (uv, from its cache: seconds).
"""

from __future__ import annotations

import email.parser
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from email.message import Message
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
PROJECT_URL = "https://github.com/pytest-nvrx/pytest-nvrx"
#: What an sdist must never carry: recorded runs, the lock, fetched code, local tooling.
SDIST_FORBIDDEN = ("tests/", "uv.lock", ".megatron/", ".whl/", "scripts/", "benchmarks/", ".ci/")
SDIST_MAX_FILES = 175  # the package (~125 files) + docs (~25) + 25; 1000+ with tests/data


@dataclass(frozen=True)
class Dist:
    wheel: Path
    sdist: Path


def hatchling_build(source: Path, out: Path, *targets: str) -> None:
    args = [arg for target in targets for arg in ("-t", target)]
    proc = subprocess.run(
        [sys.executable, "-m", "hatchling", "build", *args, "-d", str(out)],
        cwd=source, capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, f"hatchling build in {source} failed:\n{proc.stdout}{proc.stderr}"


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    # Built into <tmp>/dist so the docs' "dist/pytest_nvrx-...whl" resolves from <tmp>.
    out = tmp_path_factory.mktemp("build") / "dist"
    hatchling_build(REPO, out, "wheel", "sdist")
    (wheel,) = out.glob("pytest_nvrx-*.whl")
    (sdist,) = out.glob("pytest_nvrx-*.tar.gz")
    return Dist(wheel, sdist)


@pytest.fixture(scope="module")
def wheel(dist: Dist) -> Path:
    return dist.wheel


def wheel_metadata(wheel: Path) -> tuple[str, Message]:
    zf = zipfile.ZipFile(wheel)
    dist_info = next(n.split("/")[0] for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
    return dist_info, email.parser.Parser().parsestr(zf.read(f"{dist_info}/METADATA").decode())


def sdist_members(sdist: Path) -> dict[str, tarfile.TarInfo]:
    """Members by path below the sdist's top folder (pytest_nvrx-0.1.0/)."""
    with tarfile.open(sdist) as tf:
        return {m.name.partition("/")[2]: m for m in tf.getmembers() if m.isfile()}


def test_wheel_contents(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "pytest_nvrx/py.typed",
        "pytest_nvrx/plugin.py",
        "pytest_nvrx/worker/injector.py",
        "pytest_nvrx/worker/plant_hook/sitecustomize.py",
        "pytest_nvrx/suite/test_recovery.py",
        "pytest_nvrx/workloads/reference.py",
        "pytest_nvrx/evidence/megatron.py",
        "pytest_nvrx/evidence/replay.py",
        "pytest_nvrx/criteria/__init__.py",
        "pytest_nvrx/criteria/training_continuity.py",
    ):
        assert needed in names
    assert not any(n.startswith("tests/") for n in names)
    dist_info, _ = wheel_metadata(wheel)
    zf = zipfile.ZipFile(wheel)
    entry_points = zf.read(f"{dist_info}/entry_points.txt").decode()
    assert "[pytest11]" in entry_points and "nvrx = pytest_nvrx.plugin" in entry_points
    metadata = zf.read(f"{dist_info}/METADATA").decode()
    for requirement in ("pytest", "pytest-timeout", "torch", "megatron-core", "filelock"):
        assert f"Requires-Dist: {requirement}" in metadata
    assert "Requires-Dist: nvidia-resiliency-ext<0.8,>=0.7" in metadata
    assert "Requires-Python: >=3.12" in metadata


def check_metadata(meta: Message, where: str) -> None:
    """The fields pytest-dev plugins carry (pytest-xdist's model: PEP 639 license expression)."""
    assert meta["Name"] == "pytest-nvrx", where
    assert meta["License-Expression"] == "MIT", where
    assert meta.get_all("License-File") == ["LICENSE"], where
    assert meta["Author"] == "the pytest-nvrx authors", where
    assert "pytest" in (meta["Keywords"] or "").split(","), where
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [])
    assert urls.get("Homepage") == PROJECT_URL, (where, urls)
    assert urls.get("Source") == PROJECT_URL, (where, urls)
    assert urls.get("Issues") == f"{PROJECT_URL}/issues", (where, urls)
    classifiers = meta.get_all("Classifier") or []
    for needed in (
        "Framework :: Pytest",
        "Topic :: Software Development :: Testing",
        "Intended Audience :: Developers",
        "Programming Language :: Python :: 3.12",
        "Typing :: Typed",
    ):
        assert needed in classifiers, (where, needed)
    assert any(c.startswith("Development Status :: ") for c in classifiers), where
    # PEP 639: License :: classifiers are deprecated next to License-Expression; PyPI refuses both.
    assert not [c for c in classifiers if c.startswith("License :: ")], where
    assert meta["Description-Content-Type"] == "text/markdown", where


def check_license(text: str, where: str) -> None:
    assert text.startswith("MIT License\n"), where
    assert "Copyright (c) 2026 the pytest-nvrx authors" in text, where
    assert 'THE SOFTWARE IS PROVIDED "AS IS"' in text, where


def test_metadata_and_license_in_wheel_and_sdist(dist: Dist) -> None:
    dist_info, meta = wheel_metadata(dist.wheel)
    check_metadata(meta, "wheel METADATA")
    check_license(
        zipfile.ZipFile(dist.wheel).read(f"{dist_info}/licenses/LICENSE").decode(), "wheel"
    )
    with tarfile.open(dist.sdist) as tf:

        def read(name: str) -> str:
            handle = tf.extractfile(f"{dist.sdist.name.removesuffix('.tar.gz')}/{name}")
            assert handle is not None, name
            return handle.read().decode()

        check_metadata(email.parser.Parser().parsestr(read("PKG-INFO")), "sdist PKG-INFO")
        sdist_license = read("LICENSE")
    check_license(sdist_license, "sdist")
    assert (REPO / "LICENSE").read_text(encoding="utf-8") == sdist_license


def test_sdist_is_lean_and_builds_the_same_wheel(dist: Dist, tmp_path: Path) -> None:
    members = sdist_members(dist.sdist)
    names = sorted(members)
    for needed in ("pyproject.toml", "README.md", "LICENSE", "PKG-INFO", "pytest_nvrx/py.typed",
                   "pytest_nvrx/plugin.py", "pytest_nvrx/suite/test_recovery.py",
                   "docs/install.md", "docs/ci/github-actions-gpu.yml"):  # fmt: skip
        assert needed in members, f"{needed} missing from the sdist"
    shipped = [n for n in names if n.startswith(SDIST_FORBIDDEN)]
    assert not shipped, f"the sdist ships {len(shipped)} files it must not: {shipped[:10]}"
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert len(names) <= SDIST_MAX_FILES, f"{len(names)} files in the sdist: {names}"
    # Everything a wheel needs is in it: the wheel built from the sdist equals the direct one.
    with tarfile.open(dist.sdist) as tf:
        tf.extractall(tmp_path, filter="data")
    (unpacked,) = tmp_path.iterdir()
    hatchling_build(unpacked, tmp_path / "out", "wheel")
    (rebuilt,) = (tmp_path / "out").glob("*.whl")
    assert sorted(zipfile.ZipFile(rebuilt).namelist()) == sorted(
        zipfile.ZipFile(dist.wheel).namelist()
    )


def test_installed_wheel_runs_the_shipped_suite(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    # A pure-Python wheel installs by unpacking it onto the path (the venv has no pip).
    zipfile.ZipFile(wheel).extractall(site)
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("MEGATRON_PATH", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "pytest_nvrx.suite", "--collect-only",
         "-q", "-p", "no:cacheprovider", "-m", "gpu and kill and not schedule"],
        cwd=tmp_path, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # run finished + six criteria for megatron-kill-save, out of 7 x 20 default scenarios (14 of
    # faults, 6 of fault schedules)
    assert "7/140 tests collected" in proc.stdout
    # collected from the installed copy (relative to cwd), not from the checkout
    assert "site/pytest_nvrx/suite/test_recovery.py::" in proc.stdout


# ---------------------------------------------------------------------------------------------
# The docs
# ---------------------------------------------------------------------------------------------

MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")
BLOB = f"{PROJECT_URL}/blob/main/"
TREE = f"{PROJECT_URL}/tree/main/"


def test_readme_links_are_absolute_and_resolve() -> None:
    """The README is the package's description on an index, where relative links break."""
    links = MARKDOWN_LINK.findall((REPO / "README.md").read_text(encoding="utf-8"))
    assert links, "no links found in README.md"
    relative = [link for link in links if not link.startswith("https://")]
    assert not relative, f"relative links in README.md: {relative}"
    for link in links:
        for prefix in (BLOB, TREE):
            if link.startswith(prefix):
                target = REPO / link.removeprefix(prefix).partition("#")[0]
                assert target.exists(), f"README.md links {link}; {target} does not exist"


def fenced_lines(markdown: str) -> list[str]:
    """The lines inside ``` fences (the commands), without comment-only lines."""
    out, inside = [], False
    for line in markdown.splitlines():
        if line.startswith("```"):
            inside = not inside
        elif inside and line.strip() and not line.lstrip().startswith("#"):
            out.append(line.strip())
    return out


def section(markdown: str, heading: str) -> str:
    start = markdown.index(f"\n## {heading}")
    end = markdown.find("\n## ", start + 1)
    return markdown[start : end if end != -1 else None]


def install_commands() -> list[tuple[str, list[str]]]:
    """Every `pip install` / `uv pip install` command in the docs, as (file, argv)."""
    out: list[tuple[str, list[str]]] = []
    for path in [REPO / "README.md", *sorted(DOCS.glob("*.md"))]:
        for line in fenced_lines(path.read_text(encoding="utf-8")):
            out.extend((path.name, cmd) for cmd in split_install(line))
    for path in sorted((DOCS / "ci").iterdir()):
        for line in path.read_text(encoding="utf-8").splitlines():
            out.extend((path.name, cmd) for cmd in split_install(line.strip().removeprefix("run:")))
    return out


def split_install(line: str) -> list[list[str]]:
    if "pip install" not in line:
        return []
    argv = shlex.split(line, comments=True)
    for i in range(len(argv) - 1):
        if argv[i : i + 2] == ["pip", "install"]:
            return [argv[i:]]
    return []


def test_docs_never_install_from_pypi() -> None:
    """pytest-nvrx is not on PyPI: every install of it names a wheel file or the git URL."""
    commands = install_commands()
    ours = [(f, cmd) for f, cmd in commands if any("pytest-nvrx" in a or "pytest_nvrx" in a
                                                   for a in cmd)]  # fmt: skip
    assert len(ours) >= 6, f"expected the docs' install commands, found {ours}"
    for where, cmd in ours:
        for arg in cmd:
            if re.fullmatch(r"pytest[-_]nvrx([=<>!~\[].*)?", arg):
                pytest.fail(f"{where}: {shlex.join(cmd)} installs pytest-nvrx from PyPI")


NO_DEPS_HEADING = "In a container whose torch must stay (`--no-deps`)"


def no_deps_route() -> tuple[list[str], list[str], list[str], list[str]]:
    """install.md's container commands: the plugin alone (--no-deps) and its own imports; then,
    only where the container has no NVRx, NVRx (--no-deps) and its launcher's imports."""
    text = (DOCS / "install.md").read_text(encoding="utf-8")
    commands = [cmd for line in fenced_lines(section(text, NO_DEPS_HEADING))
                for cmd in split_install(line)]  # fmt: skip
    assert len(commands) == 4, commands
    plugin, plugin_runtime, nvrx, nvrx_runtime = commands
    assert "--no-deps" in plugin and "--no-deps" in nvrx
    assert "--no-deps" not in plugin_runtime and "--no-deps" not in nvrx_runtime
    assert plugin_runtime[2:] == ["pytest", "pytest-timeout", "filelock", "psutil"], plugin_runtime
    assert nvrx[-1] == "nvidia-resiliency-ext==0.7.0", nvrx
    return plugin, plugin_runtime, nvrx, nvrx_runtime


def test_container_route_is_the_same_everywhere() -> None:
    """gpu.md and the CI workflow install what install.md says, with the git URL, and never
    NVRx: the container's is the one qualified (#23: the workflow replaced it)."""
    plugin, plugin_runtime, _, nvrx_runtime = no_deps_route()
    for cmd in (plugin_runtime, nvrx_runtime):
        assert "torch" not in cmd and "megatron-core" not in cmd
        assert not any(a.startswith("nvidia-resiliency-ext") for a in cmd), cmd
    assert not any(a.startswith("nvidia-resiliency-ext") for a in plugin), plugin
    copies = [
        (where, cmd)
        for where, cmd in install_commands()
        if where in ("gpu.md", "github-actions-gpu.yml")
    ]
    assert len(copies) == 4, copies
    for where, cmd in copies:
        assert not any("nvidia-resiliency-ext" in a for a in cmd), (where, cmd)
        if "--no-deps" in cmd:
            assert cmd[:-1] == plugin[:-1], (where, cmd)
            # the CI job pins the plugin (a tag or a commit, one variable); gpu.md installs it
            pin = "@$PYTEST_NVRX_REF" if where.endswith(".yml") else ""
            assert cmd[-1] == f"pytest-nvrx @ git+{PROJECT_URL}{pin}", (where, cmd)
        else:
            assert cmd == plugin_runtime, (where, cmd)


# ---------------------------------------------------------------------------------------------
# Installing as the docs say, in new venvs
# ---------------------------------------------------------------------------------------------

PLATFORM = ("--python-platform", "x86_64-manylinux_2_39")
#: The modules the launcher, the workers and the plugin import at run time (NVRx's launcher,
#: rank monitor, per-cycle logs and gRPC log server, async checkpointing; pynvml for the GPU
#: health check), imported from the container route's venv.
RUNTIME_MODULES = (
    "nvidia_resiliency_ext.fault_tolerance.launcher",
    "nvidia_resiliency_ext.fault_tolerance.rank_monitor_client",
    "nvidia_resiliency_ext.fault_tolerance.rank_monitor_server",
    "nvidia_resiliency_ext.fault_tolerance.per_cycle_logs",
    "nvidia_resiliency_ext.shared_utils.grpc_log_server",
    "nvidia_resiliency_ext.checkpointing.async_ckpt.core",
    "nvidia_resiliency_ext.checkpointing.async_ckpt.filesystem_async",
    "pynvml",
    "pytest_timeout",
    "pytest_nvrx.plugin",
    "pytest_nvrx.cli",
    "pytest_nvrx.worker.injector",
    "pytest_nvrx.workloads.reference",
)


def find_uv() -> list[str]:
    """uv's binary: the base interpreter's (bootstrap.sh installs it there), else one on PATH.

    Not ``python -m uv``: run that way uv installs into the interpreter that ran it, whatever
    VIRTUAL_ENV says. Not a pyenv shim found on PATH unchecked: it answers only in a folder whose
    .python-version selects a Python that has uv.
    """
    found = subprocess.run(
        [base_interpreter(), "-c", "import uv; print(uv.find_uv_bin())"],
        capture_output=True, text=True,
    )  # fmt: skip
    candidates = [found.stdout.strip()] if found.returncode == 0 else []
    candidates.append(shutil.which("uv") or "uv")
    for uv in candidates:
        try:
            ok = subprocess.run([uv, "--version"], cwd="/", capture_output=True).returncode
        except OSError:
            continue
        if ok == 0:
            return [uv]
    pytest.fail(f"no working uv (tried {candidates}); scripts/bootstrap.sh installs one")


def base_interpreter() -> str:
    """The Python 3.12 the project's .venv was made from (not the venv: a clean one is wanted)."""
    exe = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    assert exe.exists(), f"{exe} (the base interpreter of {sys.executable}) does not exist"
    return str(exe)


class Venv:
    """A new venv, used as an activated one: VIRTUAL_ENV and PATH, as `source activate` sets."""

    def __init__(self, uv: list[str], path: Path, cwd: Path, *, seed: bool = False,
                 env: dict[str, str] | None = None) -> None:  # fmt: skip
        """``seed``: pip in the venv, as ``python -m venv`` gives; ``env``: added to the
        environment (after PATH, which is the venv's bin, then uv's, then the caller's)."""
        self.uv, self.path, self.cwd = uv, path, cwd
        self.env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MEGATRON_PATH")}
        path_dirs = (str(path / "bin"), str(Path(uv[0]).parent), os.environ["PATH"])
        self.env |= {"UV_PYTHON_DOWNLOADS": "never", "VIRTUAL_ENV": str(path),
                     "PATH": os.pathsep.join(path_dirs)} | (env or {})  # fmt: skip
        seeding = ["--seed"] if seed else []
        self.run([*uv, "venv", "-q", *seeding, "--python", base_interpreter(), str(path)])

    def run(self, argv: list[str], *, timeout: float = 180) -> str:
        proc = subprocess.run(
            argv, cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        assert proc.returncode == 0, (
            f"`{shlex.join(argv)}` in {self.path} exited {proc.returncode}:\n"
            f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        )
        return proc.stdout

    def uv_pip(self, argv: list[str]) -> str:
        """A docs line `uv pip install ...` (or `pip install ...`, which glibc < 2.39 refuses for
        NVRx's manylinux_2_39 wheels: run through uv with the platform named instead)."""
        assert argv[:2] == ["pip", "install"] or argv[:3] == ["uv", "pip", "install"], argv
        rest = argv[2:] if argv[0] == "pip" else argv[3:]
        if rest[:2] != list(PLATFORM):
            rest = [*PLATFORM, *rest]
        return self.run([*self.uv, "pip", "install", *rest])


def torch_install(venv: Venv) -> tuple[str, int]:
    """torch's version and the inode of its __init__.py (a reinstall changes it), without the
    ~10 s import of torch."""
    out = venv.run([str(venv.path / "bin" / "python"), "-c",
                    "import importlib.metadata as m, importlib.util as u, os; "
                    "print(m.version('torch'), os.stat(u.find_spec('torch').origin).st_ino)"],
                   )  # fmt: skip
    version, inode = out.split()
    return version, int(inode)


def nvrx_install(venv: Venv) -> tuple[str, int]:
    """NVRx's version and the inode of its __init__.py (a reinstall changes it)."""
    out = venv.run([str(venv.path / "bin" / "python"), "-c",
                    "import importlib.metadata as m, importlib.util as u, os; "
                    "print(m.version('nvidia-resiliency-ext'),"
                    " os.stat(u.find_spec('nvidia_resiliency_ext').origin).st_ino)"],
                   )  # fmt: skip
    version, inode = out.split()
    return version, int(inode)
