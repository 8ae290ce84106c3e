"""FNX2's wire format, pure: frames, both metadata encodings, typed messages, tensors.

Bytes in, typed values out (and back): no asyncio, no sockets, no clocks. `codec.py` decodes
in the 2.0 validation order; `compact.py` is the `compact_meta` binary metadata; both check a
sequence table through `columns.py`. `admission.py` holds the in-band admission messages,
`leases.py` lease-id derivation and deadline budgets, `golden.py` the golden vector check.
"""
