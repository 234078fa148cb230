"""Splitting long text into pieces the model can speak one at a time.

The talker is trained on utterances up to roughly 30 s; past that its prosody drifts and it may
never say EOS. `split_text` cuts a long text into pieces of at most `max_chars` characters:

1. Sentences: after Latin `. ! ? ;` and ellipses (`...`, `…`) followed by whitespace, the end or a
   CJK character; after CJK `。！？；` and the full-width `．！？；` (no space needed); at blank lines.
   Closing quotes and brackets stay with the sentence they close. A period is *not* a sentence end
   after a known abbreviation ("Mr.", "e.g.", "U.S.", a single capital initial, "No." before a
   digit) or when the next word starts in lower case; decimals ("3.14") never match because no
   whitespace follows the point. Likewise `! ?` before a lower-case word ('"Why?" she asked').
   (The lower-case rule is off for text without any capital letter.)
2. Sentences are packed greedily, in order, into pieces of at most `max_chars` (fewer, longer
   pieces give better prosody than one piece per sentence).
3. A sentence longer than `max_chars` is split the same way at clause marks (`, ， 、 : ：` and
   single line breaks), then at whitespace, then, for CJK text (no spaces), between two characters;
   its last part is packed on with the sentences that follow.
4. A word is cut only when it alone is longer than `max_chars` (a base64 blob, a long URL): between
   two graphemes (never inside a combining sequence, an emoji ZWJ sequence or a flag), and a
   single grapheme longer than the limit (hundreds of stacked combining marks) between code points.
   So no piece is ever longer than `max_chars`: what one manifest line costs is bounded by its
   number of pieces, not by its longest word.

Pieces are stripped, never empty, and keep their punctuation. A run of invisible characters that would
stand alone as a piece (a right-to-left mark or U+200B after a sentence that fills a piece) is dropped:
it has nothing to speak, and the pipeline refuses an empty piece. Pieces are contiguous slices of the
input (`split_spans` gives the offsets), so removing whitespace (and such runs) from the joined pieces
gives the input without them; joining with a single space (Latin) or nothing (CJK) restores the text
up to whitespace. Text that fits is returned as one piece; blank text as no piece.

What one item may cost is bounded by its number of pieces: at most `MAX_PIECES` (256) per item
(`pieces_problem` says why a text makes more). The pipeline holds every piece's prompt until the
item ends and runs its pieces side by side, so the cap bounds that memory; 256 pieces are about
64,000 characters of alphabetic text (90 minutes of speech) or 25,600 of CJK text - a longer text
belongs on several lines.

Default limits (`default_max_chars`): 250 characters for alphabetic text, about 21 s at the
~12 characters/s of English speech, leaving room below the 30 s training ceiling for slow voices
and instructions; 100 characters for Chinese/Japanese/Korean, about 20-25 s at 4-5 characters/s.
"""

from __future__ import annotations

import re
import unicodedata

from . import empty_text

DEFAULT_MAX_CHARS = 250  # alphabetic scripts: ~21 s at ~12 characters/s
DEFAULT_MAX_CHARS_CJK = 100  # Chinese/Japanese/Korean: ~20-25 s at 4-5 characters/s
CJK_LANGUAGES = {"chinese", "japanese", "korean"}
MAX_PIECES = 256  # pieces per item at most (see the module docstring)

# Scripts written without spaces between words (Han, kana) plus Hangul syllables.
_DENSE = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_CLOSERS = "\"'\u201d\u2019\u00bb)\\]}\u300d\u300f\uff09\u3011\u300b\u3009\uff02\uff3d\uff5d\u3015\u3017\u3019"
_LATIN_END = re.compile(rf"(?:\.\.\.+|…+|[.!?;]+)[{_CLOSERS}]*(?=\s|$|[{_DENSE}])")
_CJK_END = re.compile(rf"(?:[。！？；．]+|…+)[{_CLOSERS}]*")
_PARAGRAPH = re.compile(r"\n[ \t\r\f\v]*\n\s*")
_LATIN_CLAUSE = re.compile(rf"[,:][{_CLOSERS}]*(?=\s|$|[{_DENSE}])")
_CJK_CLAUSE = re.compile(rf"[，、：][{_CLOSERS}]*")
_LINE = re.compile(r"\n")
_SPACE = re.compile(r"\s+")
_DENSE_CHAR = re.compile(f"[{_DENSE}]")

