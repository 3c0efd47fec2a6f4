"""The stages' import rules (docs/architecture.md, each folder's ``__init__``): a unit of the
package imports only the units before it in LAYERS and itself, worker/ and megatron/ import
nothing of ours, worker/ only the stdlib, no module imports another's private names, and the
package root keeps at most 8 modules. Read from the source's syntax trees (every import, also
those inside functions and under TYPE_CHECKING)."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_nvrx"

#: The package's units, lowest first: a top-level module (by its file name) or a folder.
LAYERS = (
    "__init__.py",
    "layout.py",
    "worker/",
    "megatron/",
    "settings/",
    "evidence/",
    "outputs.py",
    "workloads/",
    "criteria/",
    "launch/",
    "report/",
    "compare/",
    "verify.py",
    "session/",
    "selftest/",
    "cli.py",
    "fixtures.py",
    "plugin.py",
    "suite/",
    "__main__.py",
)


def unit_of(module: str) -> str:
    """``pytest_nvrx.launch.run`` -> ``launch/``; ``pytest_nvrx.cli`` -> ``cli.py``."""
    parts = module.split(".")
    assert parts[0] == "pytest_nvrx", module
    if len(parts) == 1:
        return "__init__.py"
    if (PACKAGE / parts[1]).is_dir():
        return f"{parts[1]}/"
    return f"{parts[1]}.py"


def module_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imports_of(path: Path, here: str | None = None) -> Iterator[tuple[int, str]]:
    """(line, absolute module) of every import in ``path`` (module ``here``, else the one its
    place in the package names), relative ones resolved."""
    here = here or (module_of(path) if path.is_relative_to(PACKAGE) else path.stem)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                yield node.lineno, ".".join([*base, *([node.module] if node.module else [])])
            else:
                assert node.module is not None
                yield node.lineno, node.module


def sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def upward_imports(modules: list[tuple[str, Path]]) -> list[str]:
    """Every import of ours that leaves its unit for one not before it in LAYERS."""
    wrong = []
    for module, path in modules:
        unit = unit_of(module)
        for line, name in imports_of(path, module):
            if name != "pytest_nvrx" and not name.startswith("pytest_nvrx."):
                continue
            target = unit_of(name)
            if target != unit and LAYERS.index(target) >= LAYERS.index(unit):
                wrong.append(f"{module}:{line} imports {name} ({target})")
    return wrong


def test_every_unit_has_a_layer() -> None:
    units = {unit_of(module_of(path)) for path in sources()}
    assert sorted(units - set(LAYERS)) == []
    assert sorted(set(LAYERS) - units) == []


def test_no_unit_imports_a_later_one() -> None:
    assert upward_imports([(module_of(path), path) for path in sources()]) == []


def test_an_import_up_the_layers_is_found(tmp_path: Path) -> None:
    """The rule can fail: a criteria module that imports the launch stage is named."""
    stray = tmp_path / "stray.py"
    stray.write_text(
        "import os\nfrom pytest_nvrx.launch.run import plan_launch\n", encoding="utf-8"
    )
    assert upward_imports([("pytest_nvrx.criteria.stray", stray)]) == [
        "pytest_nvrx.criteria.stray:2 imports pytest_nvrx.launch.run (launch/)"
    ]


@pytest.mark.parametrize("folder", ["worker", "megatron"])
def test_floor_folders_import_nothing_of_ours_from_outside(folder: str) -> None:
    outside = [
        f"{path.relative_to(PACKAGE)}:{line} imports {name}"
        for path in sorted((PACKAGE / folder).rglob("*.py"))
        for line, name in imports_of(path)
        if (name == "pytest_nvrx" or name.startswith("pytest_nvrx."))
        and not name.startswith(f"pytest_nvrx.{folder}")
    ]
    assert outside == []


def load_time_imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) of the imports a module runs as it loads: all but those in functions."""
    functions = [
        node
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    inside = {(n.lineno) for f in functions for n in ast.walk(f) if hasattr(n, "lineno")}
    yield from ((line, name) for line, name in imports_of(path) if line not in inside)


def foreign_imports(paths: list[Path], own: set[str]) -> list[str]:
    return [
        f"{path.name}:{line} imports {name}"
        for path in paths
        for line, name in load_time_imports(path)
        if name.partition(".")[0] not in sys.stdlib_module_names | own
    ]


def test_worker_imports_only_the_stdlib() -> None:
    """What runs inside the training processes loads with only its own interpreter's stdlib:
    the injector runs as a script, the plant hook from PYTHONPATH (its modules name each other
    bare, as ``nvrx_plants``). A plant's patch of a Megatron function may import what that
    function's module already did (torch), when it runs."""
    paths = sorted((PACKAGE / "worker").rglob("*.py"))
    assert foreign_imports(paths, {p.stem for p in paths} | {"pytest_nvrx"}) == []


def test_a_worker_import_of_torch_is_found(tmp_path: Path) -> None:
    module = tmp_path / "hook.py"
    module.write_text("import os\nimport torch\n\n\ndef f():\n    import numpy\n")
    assert foreign_imports([module], set()) == ["hook.py:2 imports torch"]


def test_the_package_root_keeps_at_most_eight_modules() -> None:
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= 8, root


def private_imports(paths: list[Path]) -> list[str]:
    """Every ``from pytest_nvrx... import _name``: a private name used outside its module."""
    wrong = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom) or node.level:
                continue
            if not (node.module or "").startswith("pytest_nvrx"):
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    wrong.append(f"{path.name}:{node.lineno} imports {node.module}.{alias.name}")
    return wrong


def test_no_module_imports_another_modules_private_names() -> None:
    assert private_imports(sources()) == []


def test_a_private_import_is_found(tmp_path: Path) -> None:
    module = tmp_path / "table.py"
    module.write_text("from pytest_nvrx.settings.values import _secret, public\n")
    assert private_imports([module]) == ["table.py:1 imports pytest_nvrx.settings.values._secret"]
