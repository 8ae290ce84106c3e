"""How a `fornax parity` gate ends: its report, as JSON with the verdict or as text, and the exit status."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from typing import Any


def finish_gate(report: Any, as_json: bool, render: Callable[[Any], str]) -> int:
    """Print a gate `report` (a dataclass with `passed`) and return 0 when it passed, 1 when it failed."""
    if as_json:
        print(json.dumps({**asdict(report), "passed": report.passed}, indent=2, default=str))
    else:
        print(render(report))
    return 0 if report.passed else 1
