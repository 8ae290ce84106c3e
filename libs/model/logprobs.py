"""Log probabilities of sampled tokens, computed at the final stage from the raw logits.

They describe the model's own distribution (log-softmax of the float32 logits, before
temperature, penalties or grammar masks), as OpenAI and vLLM report them by default.

On the wire (FNX2 extension `sample_logprobs`) a sampled-token RESULT row becomes one fp32
"sample record" of RECORD_WIDTH columns: token id, its logprob, then MAX_TOP_LOGPROBS
(id, logprob) pairs by descending probability. Ids are exact in fp32 below 2**24; unused
pairs are (-1, 0) so every value stays finite.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_TOP_LOGPROBS = 20
RECORD_WIDTH = 2 + 2 * MAX_TOP_LOGPROBS
MAX_RECORD_TOKEN_ID = 1 << 24


@dataclass(frozen=True)
class TokenLogprobs:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # (id, logprob), most likely first


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float32 [rows, vocab] -> float32 log-probabilities (max-shifted, float64 sum)."""
    shifted = logits.astype(np.float32) - logits.max(axis=-1, keepdims=True)
    norm = np.log(np.exp(shifted.astype(np.float64)).sum(axis=-1, keepdims=True))
    return (shifted - norm).astype(np.float32)


def sample_records(logits: np.ndarray, token_ids: np.ndarray, top: int = MAX_TOP_LOGPROBS) -> np.ndarray:
    """float32 [S, RECORD_WIDTH] records for sampled tokens `token_ids` [S] of `logits` [S, vocab]."""
    if logits.shape[1] >= MAX_RECORD_TOKEN_ID:
        raise ValueError("vocabulary too large for fp32 sample records")
    lp = log_softmax(logits)
    rows = np.arange(lp.shape[0])
    k = min(top, lp.shape[1])
    best = np.argpartition(-lp, k - 1, axis=1)[:, :k]
    order = np.argsort(-lp[rows[:, None], best], axis=1, kind="stable")
    best = np.take_along_axis(best, order, axis=1)
    records = np.zeros((lp.shape[0], RECORD_WIDTH), dtype=np.float32)
    records[:, 0] = token_ids
    records[:, 1] = lp[rows, token_ids]
    records[:, 2::2] = -1.0
    records[:, 2:2 + 2 * k:2] = best
    records[:, 3:3 + 2 * k:2] = lp[rows[:, None], best]
    return records


def decode_record(record: np.ndarray, top: int) -> TokenLogprobs:
    pairs = record[2:].reshape(MAX_TOP_LOGPROBS, 2)[:top]
    return TokenLogprobs(int(record[0]), float(record[1]),
                         tuple((int(i), float(v)) for i, v in pairs if i >= 0))


def is_record_row(rows: np.ndarray) -> bool:
    return rows.dtype == np.float32 and rows.ndim == 2 and rows.shape == (1, RECORD_WIDTH)
