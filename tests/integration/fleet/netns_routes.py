"""What the netns replica-route tests share: the root-and-namespaces skip, the fleet files, the
prompts their streams send, the `fornax` CLI run in a test's own directory and a log's JSON events
(the module's tiny checkpoint is `conftest.py`'s)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

NETNS_ONLY = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0 or not Path("/proc/self/ns/net").exists(),
                       reason="netns fleets need root and namespaces"),
]
REPO = Path(__file__).resolve().parents[3]
PROMPTS = ([5, 17, 42, 9], [7, 8, 9, 10, 11], [12, 30, 4], [21, 22, 23, 24])


def fornax(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "apps.cli.main", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def log_events(path: str | Path) -> list[dict]:
    """The JSON lines of a service or keeper log (other lines skipped)."""
    text = Path(path).read_text(errors="replace")
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]
