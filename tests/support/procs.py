"""Start one service process the way the launcher does, for lifecycle tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from apps.fleet.health import check_health


class ServiceProc:
    def __init__(self, module: str, workdir: Path, env: dict[str, str] | None = None, args: list[str] | None = None):
        self.ready_file = workdir / f"{module}.ready.json"
        self.log_file = workdir / f"{module}.log"
        # Component tests exercise one service's behaviour in plaintext, chosen explicitly;
        # the fleet launcher and tests/integration/security run with mTLS.
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "FORNAX_READY_FILE": str(self.ready_file),
                    "FORNAX_INSECURE": "1", "FORNAX_STATE_DIR": str(workdir),
                    # Test checkpoints and artifacts live under the system temporary directory.
                    "FORNAX_READ_ROOTS": tempfile.gettempdir(), **(env or {})}
        self._log = open(self.log_file, "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", module, *(args or [])], stdout=self._log, stderr=subprocess.STDOUT, env=full_env
        )
        self.ports: dict[str, int] = {}

    def wait_serving(self, timeout_s: float = 60.0) -> str:
        deadline = time.monotonic() + timeout_s
        while not self.ready_file.exists():
            if self.process.poll() is not None:
                raise RuntimeError(f"exited early: {self.log_file.read_text()}")
            if time.monotonic() > deadline:
                raise TimeoutError("no ready file")
            time.sleep(0.05)
        self.ports = json.loads(self.ready_file.read_text())
        address = f"127.0.0.1:{self.ports['grpc']}"
        while check_health(address) != "SERVING":
            if time.monotonic() > deadline:
                raise TimeoutError(f"{address} not SERVING")
            time.sleep(0.05)
        return address

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return self.process.returncode

    def log_lines(self) -> list[str]:
        return [line for line in self.log_file.read_text().splitlines() if line.strip()]
