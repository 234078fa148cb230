"""Text in: the tokenizer, splitting long texts, and a request's prompt embeddings."""

import unicodedata

_UNSEEN = {"Cc", "Cf", "Zs", "Zl", "Zp"}  # controls, format characters (U+200B, U+FEFF, ...), separators


def empty_text(text: str) -> str | None:
    """Why `text` has no words to speak (None: it has some): nothing but white space, or nothing but
    characters that print as nothing (zero-width spaces and joiners, a byte order mark, controls)."""
    if not text.strip():
        return "empty"
    if all(unicodedata.category(ch) in _UNSEEN for ch in text):
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
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None
