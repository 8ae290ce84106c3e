"""Request-named paths stay under a service's configured roots.

A path is resolved first (symlinks and `..` included), so neither a link nor a relative hop
can leave the root. Anything outside every root is refused with PATH_OUTSIDE_ROOTS.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from libs.service.errors import InvalidArgument, PermissionDenied


def parse_roots(raw: str | None) -> tuple[Path, ...]:
    """`a:b:c` (os.pathsep) to resolved roots; empty entries are ignored."""
    return tuple(Path(part).resolve() for part in (raw or "").split(os.pathsep) if part.strip())


def confine(raw: str, roots: Sequence[Path], field: str) -> Path:
    """raw, resolved, if it lies under one of roots; PermissionDenied otherwise."""
    if not raw:
        raise InvalidArgument(f"{field} is required", field=field)
    if "\0" in raw:
        raise InvalidArgument(f"{field} contains a NUL byte", reason="INVALID_PATH", field=field)
    resolved = Path(raw).resolve()
    if any(resolved == root or resolved.is_relative_to(root) for root in roots):
        return resolved
    allowed = ", ".join(str(r) for r in roots) or "no roots are configured"
    raise PermissionDenied(f"{raw!r} resolves to {resolved}, outside this service's roots ({allowed})",
                           reason="PATH_OUTSIDE_ROOTS", field=field)


def roots_with(extra: Iterable[str | os.PathLike], roots: Sequence[Path]) -> tuple[Path, ...]:
    return (*roots, *(Path(p).resolve() for p in extra))
