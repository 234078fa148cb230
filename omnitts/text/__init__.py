"""Text in: the tokenizer, splitting long texts, and a request's prompt embeddings."""

import unicodedata

_UNSEEN = {"Cc", "Cf", "Zs", "Zl", "Zp"}  # controls, format characters (U+200B, U+FEFF, ...), separators
# Unicode's Default_Ignorable_Code_Points outside those categories (marks, letters that print as nothing):
# the combining grapheme joiner, Hangul fillers, Khmer and Mongolian invisible marks, variation selectors.
_IGNORABLE = ((0x034F, 0x034F), (0x115F, 0x1160), (0x17B4, 0x17B5), (0x180B, 0x180F), (0x3164, 0x3164),
              (0xFE00, 0xFE0F), (0xFFA0, 0xFFA0), (0xE0100, 0xE01EF))


_FIRST_IGNORABLE = min(a for a, _ in _IGNORABLE)


def _unseen(ch: str) -> bool:
    if unicodedata.category(ch) in _UNSEEN:
        return True
    code = ord(ch)
    return code >= _FIRST_IGNORABLE and any(a <= code <= b for a, b in _IGNORABLE)


def empty_text(text: str) -> str | None:
    """Why `text` has no words to speak (None: it has some): nothing but white space, or nothing but
    characters that print as nothing (zero-width spaces and joiners, a byte order mark, controls, variation
    selectors, Hangul fillers)."""
    if not text.strip():
        return "empty"
    if all(_unseen(ch) for ch in text):
        first = next(ch for ch in text if not ch.isspace())
        return f"empty (only invisible characters such as U+{ord(first):04X})"
    return None


def no_transcript(ref_text: str | None) -> bool:
    """Whether a reference clip's `ref_text` says nothing: absent, or a text with no words (U+200B alone
    is no transcript), so in-context cloning has none."""
    return ref_text is None or empty_text(ref_text) is not None


def lone_surrogate(text: str) -> int | None:
    """Where `text`'s first lone surrogate is (None: it has none): a character no encoding can write and no
    tokenizer reads. A JSON escape of half a pair ("\\ud83d") makes one; so does reading bytes that are not
    UTF-8 with `surrogateescape`, which turns byte b into U+DC00 + b."""
    if text.isascii():  # (no surrogate is ASCII) O(1): CPython knows a str is ASCII
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None
