"""docs/architecture.md matches the tree: every module and package of pytest_nvrx is named there,
and every module it names exists (#24: the map is regenerated with the moves)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "pytest_nvrx"


def _map() -> str:
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    return text[text.index("```\n") : text.index("```\n", text.index("```\n") + 4)]


def test_every_module_is_on_the_map() -> None:
    names = set(re.findall(r"[A-Za-z_][\w]*(?:\.py|/)", _map()))
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if path.name in ("__init__.py", "__main__.py") or "__pycache__" in rel.parts:
            continue
        top = rel.parts[0]
        # a top-level module by its name; a package's modules by the package or their own name
        if len(rel.parts) == 1:
            if path.name not in names:
                missing.append(str(rel))
        elif f"{top}/" not in names:
            missing.append(f"{top}/")
        elif top in ("evidence", "criteria", "report", "settings") and not re.search(
            rf"\b{path.stem}\b", _map()
        ):
            missing.append(str(rel))  # the stages' packages name each of their modules
    assert not missing, f"docs/architecture.md does not name: {sorted(set(missing))}"


def test_every_module_the_map_names_exists() -> None:
    stale = []
    for name in sorted(set(re.findall(r"\b[a-z_]+\.py\b", _map()))):
        if not list(PACKAGE.rglob(name)):
            stale.append(name)
    assert not stale, f"docs/architecture.md names modules that do not exist: {stale}"
