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


def test_validate_counts_the_tokens_synth_will_with_the_official_tokenizer(ckpt_dir, tmp_path):
    """Where the two tokenizers split a text into different numbers of tokens, a line can fit the talker's
    positions with one and not the other: validate takes --official-tokenizer as synth does, so it gives synth's
    verdict (it had no such flag, and counted every line with the default)."""
    import shutil

    from omnitts.request import Request

    folder = ckpt_dir("voice_design", "tiny-1.7b")
    text = " ".join(TEXTS * 4)
    line = {"id": "x", "text": text, "language": "english", "instruct": INSTRUCT}
    lengths = {flag: omnitts.load(folder, dtype="float32", official_tokenizer=flag).prepare(
        Request(text, language="english", instruct=INSTRUCT)).embeds.shape[0] for flag in (False, True)}
    assert lengths[False] != lengths[True]
    # A talker with positions for the shorter prompt and 10 frames, not for the longer one's
    model = tmp_path / "ckpt"
    shutil.copytree(folder, model)
    config = json.loads((model / "config.json").read_text())
    config["talker_config"]["max_position_embeddings"] = min(lengths.values()) + 11
    (model / "config.json").write_text(json.dumps(config))
    (tmp_path / "m.jsonl").write_text(json.dumps(line) + "\n")
    flags = ["-m", str(model), "--split-chars", "0", "--max-frames", "10"]
    fits = min(lengths, key=lengths.get)
    verdicts = {}
    for flag in (False, True):
        extra = ["--official-tokenizer"] if flag else []
        result = CliRunner().invoke(app, ["validate", str(tmp_path / "m.jsonl"), *flags, *extra])
        verdicts[flag] = result.exit_code
        out = tmp_path / f"out-{flag}"
        ran = CliRunner().invoke(app, ["synth", str(tmp_path / "m.jsonl"), *flags, *extra, "-o", str(out), "--greedy",
                                       "-q"])
        record = json.loads((out / "results.jsonl").read_text())
        assert (ran.exit_code, record["status"]) == ((0, "ok") if flag == fits else (2, "error")), ran.output
        if flag != fits:
            assert f"need {max(lengths.values()) + 11} talker positions" in result.output, result.output
    assert verdicts == {fits: 0, not fits: 1}
