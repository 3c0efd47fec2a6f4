"""What a Megatron checkout builds at first use, read from it (pytest_nvrx.megatron.build).

The sources and Makefiles are short excerpts in the shapes of the real revisions
(tests/helpers/megatron_checkouts.py); make itself reads them, as Megatron's rank 0 would.
"""

from __future__ import annotations

import ast
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pytest_nvrx.launch.checkpoint_claim import pid_start
from pytest_nvrx.megatron.build import (
    default_goal_files,
    elf_shortfall,
    first_use_builds,
    foreign_extension,
    make_calls,
    read_make_state,
    run_make,
    telling_line,
)
from tests.helpers.megatron_checkouts import (
    DATASETS,
    EXT_SUFFIX,
    MAKEFILE_CORE,
    MAKEFILE_PATTERN,
    UTILS_CORE,
    UTILS_V2,
    env_with_path,
    megatron_checkout,
    tool_bin,
    write_tree,
)

needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="no make on this host")


def calls(source: str) -> list[tuple[str, bool, tuple[str, ...]]]:
    return [(c.function, c.own_dir, c.command) for c in make_calls(ast.parse(source))]


# ----------------------------------------------------------------------------------------------
# The source: the function that runs make, and where


def test_core_compile_helpers_runs_make_in_its_own_directory() -> None:
    found = make_calls(ast.parse(UTILS_CORE))
    assert [(c.function, c.own_dir) for c in found] == [("compile_helpers", True)]
    assert found[0].command == ("make", "-C", "<os.path.abspath(os.path.dirname(__file__))>")
    # the line of the call that runs it (the command is built on the line above)
    assert UTILS_CORE.splitlines()[found[0].line - 1].strip().startswith("if subprocess.run(")


def test_megatron_2_compile_helper_through_a_path_variable() -> None:
    assert calls(UTILS_V2) == [("compile_helper", True, ("make", "-C", "<path>"))]


@pytest.mark.parametrize(
    "where",
    [
        "pathlib.Path(__file__).parent",
        "str(Path(__file__).resolve().parent)",
        "os.path.dirname(os.path.realpath(__file__))",
    ],
)
def test_other_spellings_of_the_modules_directory(where: str) -> None:
    source = f"def build():\n    subprocess.check_call(['make', '-C', {where}])\n"
    assert calls(source) == [("build", True, ("make", "-C", f"<{where}>"))]
    with_cwd = f"def build():\n    subprocess.run(args=['make'], cwd={where})\n"
    assert calls(with_cwd) == [("build", True, ("make",))]


@pytest.mark.parametrize(
    "source",
    [
        "def build():\n    subprocess.run(['make', '-C', '/opt/helpers'])\n",  # not its own dir
        "def build():\n    subprocess.run(['make'])\n",  # wherever the process runs
        "def build(d):\n    subprocess.run(['make', '-C', d])\n",
        # a name bound twice: not known to be the module's directory
        "def build():\n    p = dirname(__file__)\n    p = '/x'\n"
        "    subprocess.run(['make', '-C', p])\n",
    ],
)
def test_a_make_elsewhere_is_not_a_first_use_build(source: str) -> None:
    assert [own for _, own, _ in calls(source)] == [False]


def test_no_make_at_all() -> None:
    assert calls("def f():\n    subprocess.run(['cmake', '-S', '.'])\n") == []


def test_the_checkouts_first_use_build_is_found_beside_its_makefile(tmp_path: Path) -> None:
    root = megatron_checkout(tmp_path / "core")
    [build] = first_use_builds(root)
    assert build.directory == root / DATASETS
    assert build.caller == f"{DATASETS}/utils.py:10"
    assert build.function == "compile_helpers"
    assert build.describe() == (f"{DATASETS}/utils.py:10 compile_helpers() runs make -C {DATASETS}")
    old = megatron_checkout(
        tmp_path / "v2",
        makefile=MAKEFILE_PATTERN,
        utils=UTILS_V2,
        directory=Path("megatron", "data"),
        extra={"megatron/data/dataset_utils.py": UTILS_V2},
    )
    [build] = first_use_builds(old)  # one build per directory, whichever module runs it
    assert (build.rel_dir, build.function) == ("megatron/data", "compile_helper")


