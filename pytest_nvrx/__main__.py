"""``python -m pytest_nvrx``."""

from __future__ import annotations

import sys

from pytest_nvrx.cli import main

if __name__ == "__main__":
    sys.exit(main())
