"""pytest hooks (glue only; the core lives in pytest-free modules)."""

from __future__ import annotations