def test_a_checkout_that_builds_nothing(tmp_path: Path) -> None:
    # only pretrain_gpt.py (the tests' stub checkouts)
    stub = write_tree(tmp_path / "stub", {"pretrain_gpt.py": ""})
    assert first_use_builds(stub) == ()
    # a module that runs make, but no Makefile beside it; a Makefile no module runs
    no_makefile = megatron_checkout(tmp_path / "a")
    (no_makefile / DATASETS / "Makefile").unlink()
    assert first_use_builds(no_makefile) == ()
    nobody = megatron_checkout(tmp_path / "b", utils="def compile_helpers():\n    pass\n")
    assert first_use_builds(nobody) == ()
    # a module that does not parse is no build (Megatron could not import it either)
    broken = megatron_checkout(tmp_path / "c", utils=UTILS_CORE + "\ndef (:\n")
    assert first_use_builds(broken) == ()


# ----------------------------------------------------------------------------------------------
# The Makefile, as make reads it

DATABASE = textwrap.dedent(
    """\
    # GNU Make 4.3
    .DEFAULT_GOAL := default
    LIBEXT = $(shell python3-config --extension-suffix)

    # Files

    helpers_cpp.cpython-312-x86_64-linux-gnu.so: .SHELLSTATUS := 0
    helpers_cpp.cpython-312-x86_64-linux-gnu.so: helpers.cpp
    #  recipe to execute (from 'Makefile', line 13):
    \t$(CXX) $(CXXFLAGS) $(CPPFLAGS) $< -o $@

    # Not a target:
    helpers.cpp:

    default: helpers_cpp.cpython-312-x86_64-linux-gnu.so
    #  Implicit rule search has been done.
    #  File does not exist.
    """
)


def test_the_default_goals_files_from_makes_database() -> None:
    assert default_goal_files(DATABASE) == ("helpers_cpp.cpython-312-x86_64-linux-gnu.so",)
    # a default goal with a recipe is the file itself
    own = DATABASE.replace(".DEFAULT_GOAL := default", ".DEFAULT_GOAL := helpers_cpp.cpython-312"
                           "-x86_64-linux-gnu.so")  # fmt: skip
    assert default_goal_files(own) == ("helpers_cpp.cpython-312-x86_64-linux-gnu.so",)
    assert default_goal_files("# no goal\n") == ()


@needs_make
@pytest.mark.parametrize(
    ("makefile", "name"),
    [(MAKEFILE_CORE, "helpers_cpp"), (MAKEFILE_PATTERN, "helpers")],
    ids=["core", "pattern-rule"],
)
def test_make_names_the_revisions_own_artifact_and_whether_it_is_up_to_date(
    tmp_path: Path, makefile: str, name: str
) -> None:
    root = megatron_checkout(tmp_path / "m", makefile=makefile)
    [build] = first_use_builds(root)
    env = env_with_path(tool_bin(tmp_path / "bin"))
    state = read_make_state(build, shutil.which("make") or "make", env)
    # the name python3-config gives in the workers' environment: this interpreter's suffix
    assert state.artifacts == (f"{name}{EXT_SUFFIX}",)
    assert not state.up_to_date
    artifact = root / DATASETS / state.artifacts[0]
    artifact.write_bytes(b"x")
    assert read_make_state(build, "make", env).up_to_date
    # a source newer than the artifact: out of date again
    source = root / DATASETS / "helpers.cpp"
    later = artifact.stat().st_mtime + 10
    os.utime(source, (later, later))
    assert not read_make_state(build, "make", env).up_to_date
    # another interpreter's python3-config names another file
    other = env_with_path(tool_bin(tmp_path / "bin311", suffix=".cpython-311-x86_64-linux-gnu.so"))
    assert read_make_state(build, "make", other).artifacts == (
        f"{name}.cpython-311-x86_64-linux-gnu.so",
    )


# ----------------------------------------------------------------------------------------------
# What make said, and what it built


def test_the_telling_line_of_a_failed_build() -> None:
    output = "\n".join(
        [
            "/tmp/bin/python3: No module named pybind11",
            "g++ -O3 -shared helpers.cpp -o helpers_cpp.cpython-312-x86_64-linux-gnu.so",
            "helpers.cpp:8:10: fatal error: pybind11/pybind11.h: No such file or directory",
            "compilation terminated.",
            "make: *** [Makefile:13: helpers_cpp.cpython-312-x86_64-linux-gnu.so] Error 1",
        ]
    )
    assert telling_line(output) == (
        "helpers.cpp:8:10: fatal error: pybind11/pybind11.h: No such file or directory"
        " (and /tmp/bin/python3: No module named pybind11)"
    )
    assert telling_line(output.split("\n", 1)[1]) == (
        "helpers.cpp:8:10: fatal error: pybind11/pybind11.h: No such file or directory"
    )
    assert telling_line("make: g++: No such file or directory\nmake: *** [x] Error 127") == (
        "make: g++: No such file or directory"
    )
    assert telling_line("/bin/sh: 1: nvcc: not found\nmake: *** [x] Error 127") == (
        "/bin/sh: 1: nvcc: not found"
    )
    assert telling_line("python3: No module named pybind11\nmake: *** [x] Error 1") == (
        "python3: No module named pybind11"
    )
    colored = "\x1b[01;31mhelpers.cpp:1: error:\x1b[m bad\n"
    assert telling_line(colored) == "helpers.cpp:1: error: bad"
    assert telling_line("just this\nand that\n") == "and that"


