"""`fornax host add`: the checks a joined stage worker passes before it may take a route.

Its host's wall clock is read through `GetHealth` (`unix_time_ns`) between two readings of this
machine's clock: the offset is the worker's time minus the midpoint, known to within half the
round trip. A clock beyond the tolerance even at the bound's best (the default is the
certificates' backdating, `libs/security/certs.BACKDATE`: a worker skewed further would see fresh
fleet certificates as not yet valid, or expired ones as valid) refuses the join:
HOST_CLOCK_SKEWED; a worker that reports no clock: HOST_CLOCK_UNKNOWN. With `--profile` the
worker then profiles its stage (`fornax profile`'s `ProfileStage`, on the joining host alone,
stored as a physical measurement record); a profile that fails refuses the join:
JOIN_PROFILE_FAILED, with the profile's own reason. A refusal stops the joined worker; the
serving routes are never touched by a check.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from libs.security.certs import BACKDATE
from libs.service.errors import FailedPrecondition, FornaxError

DEFAULT_CLOCK_TOLERANCE_S = BACKDATE.total_seconds()


@dataclass(frozen=True)
class ClockReading:
    offset_ns: int  # the worker's clock minus this machine's, at the midpoint of the reading
    uncertainty_ns: int  # half the round trip: the offset is known to within this


def clock_reading(before_ns: int, worker_ns: int, after_ns: int) -> ClockReading:
    """The offset from this machine's clock read `before_ns` and `after_ns` around the worker's."""
    if after_ns < before_ns:
        raise ValueError("the second reading precedes the first")
    midpoint = before_ns + (after_ns - before_ns) // 2
    return ClockReading(worker_ns - midpoint, (after_ns - before_ns + 1) // 2)


def check_clock(host: str, worker_ns: int, reading: ClockReading, tolerance_s: float) -> None:
    """Refuses a host whose clock is off by more than `tolerance_s` even at the reading's best."""
    if worker_ns <= 0:
        raise FailedPrecondition(f"the stage worker on {host} reports no clock (a worker older than this check)",
                                 reason="HOST_CLOCK_UNKNOWN")
    least_ns = abs(reading.offset_ns) - reading.uncertainty_ns
    if least_ns > tolerance_s * 1e9:
        side = "ahead of" if reading.offset_ns > 0 else "behind"
        raise FailedPrecondition(
            f"the clock of {host} is {abs(reading.offset_ns) / 1e9:.1f} s {side} this machine's "
            f"(+/- {reading.uncertainty_ns / 1e9:.3f} s), beyond the {tolerance_s:g} s tolerance; "
            "set its time (NTP)", reason="HOST_CLOCK_SKEWED")


def profile_refusal(host: str, exc: BaseException) -> FailedPrecondition:
    """The refusal of a join whose profile failed, naming the profile's own reason."""
    if isinstance(exc, FornaxError):
        cause = f"{exc.reason}: {exc.message}"
    else:
        code = getattr(exc, "code", None)
        details = getattr(exc, "details", None)
        cause = (f"{code().name}: {details()}" if callable(code) and callable(details)
                 else f"{type(exc).__name__}: {exc}")
    return FailedPrecondition(f"the stage worker on {host} failed its profile ({cause})",
                              reason="JOIN_PROFILE_FAILED")


def read_clock(address: str, channel) -> tuple[int, ClockReading]:
    """(the worker's clock, the reading) through one GetHealth."""
    from fornax.stage_worker.v1 import stage_worker_pb2 as sw_pb
    from fornax.stage_worker.v1 import stage_worker_pb2_grpc as sw_grpc
    from libs.service.channels import open_channel

    with open_channel(address, channel) as opened:
        stub = sw_grpc.StageWorkerServiceStub(opened)
        stub.GetHealth(sw_pb.GetHealthRequest(), timeout=10)  # the connection is up before the reading
        before = time.time_ns()
        reply = stub.GetHealth(sw_pb.GetHealthRequest(), timeout=10)
        after = time.time_ns()
    return reply.unix_time_ns, clock_reading(before, reply.unix_time_ns, after)
