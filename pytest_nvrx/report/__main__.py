"""``python -m pytest_nvrx.report RUN_DIR... [-o report.html] [--json report.json]``."""

from __future__ import annotations

import sys

from pytest_nvrx.report.main import report_main

if __name__ == "__main__":
    sys.exit(report_main(sys.argv[1:]))
