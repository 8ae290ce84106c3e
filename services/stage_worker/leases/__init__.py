"""The stage's FNX2 session rules: leases, KV epochs, exact replay and the fences of ended
leases (tombstones for plain 2.0 peers, a watermark for `lease_sequence` ones).

`ReceiverState` implements `libs.fnx2.channel.session.SessionRules`; the stage worker hands
one to its `Fnx2Receiver`.
"""

from services.stage_worker.leases.receiver_state import ReceiverLimits, ReceiverState

__all__ = ["ReceiverLimits", "ReceiverState"]