_TITLES = {"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "gen", "col", "capt", "lt", "sgt", "rev",
           "hon", "gov", "pres", "e.g", "i.e", "vs", "cf", "approx"}
_BEFORE_NUMBER = {"no", "nr", "fig", "figs", "vol", "p", "pp", "ch", "sec", "art", "eq", "ex",
                  "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec"}
_INITIALS = re.compile(r"^(?:[A-Za-z]\.)+[A-Za-z]$")  # "U.S" of "U.S.", "e.g" of "e.g."
_BRACKETS = "\u201c\u2018\u00ab([{\u300c\u300e\uff08\u3010\u300a\u3008\uff3b\uff5b\u3014\u3016\u3018"
_OPENERS = "\"'" + _BRACKETS  # ASCII quotes may open or close
_NO_CUT_BEFORE = set("。！？；．，、：,.!?;:…") | set(_CLOSERS)


def default_max_chars(text: str, language: str | None = None) -> int:
    """The piece limit for `text`: by `language` when it names one, else by the script it is written in."""
    lang = (language or "auto").lower()
    if lang in CJK_LANGUAGES:
        return DEFAULT_MAX_CHARS_CJK
    if lang != "auto":
        return DEFAULT_MAX_CHARS
    dense = len(_DENSE_CHAR.findall(text))
    letters = sum(ch.isalpha() for ch in text)
    return DEFAULT_MAX_CHARS_CJK if letters and dense * 2 >= letters else DEFAULT_MAX_CHARS


def pieces_problem(text: str, pieces: int) -> str | None:
    """Why `text`, split into `pieces`, is too much for one item (None: it is not)."""
    if pieces <= MAX_PIECES:
        return None
    return (f"text: {len(text):,} characters make {pieces:,} pieces; at most {MAX_PIECES} per item - "
            "split the line")


def split_text(text: str, max_chars: int | None = None, language: str | None = None) -> list[str]:
    """Split `text` into pieces of at most `max_chars` characters at the most natural boundaries.

    `max_chars` None picks `default_max_chars(text, language)`. See the module docstring for the rules.
    """
    return [text[start:end] for start, end in split_spans(text, max_chars, language)]


def split_spans(text: str, max_chars: int | None = None, language: str | None = None) -> list[tuple[int, int]]:
    """Like `split_text`, as (start, end) offsets into `text`; each slice is a stripped, non-empty piece."""
    limit = default_max_chars(text, language) if max_chars is None else int(max_chars)
    if limit < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    spans: list[tuple[int, int]] = []
    _split(text, 0, len(text), limit, 0, spans)
    return [(a, b) for a, b in spans if empty_text(text[a:b]) is None]  # (a lone U+200F: nothing to speak)


def _strip(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def _split(text: str, start: int, end: int, limit: int, level: int, out: list) -> None:
    """Append the pieces of text[start:end] to `out`, cutting at boundaries of `level` or finer."""
    start, end = _strip(text, start, end)
    if start == end:
        return
    if end - start <= limit or level == len(_LEVELS):
        out.append((start, end))
        return
    cuts = sorted(c for c in set(_LEVELS[level](text, start, end)) if start < c < end)
    bounds = [start, *cuts, end]
    piece = None  # (start, end) being packed
    for a, b in zip(bounds, bounds[1:]):
        a, b = _strip(text, a, b)
        if a == b:
            continue
        if piece is not None and b - piece[0] <= limit:
            piece = (piece[0], b)
            continue
        if piece is not None:
            _split(text, *piece, limit, level + 1, out)  # only splits if the piece alone is too long
        if b - a > limit:
            # Too long alone: split it finer, then keep packing from its last part (a long
            # sentence's tail joins the next sentence instead of standing alone).
            _split(text, a, b, limit, level + 1, out)
            a, b = out.pop()
        piece = (a, b)
    if piece is not None:
        _split(text, *piece, limit, level + 1, out)


def _sentence_cuts(text: str, start: int, end: int):
    cased = any(ch.isupper() for ch in text[start:end])  # all lower case: case says nothing
    for m in _LATIN_END.finditer(text, start, end):
        if not _is_abbreviation(text, m.start(), m.end(), cased):
            yield m.end()
    for m in _CJK_END.finditer(text, start, end):
        yield m.end()
    for m in _PARAGRAPH.finditer(text, start, end):
        yield m.start()


def _is_abbreviation(text: str, mark: int, after: int, cased: bool) -> bool:
    """Whether the Latin end mark at text[mark:after] (with its closers) does not end a sentence."""
    following = text[after:after + 16].lstrip()[:1]
    marks = text[mark:after].rstrip(_CLOSERS)
    if ";" in marks:
        return False  # a semicolon always ends one
    if cased and following.islower():
        return True  # "e.g. this", "Wait... what", '"Really?" she asked': the sentence goes on
    if marks != ".":
        return False
    first = mark  # the word before the period, without opening quotes or brackets
    while first > 0 and not text[first - 1].isspace() and text[first - 1] not in _OPENERS:
        first -= 1
    word = text[first:mark].lower()
    if word in _TITLES or _INITIALS.match(word) or (len(word) == 1 and word.isalpha()):
        return True
    return word in _BEFORE_NUMBER and following.isdigit()


def _clause_cuts(text: str, start: int, end: int):
    for pattern in (_LATIN_CLAUSE, _CJK_CLAUSE):
        yield from (m.end() for m in pattern.finditer(text, start, end))
    yield from (m.start() for m in _LINE.finditer(text, start, end))


def _space_cuts(text: str, start: int, end: int):
    return (m.start() for m in _SPACE.finditer(text, start, end))


def _char_cuts(text: str, start: int, end: int):
    """Between two characters of a CJK run (never before punctuation or after an opening bracket,
    never inside a Latin word). ASCII quotes may open or close, so they do not block a cut."""
    for i in range(start + 1, end):
        left, right = text[i - 1], text[i]
        if left.isspace() or right.isspace() or right in _NO_CUT_BEFORE or left in _BRACKETS:
            continue
        if _DENSE_CHAR.match(left) or _DENSE_CHAR.match(right):
            yield i


_ZWJ = "\u200d"
_REGIONAL = range(0x1F1E6, 0x1F200)  # regional indicators: two make one flag


def _extends(ch: str) -> bool:
    """Whether `ch` belongs to the grapheme before it: combining marks, variation selectors, emoji
    skin-tone modifiers and tag characters (the parts of Unicode's grapheme rules that matter here)."""
    code = ord(ch)
    return (unicodedata.category(ch) in ("Mn", "Mc", "Me") or 0x1F3FB <= code <= 0x1F3FF
            or 0xE0020 <= code <= 0xE007F or ch == _ZWJ)


def _grapheme_cuts(text: str, start: int, end: int):
    """Between two graphemes of a word too long for any piece: never before a combining character,
    after a zero-width joiner, between CR and LF, or inside a pair of regional indicators."""
    regional_run = 0
    for i in range(start + 1, end):
        left, right = text[i - 1], text[i]
        regional_run = regional_run + 1 if ord(left) in _REGIONAL else 0
        if _extends(right) or left == _ZWJ or (left, right) == ("\r", "\n"):
            continue
        if ord(right) in _REGIONAL and regional_run % 2 == 1:
            continue
        yield i


def _code_point_cuts(text: str, start: int, end: int):
    """Anywhere: a single "grapheme" longer than a piece (stacked combining marks) is not speech."""
    return range(start + 1, end)


_LEVELS = (_sentence_cuts, _clause_cuts, _space_cuts, _char_cuts, _grapheme_cuts, _code_point_cuts)
