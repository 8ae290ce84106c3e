"""Which form a MAX linear product takes for a call, by its row count: batched (a matmul) or
streamed (a fused multiply-and-sum per row over weights laid out [out, in]).

MAX 26.7's CPU matmul over one row runs several times slower than the weight's memory read
allows (on a 2-core Sapphire Rapids host, the three [1, 1024] x [1024, 2816]-sized SwiGLU
products took 4.1 ms at best against 1.1 ms streamed, and numpy's 1.0 ms). A streamed product
reads the weight once per row, so it pays only for one or two rows. The rule is pure and
depends on the row count alone; both forms give the same result up to float rounding.
"""

from __future__ import annotations

# Products over at most this many rows stream (a one-row matmul costs about four weight reads).
STREAMED_MAX_ROWS = 2


def streams_rows(rows: int) -> bool:
    """Whether a product over `rows` rows runs streamed."""
    return 0 < rows <= STREAMED_MAX_ROWS
