"""`make run` leaves `.fornax/` in the checkout: the fleet CA, the operator certificate and a
fleet.json naming the fleet's (by then gone) services. The suite's CLI tests must pass from a
working directory that holds it, as they do from a clean one."""

import datetime as dt
import re
import subprocess
import sys
from pathlib import Path

import pytest

from libs.security.cli_credentials import OPERATOR
from libs.security.store import CertStore
from libs.service.fleet_state import FleetState, ServiceEntry, write_fleet

pytestmark = pytest.mark.integration
TESTS = Path(__file__).resolve().parents[2]
# Tests that run a CLI in-process with its default state directory, `.fornax` under the
# working directory; each failed with REGISTRY_UNAVAILABLE beside a user's `.fornax/certs`.
CLI_TESTS = (
    "integration/evidence_registry/test_registry_service.py::test_cli_round_trip",
    "integration/planner/test_deployment_mode.py::test_deployment_mode_through_the_registry",
    "unit/evidence_registry/test_cli.py",
    "unit/planner/test_cli.py",
)
GONE = "127.0.0.1:9"  # the discard port: nothing of a test's listens there


def leave_a_user_fleet_state(state_dir: Path) -> None:
    now = dt.datetime.now(dt.UTC)
    store = CertStore(state_dir)
    store.init(now)
    store.ensure(OPERATOR, now)
    registry = ServiceEntry("evidence_registry", "evidence_registry", GONE, GONE, pid=1, log="registry.log")
    write_fleet(state_dir, FleetState((registry,), api=f"http://{GONE}", tls=True))


def test_cli_tests_pass_from_a_directory_holding_a_user_fleet_state(tmp_path):
    leave_a_user_fleet_state(tmp_path / ".fornax")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *(str(TESTS / t) for t in CLI_TESTS)],
        cwd=tmp_path, capture_output=True, text=True, timeout=60)  # a few seconds when healthy
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    # Every selected test ran and passed: none failed, errored or was skipped.
    assert re.fullmatch(r"\d+ passed in [\d.]+s", summary), summary
    assert int(summary.split()[0]) >= len(CLI_TESTS)
