"""Text in: the tokenizer, splitting long texts, and a request's prompt embeddings."""


def lone_surrogate(text: str) -> int | None:
    """Where `text`'s first lone surrogate is (None: it has none): a character no encoding can write and no
    tokenizer reads. A JSON escape of half a pair ("\\ud83d") makes one; so does reading bytes that are not
    UTF-8 with `surrogateescape`, which turns byte b into U+DC00 + b."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None
