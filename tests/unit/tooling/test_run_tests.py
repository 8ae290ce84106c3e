"""scripts/run_tests.sh runs each test group in its own pytest, shows the 15 slowest tests and
the wall time of every group, and exits non-zero when any group fails or collects nothing."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "run_tests.sh"
# A stand-in for pytest: logs its arguments, then exits with the code a group's
# `exit_code` file names (0 without one). Its last argument is the group.
FAKE_PYTEST = """#!/usr/bin/env bash
group="${@: -1}"
echo "$@" >> "$(dirname "$0")/calls.log"
exit "$(cat "$group/exit_code" 2>/dev/null || echo 0)"
"""


def suite(root: Path, exit_codes: dict[str, int]) -> Path:
    """A tree with the three kinds of group, each holding one test file, and the fake pytest."""
    for group in ("tests/faults", "tests/integration/alpha", "tests/integration/beta", "tests/unit"):
        (root / group).mkdir(parents=True)
        (root / group / "test_x.py").write_text("")
    for group, code in exit_codes.items():
        (root / group / "exit_code").write_text(str(code))
    fake = root / "fake_pytest"
    fake.write_text(FAKE_PYTEST)
    fake.chmod(0o755)
    return fake


def run(root: Path, exit_codes: dict[str, int]) -> subprocess.CompletedProcess[str]:
    fake = suite(root, exit_codes)
    return subprocess.run(["bash", str(SCRIPT), str(fake)], cwd=root, capture_output=True, text=True,
                          timeout=60)


def test_every_group_runs_with_its_slowest_tests_and_its_wall_time(tmp_path):
    done = run(tmp_path, {})
    assert done.returncode == 0, done.stderr
    calls = (tmp_path / "calls.log").read_text().splitlines()
    groups = ["tests/faults", "tests/integration/alpha", "tests/integration/beta", "tests/unit"]
    assert calls == [f"-p no:cacheprovider --durations=15 {group}" for group in groups]
    table = done.stdout.split("=== wall time per group\n")[1].splitlines()
    assert [line.split()[1:] for line in table[:4]] == [["ok", group] for group in groups]
    assert all(line.split()[0].endswith("s") for line in table[:4])
    assert "every test group passed (4 groups)" in done.stdout


@pytest.mark.parametrize("code", [1, 5], ids=["failed", "collected-nothing"])
def test_a_failing_or_empty_group_fails_the_run_after_every_group_ran(tmp_path, code):
    done = run(tmp_path, {"tests/integration/alpha": code})
    assert done.returncode != 0
    assert "FAILED groups: tests/integration/alpha" in done.stderr
    assert len((tmp_path / "calls.log").read_text().splitlines()) == 4
    assert f"(exit {code})" in done.stdout
    table = done.stdout.split("=== wall time per group\n")[1].splitlines()
    assert table[1].split()[1:] == ["FAILED", "tests/integration/alpha"]
