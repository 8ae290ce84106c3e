"""The project tokenizer: a byte-level BPE `tokenizers.Tokenizer`, pinned by sha256."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from tokenizers import Tokenizer
from tokenizers.pre_tokenizers import ByteLevel

from libs.text.errors import TokenizerHashMismatch, UnsupportedTokenizer


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _byte_level_char_to_byte() -> dict[str, int]:
    """Inverse of the GPT-2 byte-to-unicode table used by the ByteLevel decoder."""
    table: dict[str, int] = {}
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    extra = 0
    for byte in range(256):
        if byte in printable:
            table[chr(byte)] = byte
        else:
            table[chr(256 + extra)] = byte
            extra += 1
    if set(table) != set(ByteLevel.alphabet()):
        raise UnsupportedTokenizer("byte-level alphabet of this tokenizers build is not GPT-2's")
    return table


_CHAR_TO_BYTE = _byte_level_char_to_byte()


def token_string_bytes(token: str) -> bytes:
    """Bytes the ByteLevel decoder produces for one token string.

    A token made only of byte-level alphabet characters maps char by char; any other token
    (an added token such as `<|im_end|>` with unusual characters) contributes its UTF-8 bytes.
    """
    try:
        return bytes(_CHAR_TO_BYTE[c] for c in token)
    except KeyError:
        return token.encode("utf-8")


@dataclass(frozen=True)
class TokenizerIdentity:
    path: str
    sha256: str


class ProjectTokenizer:
    """A loaded byte-level BPE tokenizer with its pinned identity and per-id byte table."""

    def __init__(self, tokenizer: Tokenizer, identity: TokenizerIdentity) -> None:
        self._tokenizer = tokenizer
        self.identity = identity
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.special_ids = frozenset(self._special_token_ids())

    @classmethod
    def from_file(cls, path: str | Path, expected_sha256: str | None = None) -> ProjectTokenizer:
        """Loads tokenizer.json; `expected_sha256`, when given, must match the file bytes."""
        raw = Path(path).read_bytes()
        digest = sha256_hex(raw)
        if expected_sha256 is not None and digest != expected_sha256:
            raise TokenizerHashMismatch(
                f"tokenizer {path}: sha256 {digest} does not match pinned {expected_sha256}")
        _require_byte_level_decoder(raw, path)
        tokenizer = Tokenizer.from_str(raw.decode("utf-8"))
        return cls(tokenizer, TokenizerIdentity(path=str(path), sha256=digest))

    def _special_token_ids(self) -> list[int]:
        decoder = self._tokenizer.get_added_tokens_decoder()
        return [token_id for token_id, added in decoder.items() if added.special]

    def token_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` without any added BOS/EOS: the template decides framing."""
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        """Full decode; ids outside the vocabulary contribute nothing."""
        return self._tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    @cached_property
    def token_bytes(self) -> tuple[bytes, ...]:
        """Per-id bytes as the full decode would produce them (specials included)."""
        return tuple(token_string_bytes(self._tokenizer.id_to_token(i) or "")
                     for i in range(self.vocab_size))


def _require_byte_level_decoder(raw: bytes, path: str | Path) -> None:
    decoder = json.loads(raw).get("decoder") or {}
    if decoder.get("type") != "ByteLevel":
        raise UnsupportedTokenizer(
            f"tokenizer {path}: decoder {decoder.get('type')!r} is not ByteLevel; incremental "
            "detokenization relies on byte-level BPE")
