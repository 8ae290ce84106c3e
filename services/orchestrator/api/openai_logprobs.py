"""OpenAI `logprobs` bodies from the final stage's per-token log probabilities.

Chat completions carry `{"content": [{token, logprob, bytes, top_logprobs}]}`; legacy
completions carry parallel lists (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`).
Token text is the token's bytes decoded as UTF-8 with replacement; `bytes` is exact.
"""

from __future__ import annotations

from libs.model.logprobs import TokenLogprobs


class LogprobsFormatter:
    def __init__(self, token_bytes: tuple[bytes, ...]) -> None:
        self._bytes = token_bytes
        self._text_offset = 0

    def _raw(self, token_id: int) -> bytes:
        return self._bytes[token_id] if 0 <= token_id < len(self._bytes) else b""

    def _entry(self, token_id: int, logprob: float) -> dict:
        raw = self._raw(token_id)
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob,
                "bytes": list(raw)}

    def chat(self, entries: tuple[TokenLogprobs, ...]) -> dict:
        return {"content": [{**self._entry(e.token_id, e.logprob),
                             "top_logprobs": [self._entry(i, v) for i, v in e.top]}
                            for e in entries], "refusal": None}

    def completion(self, entries: tuple[TokenLogprobs, ...]) -> dict:
        """One chunk's worth; text offsets continue across calls on one formatter."""
        tokens = [self._raw(e.token_id).decode("utf-8", errors="replace") for e in entries]
        offsets = []
        for token in tokens:
            offsets.append(self._text_offset)
            self._text_offset += len(token)
        return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
                "top_logprobs": [self._top_by_text(e) for e in entries], "text_offset": offsets}

    def _top_by_text(self, entry: TokenLogprobs) -> dict[str, float]:
        """Keyed by text, as the legacy format is: equal spellings keep the likeliest."""
        top: dict[str, float] = {}
        for token_id, value in entry.top:
            top.setdefault(self._raw(token_id).decode("utf-8", errors="replace"), value)
        return top
