"""Skewed host clocks for the expiry check: monotonic offsets of hours in both directions.

A time namespace may not move a clock below zero, so a negative offset of hours needs a
machine up for longer than that. When it is not, the control host is moved forward instead and
the other hosts are placed hours ahead of it and hours behind it (relative skew is what a
budget crossing hosts has to survive). Pure: the caller passes the uptime.
"""

from __future__ import annotations

import dataclasses

from apps.fleet.spec import FleetSpec

DEFAULT_SKEW_S = 3 * 3600
# Headroom so a clock moved back stays well above zero.
MARGIN_S = 600


def skewed_offsets(hosts: list[str], control_host: str, skew_s: int, uptime_s: float) -> dict[str, int]:
    """Monotonic offset per host. Non-control hosts alternate ahead (+skew) and behind (-skew) of
    the control host; the control host sits at 0 when the machine has been up long enough,
    else at +skew so that every offset is >= 0."""
    if skew_s <= 0:
        raise ValueError(f"skew must be > 0 s, got {skew_s}")
    others = [h for h in hosts if h != control_host]
    base = 0 if uptime_s > skew_s + MARGIN_S else skew_s
    offsets = {control_host: base}
    for i, host in enumerate(others):
        offsets[host] = base + (skew_s if i % 2 == 0 else -skew_s)
    return offsets


def describe(offsets: dict[str, int], control_host: str) -> str:
    base = offsets[control_host]
    parts = [f"{h} {'+' if o - base >= 0 else '-'}{abs(o - base) / 3600:g} h" for h, o in offsets.items()
             if h != control_host]
    return (f"monotonic offsets relative to the control host {control_host}: {', '.join(parts) or 'none'}; "
            f"qualify's own clock {'+' if -base >= 0 else '-'}{abs(base) / 3600:g} h")


def with_offsets(spec: FleetSpec, offsets: dict[str, int]) -> FleetSpec:
    hosts = tuple(dataclasses.replace(h, clock_offset_s=offsets.get(h.name, h.clock_offset_s)) for h in spec.hosts)
    return dataclasses.replace(spec, hosts=hosts)