def test_an_extension_for_another_python_is_named() -> None:
    ours = [".cpython-312-x86_64-linux-gnu.so", ".abi3.so", ".so"]
    assert foreign_extension("helpers_cpp.cpython-311-x86_64-linux-gnu.so", ours) == (
        ".cpython-311-x86_64-linux-gnu.so"
    )
    assert foreign_extension("helpers_cpp.cpython-312-x86_64-linux-gnu.so", ours) is None
    assert foreign_extension("helpers_cpp.abi3.so", ours) is None
    assert foreign_extension("helpers_cpp.so", ours) is None
    assert foreign_extension("helpers_data.py", ours) is None
    # this interpreter's own suffix is never foreign
    assert foreign_extension(f"helpers_cpp{EXT_SUFFIX}") is None


def _an_elf_file() -> Path:
    path = Path(os.path.realpath(sys.executable))
    with open(path, "rb") as fh:
        assert fh.read(4) == b"\x7fELF", path
    return path


def test_a_truncated_elf_file_is_found_short(tmp_path: Path) -> None:
    """A copy of a real ELF file cut where a writer might be: the loader's "file too short"."""
    whole = _an_elf_file().read_bytes()
    copy = tmp_path / f"helpers_cpp{EXT_SUFFIX}"
    copy.write_bytes(whole)
    assert elf_shortfall(copy) is None
    for cut in (len(whole) - 1, len(whole) // 2, 100, 40):
        copy.write_bytes(whole[:cut])
        why = elf_shortfall(copy)
        assert why is not None and why.startswith("file too short"), (cut, why)
        if cut > 64:
            assert f"({cut} of " in why
    for head in (b"", b"\x7fEL", b"\0" * 4096):
        copy.write_bytes(head)
        assert elf_shortfall(copy) == f"invalid ELF header ({len(head)} bytes)"


def test_run_make_returns_when_make_exits_though_a_daemon_keeps_its_output(
    tmp_path: Path,
) -> None:
    """A recipe leaves a process of its own session holding make's output: make exited 0, so
    run_make says 0 with make's output, at once, never a timeout."""
    pidfile = tmp_path / "daemon.pid"
    (tmp_path / "Makefile").write_text(
        f"default:\n\tsetsid sh -c 'echo $$$$ > {pidfile}; exec sleep 30' &\n\techo started\n"
    )
    begun = time.monotonic()
    try:
        status, out, _ = run_make(
            "make", ["-C", str(tmp_path)], {"PATH": "/usr/bin:/bin"}, timeout_s=20
        )
    finally:
        if pidfile.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pidfile.read_text()), signal.SIGKILL)
    assert status == 0 and "started" in out
    assert time.monotonic() - begun < 10


def test_run_make_kills_make_and_its_compiler_at_the_deadline(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    recipe = f"sh -c 'echo $$$$ > {pidfile}; exec sleep 30'"
    (tmp_path / "Makefile").write_text(f"default:\n\t{recipe}\n")
    with pytest.raises(subprocess.TimeoutExpired):
        run_make("make", ["-C", str(tmp_path)], {"PATH": "/usr/bin:/bin"}, timeout_s=1)
    child = int(pidfile.read_text())
    time.sleep(0.2)
    assert pid_start(child) is None or Path(f"/proc/{child}/stat").read_text().split()[2] == "Z"


def test_a_link_loop_under_megatron_is_walked_once(tmp_path: Path) -> None:
    """Links are followed (a linked megatron/core is built), but a link back up the tree does not
    make the walk endless."""
    checkout = megatron_checkout(tmp_path / "checkout")
    (checkout / DATASETS / "loop").symlink_to(checkout / "megatron")
    builds = first_use_builds(checkout)
    assert [b.rel_dir for b in builds] == [str(DATASETS)]
