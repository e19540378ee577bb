"""Where a benchmark run came from: the code's commit and how busy the machine was.

Both go into ``meta.json`` and the generated header of ``results.md``, so a
reader can tell which code a figure measured and whether its times were taken
on a quiet machine.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parent.parent


def code_commit() -> str:
    """The checkout's HEAD (short hash), with ``-dirty`` when tracked files differ from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(_CHECKOUT), *args], capture_output=True, text=True,
                              check=True).stdout.strip()
    try:
        head = git("rev-parse", "--short=12", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return head + ("-dirty" if dirty else "")


def machine_load() -> str:
    """The 1-minute load average against the core count when the run started."""
    try:
        one_minute = os.getloadavg()[0]
    except OSError:
        return "unknown"
    return f"load average {one_minute:.2f} on {os.cpu_count()} cores at start"
