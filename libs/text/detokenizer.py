"""Incremental detokenization and stop-string matching for streamed output.

Byte-level BPE tokens can end inside a UTF-8 sequence, so deltas are produced by a UTF-8
incremental decoder over the tokens' bytes: an incomplete trailing sequence is held back until
the bytes that complete it arrive, and invalid bytes become U+FFFD exactly as the full decode
renders them. The concatenation of every delta plus `flush()` equals the full decode.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from dataclasses import dataclass


class IncrementalDetokenizer:
    """Turns token ids into text deltas that are always whole characters."""

    def __init__(self, token_bytes: Sequence[bytes], skip_ids: frozenset[int] = frozenset()):
        self._token_bytes = token_bytes
        self._skip_ids = skip_ids
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        # Ids the tokenizer does not know (a model vocabulary padded past the tokenizer's)
        # decode to nothing, as in the full decode.
        if token_id in self._skip_ids or not 0 <= token_id < len(self._token_bytes):
            return ""
        return self._decoder.decode(self._token_bytes[token_id])

    def flush(self) -> str:
        """Ends the stream: held-back incomplete bytes become U+FFFD, as in the full decode."""
        return self._decoder.decode(b"", final=True)


class StopMatcher:
    """Finds stop strings in streamed text, even when one spans several deltas.

    Text that could still be the beginning of a stop string is held back; the stop string
    itself is never emitted.
    """

    def __init__(self, stop: Sequence[str]) -> None:
        self._stop = tuple(s for s in stop if s)
        self._pending = ""
        self.stopped = False

    def push(self, text: str) -> str:
        if self.stopped:
            return ""
        self._pending += text
        if not self._stop:
            out, self._pending = self._pending, ""
            return out
        hit = self._first_hit()
        # Text from here on could still begin a stop string that completes later; a longer
        # stop string that starts before a complete one wins, however the text was split.
        undecided = len(self._pending) - self._longest_stop_prefix_suffix()
        if hit >= 0 and hit <= undecided:
            self.stopped = True
            out, self._pending = self._pending[:hit], ""
            return out
        out, self._pending = self._pending[:undecided], self._pending[undecided:]
        return out

    def flush(self) -> str:
        if self.stopped:
            out = ""
        else:
            hit = self._first_hit()
            self.stopped = hit >= 0
            out = self._pending[:hit] if self.stopped else self._pending
        self._pending = ""
        return out

    def _first_hit(self) -> int:
        return min((i for i in (self._pending.find(s) for s in self._stop) if i >= 0), default=-1)

    def _longest_stop_prefix_suffix(self) -> int:
        pending = self._pending
        longest = 0
        for stop in self._stop:
            for length in range(min(len(stop) - 1, len(pending)), longest, -1):
                if pending.endswith(stop[:length]):
                    longest = length
                    break
        return longest


@dataclass(frozen=True)
class TextDelta:
    text: str
    stopped: bool


class TextStream:
    """Detokenizer plus stop matcher: one request's text output."""

    def __init__(self, token_bytes: Sequence[bytes], skip_ids: frozenset[int],
                 stop: Sequence[str]) -> None:
        self._detok = IncrementalDetokenizer(token_bytes, skip_ids)
        self._stop = StopMatcher(stop)

    def push(self, token_id: int) -> TextDelta:
        text = self._stop.push(self._detok.push(token_id))
        return TextDelta(text=text, stopped=self._stop.stopped)

    def finish(self) -> TextDelta:
        """Flushes everything held back; a stop string may still complete in the flush."""
        text = self._stop.push(self._detok.flush())
        text += self._stop.flush()
        return TextDelta(text=text, stopped=self._stop.stopped)
