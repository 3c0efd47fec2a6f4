"""Shared fixtures for the test suite (the plugin's own tests use pytester separately)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def megatron_stub(tmp_path: Path) -> Path:
    """A directory that passes the recipe's Megatron path check (pretrain_gpt.py present).

    Only the path check and argv construction use it; nothing ever executes it.
    """
    root = tmp_path / "Megatron-LM"
    root.mkdir()
    (root / "pretrain_gpt.py").write_text("raise SystemExit('not a real Megatron')\n")
    return root


def snapshot(root: Path) -> dict[str, tuple[bool, int, int]]:
    """Every path under ``root`` with (is_dir, size, mtime_ns): detects any write."""
    out: dict[str, tuple[bool, int, int]] = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(root))] = (p.is_dir(), st.st_size, st.st_mtime_ns)
    return out
