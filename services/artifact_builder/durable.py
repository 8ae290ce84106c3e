"""Durable commits for artifact directories, and removal of what an interrupted build left.

A rename is atomic but not durable: without fsync of the files first, a power cut can leave
the final name pointing at empty or partial files. So every file is fsynced, then the
directory, then the rename, then the parent directory.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from libs.service.host import pid_alive

TEMP_STAGE_PREFIX = ".tmp-stage-"
# `.tmp-stage-<index>-<pid>-<random>`: the pid says whether its builder may still be running.
_TEMP_STAGE = re.compile(rf"^{re.escape(TEMP_STAGE_PREFIX)}\d+-(\d+)-")
_TEMP_LINK = re.compile(r"^\.stage-\d+\.tmp-[0-9a-f]+$")


def temp_stage_prefix(stage_index: int) -> str:
    return f"{TEMP_STAGE_PREFIX}{stage_index}-{os.getpid()}-"


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every regular file under `root`, then every directory, deepest first."""
    directories = []
    for path in sorted(root.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if path.is_symlink():
            continue
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
        elif path.is_dir():
            directories.append(path)
    for directory in [*directories, root]:
        fsync_dir(directory)


def durable_rename(source: Path, target: Path) -> None:
    fsync_tree(source)
    os.rename(source, target)
    fsync_dir(target.parent)


def sweep_stale_temps(store: Path, out_dir: Path) -> list[Path]:
    """Removes temp stage directories whose builder process is gone (or that predate the
    pid in their name) and half-made stage links; returns what it removed."""
    removed = []
    for path in store.glob(f"{TEMP_STAGE_PREFIX}*"):
        match = _TEMP_STAGE.match(path.name)
        if match is None or not pid_alive(int(match.group(1))):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    for path in out_dir.glob(".stage-*.tmp-*"):
        if _TEMP_LINK.match(path.name) and path.is_symlink():
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed
