"""Long-text splitting: boundaries, packing, limits, and the round-trip property on many inputs."""

from __future__ import annotations

import random
import re

import pytest

from omnitts.text import empty_text
from omnitts.text.split import DEFAULT_MAX_CHARS, DEFAULT_MAX_CHARS_CJK, default_max_chars, split_spans, split_text

DENSE = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")
PUNCT = set("。！？；．，、：,.!?;:…\"'”’»)]}」』）】》")


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def check(text: str, max_chars: int | None = None, language: str | None = None) -> list[str]:
    """Split and assert every invariant the module promises; returns the pieces."""
    pieces = split_text(text, max_chars, language)
    spans = split_spans(text, max_chars, language)
    limit = default_max_chars(text, language) if max_chars is None else max_chars
    assert pieces == [text[a:b] for a, b in spans]
    assert _squash("".join(pieces)) == _squash(text)  # nothing lost, nothing added, order kept
    assert _squash(" ".join(pieces)) == _squash(text)
    for piece in pieces:
        assert piece and piece == piece.strip()
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert end <= start
        left, right = text[end - 1], text[start]
        cut_at_space = end < start  # whitespace between the pieces in the original
        # never inside a word, unless that word alone is longer than a piece: a cut is at whitespace
        # or next to CJK characters / punctuation
        word = re.search(r"\S*$", text[:end]).group() + re.match(r"\S*", text[start:]).group()
        assert (cut_at_space or DENSE.match(left) or DENSE.match(right) or left in PUNCT
                or len(word) > limit), (text, end)
    assert all(len(piece) <= limit for piece in pieces)  # always: no piece is longer than the limit
    return pieces


def test_short_text_is_one_piece_and_blank_is_none():
    assert check("  Hello there.  ") == ["Hello there."]
    assert check("") == [] and check(" \n\t ") == []
    assert check("x" * DEFAULT_MAX_CHARS) == ["x" * DEFAULT_MAX_CHARS]


def test_sentences_are_packed_greedily_up_to_the_limit():
    text = "One two three. Four five six! Seven eight nine? Ten eleven; twelve."
    assert check(text, 30) == ["One two three. Four five six!", "Seven eight nine? Ten eleven;", "twelve."]
    assert check(text, 15) == ["One two three.", "Four five six!", "Seven eight", "nine?", "Ten eleven;",
                               "twelve."]


def test_abbreviations_decimals_and_closing_quotes():
    text = ('Mr. Smith paid $3.14 at 10:30, e.g. for tea. "Is that so?" she asked (quietly.) '
            'The U.S. team won. See Fig. 3 now. Dr. Who left... then came back.')
    pieces = check(text, 40)
    assert pieces == ["Mr. Smith paid $3.14 at 10:30,", "e.g. for tea.", '"Is that so?" she asked (quietly.)',
                      "The U.S. team won. See Fig. 3 now.", "Dr. Who left... then came back."]


def test_all_lower_case_text_still_splits_at_sentences():
    text = "hello there. how are you? fine thanks. bye now."
    assert check(text, 20) == ["hello there.", "how are you?", "fine thanks.", "bye now."]
    # in cased text a lower-case word after a stop means the sentence goes on ("e.g. this")
    assert check(text.replace("hello", "Hello"), 20) == ["Hello there. how are", "you? fine thanks.", "bye now."]


def test_paragraphs_and_lines():
    text = "First paragraph without a stop\n\nSecond paragraph line one\nline two"
    assert check(text, 40) == ["First paragraph without a stop", "Second paragraph line one\nline two"]
    assert check(text, 30) == ["First paragraph without a stop", "Second paragraph line one", "line two"]


def test_cjk_sentences_clauses_and_hard_cuts():
    text = "你好，世界。今天天气很好！我们去公园吧？好的；走吧。"
    assert check(text, 14) == ["你好，世界。今天天气很好！", "我们去公园吧？好的；走吧。"]
    assert check("他说：「今天很好。」然后走了。", 10) == ["他说：「今天很好。」", "然后走了。"]
    assert check("一二三四五，六七八九十，甲乙丙丁", 7) == ["一二三四五，", "六七八九十，", "甲乙丙丁"]
    long = "这是一个非常长的句子没有任何标点符号"
    pieces = check(long, 5)
    assert "".join(pieces) == long and all(len(p) <= 5 for p in pieces)
    assert check("全角句号．下一句！", 5) == ["全角句号．", "下一句！"]


def test_mixed_script_and_latin_word_inside_cjk_is_not_cut():
    text = "我们用Transformer模型合成语音结果很好"
    pieces = check(text, 12)
    assert any("Transformer" in p for p in pieces) and len(pieces) > 1
    assert not any("Transformer" in p for p in check(text, 8))  # 11 letters: longer than any piece of 8


def test_a_word_is_cut_only_when_it_alone_is_longer_than_the_limit():
    url = "https://example.com/" + "a" * 60
    assert check(f"Go to {url} now, please.", 20) == ["Go to", *(url[i:i + 20] for i in range(0, 80, 20)),
                                                     "now, please."]
    assert check(f"Go to {url[:20]} now.", 20) == ["Go to", url[:20], "now."]  # fits: whole
    blob = "QUJD" * 25_000  # 100,000 characters without a space (base64)
    pieces = check(blob, None, "english")
    assert len(pieces) == 400 and {len(p) for p in pieces} == {DEFAULT_MAX_CHARS}


