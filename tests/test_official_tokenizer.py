"""`--official-tokenizer` / `official_tokenizer=True` outside the parity test: a synthesis run tokenizes
every text as the official package does (transformers' Qwen2 tokenizer loaded with
`fix_mistral_regex=True`, which swaps in Mistral's pre-tokenizer regex) and still produces audio."""

from __future__ import annotations

import json

import pytest
import soundfile as sf
from typer.testing import CliRunner

import omnitts
from omnitts.cli import app
from omnitts.text.tokenizer import TextTokenizer

TEXTS = ["iPhone and JavaScript users, McDonald and OpenAI.", "HTTPServer restarted twice."]
INSTRUCT = "A CamelCase voice: WarmAndSlow."


@pytest.fixture(scope="module")
def official(ckpt_dir):
    """The official package's tokenizer for the tiny checkpoint, and the texts it splits unlike the default."""
    from transformers import AutoTokenizer

    folder = ckpt_dir("voice_design", "tiny-1.7b")
    theirs = AutoTokenizer.from_pretrained(str(folder), fix_mistral_regex=True)
    plain = AutoTokenizer.from_pretrained(str(folder), fix_mistral_regex=False)

    def ids(tok, text):
        return tok(text, add_special_tokens=False)["input_ids"]

    if ids(theirs, "iPhone") == ids(plain, "iPhone"):
        pytest.skip("this transformers does not apply fix_mistral_regex to these files (4.57.3-4.57.x does)")
    return folder, lambda text: ids(theirs, text)


@pytest.fixture
def encoded(monkeypatch):
    """Every (text, ids, official_regex) the text tokenizer returns while the test runs."""
    calls, real = [], TextTokenizer.encode

    def encode(self, text):
        ids = real(self, text)
        calls.append((text, ids, self.official_regex))
        return ids

    monkeypatch.setattr(TextTokenizer, "encode", encode)
    return calls


def test_cli_run_uses_the_official_ids(official, encoded, tmp_path):
    folder, official_ids = official
    rows = [{"id": f"t{i}", "text": text, "language": "english", "instruct": INSTRUCT} for i, text in enumerate(TEXTS)]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["synth", str(tmp_path / "m.jsonl"), "-m", str(folder), "-o", str(out),
                                      "--official-tokenizer", "--greedy", "--max-frames", "3", "-q"])
    assert result.exit_code == 0, result.output
    texts = {text for text, _, _ in encoded}
    assert all(any(t in text for text in texts) for t in TEXTS + [INSTRUCT])  # every text went through it
    assert all(flag for _, _, flag in encoded)
    for text, ids, _ in encoded:
        assert ids == official_ids(text), text
    native = TextTokenizer(folder)
    assert any(native.encode(text) != ids for text, ids, _ in encoded)  # these ids differ from the default
    for i in range(len(TEXTS)):
        assert sf.info(out / f"t{i}.wav").frames == 3 * 1920


def test_api_uses_the_official_ids(official, encoded):
    folder, official_ids = official
    tts = omnitts.load(folder, dtype="float32", official_tokenizer=True)
    audio = tts.synthesize(TEXTS[0], language="english", instruct=INSTRUCT, greedy=True, max_frames=3)
    assert audio.frames == 3 and len(audio.samples) == 3 * 1920
    assert encoded and all(flag and ids == official_ids(text) for text, ids, flag in encoded)
    assert any(TEXTS[0] in text for text, _, _ in encoded)
