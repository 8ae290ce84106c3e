"""Which asyncio event loop implementation a process runs: the standard library's, or
uvloop (libuv), chosen per process, explicitly, never by silent fallback.

Measured on the FNX2 hop (`fornax bench fnx2 --loop`, 2-core shared host): uvloop cuts
the CPU per 32 KiB decode round trip by about 40% on both ends, but it speeds the raw-socket
baseline as much, so neither ratio (RTT vs raw, 16 MiB channel vs raw) clearly improves,
and the services' gRPC side runs on asyncio; asyncio stays the default."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class EventLoopKind(enum.Enum):
    ASYNCIO = "asyncio"
    UVLOOP = "uvloop"


def run(main: Coroutine[Any, Any, T], kind: EventLoopKind) -> T:
    """`asyncio.run(main)` on the chosen loop implementation."""
    if kind is EventLoopKind.UVLOOP:
        import uvloop  # a declared dependency: an ImportError here is a broken install

        return uvloop.run(main)
    return asyncio.run(main)


def describe(kind: EventLoopKind) -> str:
    if kind is EventLoopKind.UVLOOP:
        import uvloop

        return f"uvloop {uvloop.__version__}"
    return "asyncio (stdlib)"
