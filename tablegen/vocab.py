"""The token alphabet shared by tablegen's tokenizer and the oracle's token constraints.

Every ordinary token ``i`` of a table model is a single character ``token_text(i)``, so a
regex or a list of choices over text is also one over token ids. Special tokens (EOS,
BOS, end-of-thinking) are ordinary rows of the table too; only their role differs.
"""

from __future__ import annotations

from specfuzz.errors import InvalidInput

# Printable, regex-safe-ish single characters: a-z, A-Z, 0-9, then Greek and Cyrillic
# letters. Regex metacharacters are never used, so ``choice`` strings need no escaping.
_ALPHABET = (
    "abcdefghijklmnopqrstuvwxyz"
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    "0123456789"
    + "".join(chr(c) for c in range(0x3B1, 0x3C9 + 1) if c != 0x3C2)  # α..ω (no final sigma)
    + "".join(chr(c) for c in range(0x430, 0x44F + 1))  # а..я
)

MAX_VOCAB = len(_ALPHABET)


def token_text(token_id: int) -> str:
    """The one-character text of ``token_id``."""
    if not 0 <= token_id < MAX_VOCAB:
        raise InvalidInput("token_id", token_id, f"an integer in [0, {MAX_VOCAB})")
    return _ALPHABET[token_id]


def text_token(ch: str) -> int:
    """Inverse of :func:`token_text`."""
    idx = _ALPHABET.find(ch)
    if len(ch) != 1 or idx < 0:
        raise InvalidInput("character", ch, "one character of the table-model alphabet")
    return idx


def tokens_text(tokens: "list[int] | tuple[int, ...]") -> str:
    return "".join(token_text(t) for t in tokens)
