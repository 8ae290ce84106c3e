"""The background fleet's keeper: `fornax up` without --foreground starts the same fleet in
a detached process that stays attached to it (so its stage workers are supervised and
restarted like a foreground fleet's), relays its output until the fleet is ready, and exits.

The keeper is the workers' parent (only a parent can tell a crash from a clean exit), writes
`keeper.pid` and, once the route serves, `keeper.ready` in the state directory; `fornax down`
stops the keeper first, and the keeper stops its fleet.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from libs.service.host import pid_alive

KEEPER_FLAG = "--keeper"
_PID, _READY, _OUT, _ERR = "keeper.pid", "keeper.ready", "keeper.out", "keeper.log"


def mark_ready(state_dir: str | Path) -> None:
    """Called by the keeper once its fleet serves."""
    Path(state_dir, _READY).write_text(str(os.getpid()), encoding="utf-8")


def keeper_pid(state_dir: str | Path) -> int | None:
    """The running keeper of this state directory, if any."""
    try:
        pid = int(Path(state_dir, _PID).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return pid if pid_alive(pid) and _is_keeper(pid) else None


def start_keeper(state_dir: str | Path, argv: list[str]) -> int:
    """Start `fornax <argv> --foreground --keeper` detached, relay its output until it is ready
    (0) or has exited (its exit code)."""
    state = Path(state_dir)
    state.mkdir(parents=True, exist_ok=True)
    for name in (_READY, _OUT, _ERR):
        Path(state, name).unlink(missing_ok=True)
    with open(state / _OUT, "wb") as out, open(state / _ERR, "wb") as err:
        process = subprocess.Popen([sys.executable, "-m", "apps.cli.main", *argv, "--foreground", KEEPER_FLAG],
                                   stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
    Path(state, _PID).write_text(str(process.pid), encoding="utf-8")
    relays = [_Relay(state / _OUT, sys.stdout), _Relay(state / _ERR, sys.stderr)]
    while True:
        exited = process.poll()
        ready = Path(state, _READY).exists()
        for relay in relays:
            relay.pump()
        if exited is not None:
            return exited or 1  # a keeper only exits once its fleet is gone
        if ready:
            print(f"fleet kept by pid {process.pid} (stage workers and the orchestrator are restarted if they die); "
                  f"`fornax down` stops it; keeper log: {state / _ERR}", file=sys.stderr)
            return 0
        time.sleep(0.1)


def stop_keeper(state_dir: str | Path, timeout_s: float) -> bool:
    """SIGTERM the keeper (it stops its fleet) and wait for it; True if there was one and it
    is gone."""
    pid = keeper_pid(state_dir)
    if pid is None:
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid) or _is_zombie(pid):
            break
        time.sleep(0.05)
    for name in (_PID, _READY):
        Path(state_dir, name).unlink(missing_ok=True)
    return not pid_alive(pid) or _is_zombie(pid)


class _Relay:
    def __init__(self, path: Path, stream) -> None:
        self.path, self.stream, self.offset = path, stream, 0

    def pump(self) -> None:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
        except OSError:
            return
        if chunk:
            self.offset += len(chunk)
            self.stream.write(chunk.decode(errors="replace"))
            self.stream.flush()


def _is_keeper(pid: int) -> bool:
    try:
        return KEEPER_FLAG.encode() in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except (OSError, IndexError):
        return True
