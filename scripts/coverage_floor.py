#!/usr/bin/env python3
"""Fail when a module of the run loop or the memory watchdog is covered less than the floor by
the in-process tests (reads the .coverage file that `scripts/test` leaves)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

FLOOR_PERCENT = 85.0
PACKAGES = ("supervisor/run/", "supervisor/memory/")


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "coverage.json"
        subprocess.run([sys.executable, "-m", "coverage", "json", "-q", "-o", str(out)], check=True)
        files = json.loads(out.read_text())["files"]
    low = {
        name: summary["summary"]["percent_covered"]
        for name, summary in sorted(files.items())
        if name.startswith(PACKAGES) and summary["summary"]["percent_covered"] < FLOOR_PERCENT
    }
    for name, percent in low.items():
        print(f"{name}: {percent:.1f} % covered in-process, below {FLOOR_PERCENT:g} %")
    return 1 if low else 0


if __name__ == "__main__":
    sys.exit(main())
