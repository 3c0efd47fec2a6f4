"""Small Megatron-shaped checkouts for the first-use build's tests
(tests/megatron/test_megatron_build.py,
test_megatron_prepare.py, test_megatron_first_use_runs.py).

The Makefiles and modules here are short excerpts written for these tests in the shapes of the
real revisions (read from the Megatron-LM repository):

* core >= 0.10 (core_v0.17.1 .. core_v0.19.0): ``megatron/core/datasets/Makefile`` builds
  ``helpers_cpp$(shell python3-config --extension-suffix)`` from ``helpers.cpp`` through
  ``default: $(OUT)``; ``utils.py``'s ``compile_helpers`` builds ``command = ["make", "-C",
  os.path.abspath(os.path.dirname(__file__))]`` and runs it;
* core 0.5 and Megatron 2.x: a pattern rule ``%$(LIBEXT): %.cpp`` with ``default:
  $(LIBNAME)$(LIBEXT)`` (``helpers``), and ``compile_helper`` assigning ``path =
  os.path.abspath(os.path.dirname(__file__))`` before ``subprocess.run(['make', '-C', path])``.

``tool_bin`` makes a directory of the tools make finds on PATH: the workers' ``python3``, a
``python3-config`` that prints what the real one of that interpreter prints (or another
interpreter's suffix), make and, when asked, the C++ compiler. Nothing here is Megatron's code.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
import textwrap
from pathlib import Path

DATASETS = Path("megatron", "core", "datasets")
#: The extension file name ending of this interpreter (the workers').
EXT_SUFFIX = str(sysconfig.get_config_var("EXT_SUFFIX"))

#: core >= 0.10: one named output from one source, the default goal naming it.
MAKEFILE_CORE = """\
CXXFLAGS += -O1 -Wall -shared -std=c++17 -fPIC
CPPFLAGS += $(shell python3 -m pybind11 --includes)

LIBNAME = helpers_cpp
LIBEXT = $(shell python3-config --extension-suffix)

OUT = $(LIBNAME)$(LIBEXT)
SRC = helpers.cpp

default: $(OUT)

$(OUT): $(SRC)
\t$(CXX) $(CXXFLAGS) $(CPPFLAGS) $< -o $@
"""

#: core 0.5 and 2.x: a pattern rule, the default goal naming the file it makes.
MAKEFILE_PATTERN = """\
CXXFLAGS += -O1 -Wall -shared -std=c++11 -fPIC
CPPFLAGS += $(shell python3 -m pybind11 --includes)
LIBNAME = helpers
LIBEXT = $(shell python3-config --extension-suffix)

default: $(LIBNAME)$(LIBEXT)

