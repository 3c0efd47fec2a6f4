"""docs/architecture.md matches the tree: every module and package of pytest_nvrx is named in
its drawings, each in its folder, and every module they name exists (#24, #37: the map is
redrawn with the moves)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "pytest_nvrx"


def _map() -> str:
    """The fenced blocks of docs/architecture.md: the flow and the modules per folder."""
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    return "\n".join(re.findall(r"^```\n(.*?)^```\n", text, re.M | re.S))


def test_every_module_is_on_the_map() -> None:
    names = set(re.findall(r"[A-Za-z_][\w]*(?:\.py|/)", _map()))
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if path.name in ("__init__.py", "__main__.py") or "__pycache__" in rel.parts:
            continue
        if len(rel.parts) == 1:
            if path.name not in names:
                missing.append(str(rel))
            continue
        # a folder's module: the folder, each folder below it and the module by its name
        for folder in rel.parts[:-1]:
            if f"{folder}/" not in names:
                missing.append(f"{folder}/")
        if not re.search(rf"\b{path.stem}\b", _map()):
            missing.append(str(rel))
    assert not missing, f"docs/architecture.md does not name: {sorted(set(missing))}"


def test_every_module_the_map_names_exists() -> None:
    stale = []
    for name in sorted(set(re.findall(r"\b[a-z_]+\.py\b", _map()))):
        if not list(PACKAGE.rglob(name)):
            stale.append(name)
    assert not stale, f"docs/architecture.md names modules that do not exist: {stale}"


def test_the_map_draws_every_folder() -> None:
    """Each folder of the package heads its own paragraph of the map (its modules and rule)."""
    folders = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
    heads = set(re.findall(r"^(\w+)/ ", _map(), re.M))
    assert [f for f in folders if f not in heads] == []
