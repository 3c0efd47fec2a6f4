"""Files a test watches: every path under a root with what would show a write."""

from __future__ import annotations

from pathlib import Path


def snapshot(root: Path) -> dict[str, tuple[bool, int, int]]:
    """Every path under ``root`` with (is_dir, size, mtime_ns): detects any write."""
    out: dict[str, tuple[bool, int, int]] = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(root))] = (p.is_dir(), st.st_size, st.st_mtime_ns)
    return out