%$(LIBEXT): %.cpp
\t$(CXX) $(CXXFLAGS) $(CPPFLAGS) $< -o $@
"""

UTILS_CORE = '''\
import logging


def compile_helpers():
    """Compile C++ helper functions at runtime (one process)."""
    import os
    import subprocess

    command = ["make", "-C", os.path.abspath(os.path.dirname(__file__))]
    if subprocess.run(command).returncode != 0:
        import sys

        logging.error("Failed to compile the C++ dataset helper functions")
        sys.exit(1)
'''

UTILS_V2 = '''\
def compile_helper():
    """Compile helper function at runtime (one process)."""
    import os
    import subprocess
    path = os.path.abspath(os.path.dirname(__file__))
    ret = subprocess.run(['make', '-C', path])
    if ret.returncode != 0:
        print("Making C++ dataset helpers module failed, exiting.")
        import sys
        sys.exit(1)
'''

#: C++ that any g++ compiles into a shared object (no pybind11 needed).
PLAIN_CPP = 'extern "C" int nvrx_helpers_answer() { return 42; }\n'
#: C++ that needs pybind11's headers, as Megatron's helpers.cpp does.
PYBIND_CPP = '#include <pybind11/pybind11.h>\nPYBIND11_MODULE(helpers_cpp, m) { m.doc() = "x"; }\n'


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text) if text.startswith("\n") else text)
    return root


def megatron_checkout(
    root: Path,
    *,
    makefile: str = MAKEFILE_CORE,
    utils: str = UTILS_CORE,
    source: str = PLAIN_CPP,
    source_name: str = "helpers.cpp",
    directory: Path = DATASETS,
    extra: dict[str, str] | None = None,
) -> Path:
    """A checkout with pretrain_gpt.py and the first-use build in ``directory``."""
    files = {
        "pretrain_gpt.py": "raise SystemExit('not a real Megatron')\n",
        "megatron/__init__.py": "",
        f"{directory}/__init__.py": "",
        f"{directory}/Makefile": makefile,
        f"{directory}/utils.py": utils,
        f"{directory}/{source_name}": source,
        **(extra or {}),
    }
    return write_tree(root, files)


def tool_bin(
    where: Path,
    *,
    suffix: str | None = None,
    compiler: bool = True,
    make: bool = True,
    python: str = sys.executable,
    extra: tuple[str, ...] = (),
) -> str:
    """A PATH of one directory: ``python3`` (the workers' interpreter), ``python3-config``
    answering ``--extension-suffix`` as that interpreter's own does (or ``suffix``), ``make``
    and the C++ compiler (``g++``, ``c++``) as this host has them, when asked, and the
    ``extra`` commands a recipe runs (:data:`SLOW_TOOLS`)."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "python3").symlink_to(python)
    answer = (
        f"echo '{suffix}'"
        if suffix is not None
        else f"exec {python} -c 'import sysconfig; print(sysconfig.get_config_var(\"EXT_SUFFIX\"))'"
    )
    config = where / "python3-config"
    config.write_text(f"#!/bin/sh\n{answer}\n")
    config.chmod(0o755)
    tools = (["make"] if make else []) + (["g++", "c++", "cc", "as", "ld"] if compiler else [])
    tools += extra
    for tool in tools:
        found = shutil.which(tool)
        if found is not None:
            (where / tool).symlink_to(found)
    return str(where)


def have_compiler() -> bool:
    return shutil.which("g++") is not None and shutil.which("make") is not None


def env_with_path(path: str, **extra: str) -> dict[str, str]:
    """This process's environment with ``PATH`` replaced (and ``extra`` set)."""
    return {**os.environ, "PATH": path, **extra}


# ----------------------------------------------------------------------------------------------
# A checkout whose build is slow and writes its artifact in pieces (no compiler needed)

#: Every run of the recipe appends its pid to $(NVRX_TEST_BUILD_LOG); the artifact, a Python
#: module, is written in five pieces $(NVRX_TEST_PIECE_S) apart: imported before the last, it
#: is cut (SyntaxError) or says COMPLETE is False. With $(NVRX_TEST_GATE) set, the recipe
#: writes nothing until that file exists: a test holds the build there until it has seen what
#: it waits for. A ``sleep`` that cannot run fails the recipe: a build that is not slow would
#: let the tests of what happens meanwhile pass without anything happening meanwhile.
SLOW_MAKEFILE = """\
OUT = helpers_data.py
SRC = helpers.src

default: $(OUT)

$(OUT): $(SRC)
\techo $$$$ >> "$(NVRX_TEST_BUILD_LOG)"
\twhile [ -n "$(NVRX_TEST_GATE)" ] && [ ! -e "$(NVRX_TEST_GATE)" ]; do sleep 0.02 || exit 1; done
\tprintf 'PIECES = [\\n' > $@
\tfor i in 1 2 3 4 5; do \\
\t  sleep $(NVRX_TEST_PIECE_S) || exit 1; printf '    "piece %s",\\n' $$i >> $@; \\
\tdone
\tprintf ']\\nCOMPLETE = len(PIECES) == 5\\n' >> $@
"""
#: What the slow recipe runs besides make and the shell's builtins: a PATH of
#: :func:`tool_bin` needs them.
SLOW_TOOLS = ("sleep",)

#: What Megatron's ``megatron/core/datasets/helpers.py`` does with what was built: import it.
#: Each import is recorded in $(NVRX_TEST_IMPORT_LOG): ``<pid> whole`` or ``<pid> HALF ...``.
SLOW_HELPERS = """\
import os

try:
    from megatron.core.datasets.helpers_data import COMPLETE
    said = "whole" if COMPLETE else "HALF COMPLETE is False"
except Exception as exc:  # a module cut mid-write: SyntaxError, ImportError, NameError
    said = f"HALF {type(exc).__name__}: {exc}"
with open(os.environ["NVRX_TEST_IMPORT_LOG"], "a") as log:
    log.write(f"{os.getpid()} {said}\\n")
if said != "whole":
    raise ImportError(f"half-built helpers_data.py: {said}")
"""

#: Megatron's entry point as far as the first-use build goes: rank 0 compiles the helpers
#: (compile_helpers: make in their directory), every rank then imports them.
SLOW_PRETRAIN = """\
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if os.environ.get("RANK", "0") == "0":
    from megatron.core.datasets.utils import compile_helpers

    compile_helpers()
from megatron.core.datasets import helpers  # noqa: E402,F401

print("fake megatron: helpers imported whole", flush=True)
"""


def slow_checkout(root: Path) -> Path:
    """A Megatron-shaped checkout whose first-use build takes 5 x $(NVRX_TEST_PIECE_S)."""
    return megatron_checkout(
        root,
        makefile=SLOW_MAKEFILE,
        source="source of the helpers\n",
        source_name="helpers.src",
        extra={
            "pretrain_gpt.py": SLOW_PRETRAIN,
            "megatron/core/__init__.py": "",
            f"{DATASETS}/helpers.py": SLOW_HELPERS,
        },
    )