def test_an_over_long_word_is_cut_between_graphemes():
    family = "\U0001F469\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466"  # one grapheme, 7 code points
    flag = "\U0001F1EB\U0001F1F7"  # one flag, two regional indicators
    accented = "e\u0301"  # e + combining acute
    for grapheme in (family, flag, accented, "\u0915\u094d\u0937"):  # Devanagari: virama is Mc/Mn
        word = grapheme * 30
        pieces = check(word, 10)
        assert "".join(pieces) == word
        assert all(p.startswith(grapheme) and len(p) % len(grapheme) == 0 for p in pieces), (grapheme, pieces)
    flags = "\U0001F1FA" + flag * 9  # an odd indicator first: pairs are counted from the run's start
    assert [len(p) for p in check(flags, 5)] == [4, 4, 4, 4, 3]  # never splits a pair of indicators
    zalgo = "a" + "\u0301" * 50  # one grapheme longer than any piece: cut between code points
    assert [len(p) for p in check(zalgo, 20)] == [20, 20, 11]


def test_long_sentence_falls_back_to_clauses_then_spaces():
    clause = "alpha beta gamma delta"
    text = f"{clause}, {clause}: {clause} {clause} {clause}."
    pieces = check(text, 30)
    assert pieces[:2] == [f"{clause},", f"{clause}:"]
    assert all(len(p) <= 30 for p in pieces)


def test_invisible_characters_alone_make_no_piece():
    """A right-to-left mark (or U+200B, a BOM) after a sentence that fills a piece was a piece of its own; the
    pipeline refuses such a piece as empty, so a 429-character text, which validate had passed, failed whole
    ("text: empty (only invisible characters such as U+200F)")."""
    last = "Word " + "word " * 48 + "end."  # 249 characters
    for mark in ("\u200f", "\u200b", "\ufeff", "\u200b\u200e"):
        pieces = split_text(f"Short one. {last} {mark}", 250)
        assert pieces == ["Short one.", last], (mark, pieces)
        assert split_text(f"{last}\n\n{mark}\n\n{last}", 250) == [last, last]  # a paragraph of its own
    assert split_text(f"{last} a\u200f", 250) == [last, "a\u200f"]  # beside a word: kept


def test_default_ignorable_characters_outside_the_invisible_categories_are_no_words():
    """A variation selector (U+FE0F), the combining grapheme joiner (U+034F), a Hangul filler (U+3164) print as
    nothing as U+200B does (Unicode's Default_Ignorable_Code_Point), but are marks or letters, so a text of only
    them was good and synthesized, and such a run after a full piece was a piece of its own."""
    for text in ("\ufe0f", "\u034f \ufe0f", "\u3164", "\u115f\u1160", "\u180b", "\U000e0100", "\u200b\ufe0f"):
        assert empty_text(text) is not None, repr(text)
    assert empty_text("\u3164").endswith("U+3164)")
    assert empty_text("\u2764\ufe0f") is None and empty_text("\u1100\u1161") is None  # an emoji, a Hangul syllable
    last = "Word " + "word " * 48 + "end."  # 249 characters
    assert split_text(f"Short one. {last} \ufe0f", 250) == ["Short one.", last]


def test_default_limits_follow_language_or_script():
    assert default_max_chars("Hello.", "english") == DEFAULT_MAX_CHARS
    assert default_max_chars("Hello.", "Chinese") == DEFAULT_MAX_CHARS_CJK
    assert default_max_chars("你好世界", None) == DEFAULT_MAX_CHARS_CJK
    assert default_max_chars("你好世界", "auto") == DEFAULT_MAX_CHARS_CJK
    assert default_max_chars("Hello 世界 there", "auto") == DEFAULT_MAX_CHARS
    zh = "今天天气很好，我们去公园散步吧。" * 20
    assert all(len(p) <= DEFAULT_MAX_CHARS_CJK for p in check(zh))
    en = "The quick brown fox jumps over the lazy dog. " * 30
    pieces = check(en)
    assert all(len(p) <= DEFAULT_MAX_CHARS for p in pieces) and len(pieces) == 6  # 45 chars a sentence, 5 fit
    with pytest.raises(ValueError):
        split_text("abc", 0)


WORDS = ["the", "Mr.", "e.g.", "3.14", "U.S.", "hello", "world", "speech", "1,000", "10:30", "(note)", '"quote"',
         "你好", "世界", "今天", "天气", "Transformer", "x" * 25, "naïve", "Straße"]
MARKS = [".", "!", "?", ";", ",", ":", "...", "…", "。", "！", "？", "；", "，", "、", "：", '."', "?)", "。」", ""]
SPACES = [" ", " ", " ", "  ", "\n", "\n\n", "\t", ""]


@pytest.mark.parametrize("seed", range(300))
def test_round_trip_property_on_random_text(seed):
    rng = random.Random(seed)
    parts = []
    for _ in range(rng.randint(0, 120)):
        parts.append(rng.choice(WORDS) + (rng.choice(MARKS) if rng.random() < 0.3 else ""))
        parts.append(rng.choice(SPACES))
    text = rng.choice(["", " ", "\n"]) + "".join(parts)
    check(text, rng.choice([1, 3, 10, 25, 60, 200, None]))
