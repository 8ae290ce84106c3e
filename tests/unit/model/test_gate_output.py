"""A parity gate's last words: the report (JSON carries the verdict) and the exit status."""

import json
from dataclasses import dataclass

from apps.cli.gate_output import finish_gate


@dataclass(frozen=True)
class _Report:
    agreement: float
    gate: float

    @property
    def passed(self) -> bool:
        return self.agreement >= self.gate


def test_a_failed_gate_exits_1_and_its_json_carries_the_verdict(capsys):
    assert finish_gate(_Report(0.885, 0.95), True, str) == 1
    assert json.loads(capsys.readouterr().out) == {"agreement": 0.885, "gate": 0.95, "passed": False}


def test_a_passed_gate_exits_0_and_prints_its_text(capsys):
    assert finish_gate(_Report(0.97, 0.95), False, lambda r: f"top-1 {r.agreement}") == 0
    assert capsys.readouterr().out == "top-1 0.97\n"
