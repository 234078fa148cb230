"""Manifest inputs: a battery of bad lines (library, `omnitts validate`, `omnitts synth`), CSV / Parquet /
Arrow / saved-dataset inputs with column mapping, and lazy reading."""

from __future__ import annotations

import json
import os
import threading
import tracemalloc

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import soundfile as sf
from typer.testing import CliRunner

from omnitts.batch.manifest import SAFE_ID, BadLine, Item, column_map, count_rows, iter_manifest
from omnitts.cli import app
from omnitts.config import load_config
from omnitts.errors import OmniTTSError

runner = CliRunner()

GOOD = [{"id": "first", "text": "The first good line.", "speaker": "ryan"},
        {"id": "middle", "text": "A good line with overrides.", "speaker": "vivian", "temperature": 0.7,
         "top_k": 10, "top_p": 0.9, "repetition_penalty": 1.1, "seed": 3},
        {"id": "last", "text": "The last good line.", "speaker": "ryan", "language": "english"}]

# (line of the manifest, the message that must follow "file:N: ") for a CustomVoice 0.6B checkpoint
BAD = [
    ("{not json", "malformed JSON"),
    ("[1, 2]", "expected a JSON object ({...}), got an array"),
    ('"just a text"', "expected a JSON object ({...}), got a string"),
    ("null", "expected a JSON object ({...}), got null"),
    ("7", "expected a JSON object ({...}), got a number"),
    ('{"id": "deep", "x": ' + "[" * 100000 + "]" * 100000 + "}", "JSON nested too deeply to read"),
    ('{"id": "twice", "text": "Hi.", "speaker": "ryan", "speaker": "vivian"}',  # json.loads kept the last
     "speaker: given twice in the line; which value counts is unclear, keep one"),
    ({"id": "notext", "speaker": "ryan"}, "text: missing"),
    ({"id": "blank", "text": "   ", "speaker": "ryan"}, "text: empty"),
    ({"id": "unseen", "text": "\u200b\ufeff \u200d", "speaker": "ryan"}, "text: empty (only invisible characters such as U+200B)"),
    ({"id": "extra", "text": "Hi.", "speaker": "ryan", "volume": 3}, "volume: unknown field"),
    ({"id": "typo", "text": "Hi.", "speakr": "ryan"}, "speakr: unknown field (did you mean 'speaker'?); valid fields"),
    ({"id": "seedtype", "text": "Hi.", "speaker": "ryan", "seed": "7"}, "seed: expected int, got str"),
    ({"id": "flag", "text": "Hi.", "speaker": "ryan", "non_streaming": "yes"}, "non_streaming: expected bool, got str"),
    ({"id": "spk", "text": "Hi.", "speaker": "bob"}, "speaker: 'bob' is not known"),
    ({"id": "nospk", "text": "Hi."}, "speaker: required by this CustomVoice checkpoint"),
    ({"id": "lang", "text": "Hi.", "speaker": "ryan", "language": "elvish"}, "language: 'elvish' is not known"),
    ({"id": "instr", "text": "Hi.", "speaker": "ryan", "instruct": "Loud."}, "instruct: 0.6B CustomVoice checkpoints take no instruction"),
    ({"id": "clone", "text": "Hi.", "speaker": "ryan", "ref_audio": "refs/r.wav", "ref_text": "Words."}, "ref_audio: voice cloning needs a Base checkpoint"),
    ({"id": "cltext", "text": "Hi.", "speaker": "ryan", "ref_text": "Words."}, "ref_text: voice cloning needs a Base checkpoint; this one is custom_voice"),
    ({"id": "clxvec", "text": "Hi.", "speaker": "ryan", "x_vector_only": True}, "x_vector_only: voice cloning needs a Base checkpoint; this one is custom_voice"),
    ({"id": "noref", "text": "Hi.", "ref_audio": "missing.wav"}, "ref_audio: file not found"),
    ({"id": "devref", "text": "Hi.", "ref_audio": "/dev/null"}, "ref_audio: not a regular file (a device or a pipe)"),
    ({"id": "garbage", "text": "Hi.", "ref_audio": "garbage.wav"}, "ref_audio: cannot read audio"),
    ({"id": "short", "text": "Hi.", "ref_audio": "short.wav"}, "ref_audio: "),  # "... is 0.20 s long"
    ({"id": "silent", "text": "Hi.", "ref_audio": "silent.wav"}, "ref_audio: "),  # "... reference audio is silent"
    ({"id": "emptyref", "text": "Hi.", "ref_audio": " "}, "ref_audio: empty; give the path of a reference clip"),
    ({"id": "emptyvoice", "text": "Hi.", "voice": ""}, "voice: empty; give the path of a saved .safetensors voice"),
    ({"id": "novoice", "text": "Hi.", "voice": "nope.safetensors"}, "voice: file not found"),
    # a path that cannot be looked up (a name too long): pathlib's OSError was a traceback, ending the whole run
    ({"id": "longref", "text": "Hi.", "ref_audio": "r" * 300 + ".wav"}, "ref_audio: cannot read "),
    ({"id": "longvoice", "text": "Hi.", "voice": "v" * 300 + ".safetensors"}, "voice: cannot read "),
    ({"id": "wavvoice", "text": "Hi.", "voice": "refs/r.wav"}, "voice: "),  # "... is not a .safetensors voice file"
    ({"id": "both", "text": "Hi.", "ref_audio": "refs/r.wav", "voice": "v.safetensors"}, "voice: give either ref_audio or voice"),
    ({"id": "cvvoice", "text": "Hi.", "voice": "v.safetensors"}, "voice: a saved voice needs a Base checkpoint"),
    ({"id": "first", "text": "Duplicate id.", "speaker": "ryan"}, "id: 'first' already used on line 1"),
    ({"id": "../evil", "text": "Hi.", "speaker": "ryan"}, "id: '../evil' is not a safe file name"),
    ({"id": "a" * 201, "text": "Hi.", "speaker": "ryan"}, "id: '" + "a" * 40 + "..." + "a" * 10 + "' is 201 characters long; an id names a file: at most 200"),
    ({"text": "No id.", "speaker": "ryan"}, "id: missing"),
    ({"id": "temp", "text": "Hi.", "speaker": "ryan", "temperature": 0}, "temperature: must be > 0"),
    ({"id": "topk", "text": "Hi.", "speaker": "ryan", "top_k": 1.5}, "top_k: expected int, got float"),
    ({"id": "negk", "text": "Hi.", "speaker": "ryan", "top_k": -1}, "top_k: must be >= 0"),
    ({"id": "topp", "text": "Hi.", "speaker": "ryan", "top_p": 1.5}, "top_p: must be in (0, 1]"),
    ({"id": "rep", "text": "Hi.", "speaker": "ryan", "repetition_penalty": -1}, "repetition_penalty: must be > 0"),
    ({"id": "secs", "text": "Hi.", "speaker": "ryan", "max_seconds": 0}, "max_seconds: must be > 0"),
    ({"id": "nan", "text": "Hi.", "speaker": "ryan", "temperature": float("nan")}, "temperature: must be > 0, got nan"),
    ({"id": "inf", "text": "Hi.", "speaker": "ryan", "temperature": float("inf")},
     "temperature: must be at most 3.403e+38, got inf"),
    ({"id": "huge", "text": "Hi.", "speaker": "ryan", "repetition_penalty": 1e300},
     "repetition_penalty: must be at most 3.403e+38, got 1e+300"),
    ({"id": "ages", "text": "Hi.", "speaker": "ryan", "max_seconds": 1e308}, "max_seconds: must be at most 3.403e+38"),
    ({"id": "bigk", "text": "Hi.", "speaker": "ryan", "top_k": 10**30}, "top_k: must be at most 9.223e+18"),
    # an integer past a float's range (JSON reads 400 digits as an int): math.isnan raised OverflowError, a traceback
    ({"id": "hugek", "text": "Hi.", "speaker": "ryan", "top_k": 10**400}, "top_k: must be at most 9.223e+18"),
    ({"id": "hugesecs", "text": "Hi.", "speaker": "ryan", "max_seconds": 10**400}, "max_seconds: must be at most 3.403e+38"),
]
SPECIFIC = {"short": "is 0.20 s long; at least 0.5 s is needed", "wavvoice": "is not a .safetensors voice file",
            "silent": "silent.wav: reference audio is silent"}  # validate checks what synthesis would


def _line(row) -> str:
    return row if isinstance(row, str) else json.dumps(row, ensure_ascii=False)


def _folder(tmp_path, ref_wav):
    """A manifest folder with a good reference clip, a garbage one, a too-short one, a silent one and a voice
    file."""
    from safetensors.numpy import save_file

    (tmp_path / "refs").mkdir(exist_ok=True)
    (tmp_path / "refs" / "r.wav").write_bytes(ref_wav.read_bytes())
    (tmp_path / "garbage.wav").write_bytes(b"this is not audio at all" * 10)
    sf.write(tmp_path / "short.wav", np.full(4800, 0.1, dtype=np.float32), 24000)  # 0.2 s
    sf.write(tmp_path / "silent.wav", np.zeros(24000, dtype=np.float32), 24000)  # 1 s of zeros
    save_file({"x_vector": np.zeros(8, dtype=np.float32)}, str(tmp_path / "v.safetensors"))
    return tmp_path


def _battery(tmp_path):
    """All of BAD in one manifest with good lines around them: (path, {line: (row, needle)}, good ids)."""
    lines, bad = [_line(GOOD[0])], {}
    for i, (row, needle) in enumerate(BAD):
        lines.append(_line(row))
        bad[len(lines)] = (row, needle)
        if i == len(BAD) // 2:
            lines.append(_line(GOOD[1]))
    lines.append(_line(GOOD[2]))
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path, bad


def _expected_id(row, line, earlier_ids):
    item_id = row.get("id") if isinstance(row, dict) else None
    safe = isinstance(item_id, str) and SAFE_ID.match(item_id)
    return item_id if safe and item_id not in earlier_ids else f"line:{line}"


@pytest.mark.parametrize("row,needle", BAD, ids=[_line(r)[:40] for r, _ in BAD])
def test_each_bad_line_is_one_clear_error_and_its_neighbours_pass(ckpt_dir, tmp_path, ref_wav, row, needle):
    _folder(tmp_path, ref_wav)
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(_line(r) for r in (GOOD[0], row, GOOD[2])) + "\n", encoding="utf-8")
    entries = list(iter_manifest(path, load_config(ckpt_dir("custom_voice"))))
    assert [type(e) for e in entries] == [Item, BadLine, Item], entries
    bad = entries[1]
    assert bad.line == 2 and "\n" not in bad.message
    assert bad.message.startswith(f"{path}:2: {needle}"), bad.message
    key = row.get("id") if isinstance(row, dict) else None
    if key in SPECIFIC:
        assert SPECIFIC[key] in bad.message
    assert [e.request.id for e in (entries[0], entries[2])] == ["first", "last"]


def test_battery_through_validate(ckpt_dir, tmp_path, ref_wav):
    _folder(tmp_path, ref_wav)
    path, bad = _battery(tmp_path)
    result = runner.invoke(app, ["validate", str(path), "--model", str(ckpt_dir("custom_voice"))])
    assert result.exit_code == 1
    out = result.output.splitlines()
    assert out[-1] == f"{path}: {len(GOOD)} good, {len(bad)} bad"
    assert len(out) == len(bad) + 1  # one line per bad line, then the summary
    for line, (row, needle) in bad.items():
        assert sum(o.startswith(f"{path}:{line}: {needle}") for o in out) == 1, (line, needle, out)


def test_validate_exit_0_when_all_good(ckpt_dir, tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text("".join(_line(r) + "\n" for r in GOOD), encoding="utf-8")
    result = runner.invoke(app, ["validate", str(path), "-m", str(ckpt_dir("custom_voice"))])
    assert result.exit_code == 0 and result.output.strip() == f"{path}: 3 good, 0 bad"


def test_battery_through_synth(ckpt_dir, tmp_path, ref_wav):
    _folder(tmp_path, ref_wav)
    path, bad = _battery(tmp_path)
    out = tmp_path / "out"
    result = runner.invoke(app, ["synth", str(path), "-m", str(ckpt_dir("custom_voice")), "-o", str(out),
                                 "--greedy", "--max-frames", "3", "--quiet"])
    assert result.exit_code == 1
    for line, (row, needle) in bad.items():
        assert f"{path}:{line}: {needle}" in result.output
    for good in GOOD:
        assert sf.info(out / f"{good['id']}.wav").frames == 3 * 1920
    records = {r["id"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    seen, expected = {"first"}, {}
    for line, (row, _) in bad.items():
        expected[_expected_id(row, line, seen | set(expected))] = line
    assert set(records) == {g["id"] for g in GOOD} | set(expected)
    for item_id, line in expected.items():
        assert records[item_id]["status"] == "error" and records[item_id]["error"].startswith(f"{path}:{line}: ")
    assert {records[g["id"]]["status"] for g in GOOD} == {"ok"}



def test_ids_alike_but_for_case_are_duplicates_only_where_the_output_folder_folds_case(tmp_path):
    """`fold_case` (the output folder, where its filesystem folds case): an id equal to an earlier one ignoring
    case is a bad line naming that line and its spelling, after a bad line too; without it both ids run."""
    rows = [{"id": "alice", "text": "Hi."}, {"id": "Bob", "text": "  "}, {"id": "ALICE", "text": "Hi."},
            {"id": "bob", "text": "Hi."}, {"id": "alice", "text": "Hi."}, {"id": "Carol", "text": "Hi."}]
    path = tmp_path / "m.jsonl"
    path.write_text("".join(_line(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "out"
    entries = list(iter_manifest(path, fold_case=out))
    assert [(type(e).__name__, e.id if isinstance(e, BadLine) else e.request.id) for e in entries] == [
        ("Item", "alice"), ("BadLine", "Bob"), ("BadLine", "line:3"), ("BadLine", "line:4"),
        ("BadLine", "line:5"), ("Item", "Carol")]
    case = "on this case-insensitive filesystem"
    assert [e.message for e in entries[2:5]] == [
        f"{path}:3: id: 'ALICE' names the same file as line 1's 'alice' {case} ({out})",
        (f"{path}:4: id: 'bob' names the same file as line 2's 'Bob' {case} ({out}) (a bad line: fix that one, or "
         "give this line another id)"),
        f"{path}:5: id: 'alice' already used on line 1"]
    kept = list(iter_manifest(path))
    assert [e.request.id for e in kept if isinstance(e, Item)] == ["alice", "ALICE", "bob", "Carol"]


def test_validate_warns_of_ids_alike_but_for_case(ckpt_dir, tmp_path):
    """validate knows no OUT: ids alike but for case, which synth refuses on a case-folding OUT (macOS, Windows),
    were two good lines without a word. Now a warning on stderr names both lines; they stay good (exit 0)."""
    path = tmp_path / "m.jsonl"
    path.write_text("".join(_line({"id": i, "text": "Hi.", "speaker": "ryan"}) + "\n" for i in ("alice", "bob", "ALICE")),
                    encoding="utf-8")
    result = CliRunner().invoke(app, ["validate", str(path), "-m", str(ckpt_dir("custom_voice"))])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{path}: 3 good, 0 bad\n"
    assert result.stderr == (f"warning: {path}:3: id: 'ALICE' differs only in case from line 1's 'alice': one file "
                             "where OUT's filesystem folds case (macOS, Windows, vfat/exFAT, SMB), where synth refuses "
                             "this line; give it another id\n")


def test_validate_warns_of_ids_that_windows_reserves_as_device_names(ckpt_dir, tmp_path):
    """CON, NUL, COM1... (whatever follows the first dot) are devices on Windows: OUT/CON.wav, a file here, cannot
    be made or copied there. validate said nothing; now a warning names the line (the line stays good)."""
    path = tmp_path / "m.jsonl"
    ids = ("a", "CON", "nul.take2", "com1", "console", "COM10", "lpt9.x")
    path.write_text("".join(_line({"id": i, "text": "Hi.", "speaker": "ryan"}) + "\n" for i in ids), encoding="utf-8")
    result = CliRunner().invoke(app, ["validate", str(path), "-m", str(ckpt_dir("custom_voice"))])
    assert result.exit_code == 0 and result.stdout == f"{path}: 7 good, 0 bad\n", result.output
    warned = [line.split(": id: ")[1].split(" ")[0] for line in result.stderr.splitlines()]
    assert warned == ["'CON'", "'nul.take2'", "'com1'", "'lpt9.x'"], result.stderr
    assert result.stderr.splitlines()[0] == (f"warning: {path}:2: id: 'CON' is a device name on Windows: its CON.wav "
                                             "cannot be made or copied there; give it another id if OUT goes there")


def _voice_file(path, ckpt, identity=None, hidden=None):
    """A saved x-vector voice for checkpoint `ckpt` (its identity and hidden size unless given), no model needed."""
    import torch

    from omnitts.request import Voice
    from omnitts.voice import checkpoint_identity, save_voice

    hidden = hidden or load_config(ckpt).talker.hidden_size
    voice = Voice(x_vector=torch.ones(hidden), ref_codes=None, ref_text=None,
                  checkpoint=identity or checkpoint_identity(ckpt))
    return save_voice(voice, path)


def test_base_checkpoint_accepts_a_voice_file_and_wants_ref_text(ckpt_dir, tmp_path, ref_wav):
    _folder(tmp_path, ref_wav)
    _voice_file(tmp_path / "v.safetensors", ckpt_dir("base"))
    path = tmp_path / "m.jsonl"
    rows = [{"id": "v", "text": "Saved voice.", "voice": "v.safetensors", "top_k": 0},
            {"id": "icl", "text": "Clone.", "ref_audio": "refs/r.wav"},
            {"id": "spk", "text": "Clone.", "ref_audio": "refs/r.wav", "x_vector_only": True, "speaker": "ryan"},
            {"id": "vtext", "text": "Saved voice.", "voice": "v.safetensors", "ref_text": "Other words."},
            {"id": "vxvec", "text": "Saved voice.", "voice": "v.safetensors", "x_vector_only": True},
            {"id": "vempty", "text": "Saved voice.", "voice": "v.safetensors", "ref_text": ""}]
    path.write_text("".join(_line(r) + "\n" for r in rows), encoding="utf-8")
    voice, icl, spk, vtext, vxvec, vempty = iter_manifest(path, load_config(ckpt_dir("base")))
    # A saved voice's mode and transcript are fixed when it is saved: a field that would change them is said,
    # not ignored (an empty ref_text says nothing; an x_vector_only that agrees with the voice's mode says nothing
    # either, one that does not is a bad line: test_x_vector_only_beside_a_voice_...).
    assert vtext.message == (f"{path}:4: ref_text: a saved voice keeps the mode and transcript it was saved with; "
                             "remove ref_text (or clone from ref_audio)")
    assert isinstance(vxvec, Item) and not vxvec.request.x_vector_only  # v.safetensors was saved x-vector only
    assert isinstance(vempty, Item)
    assert isinstance(voice, Item) and voice.voice_path == tmp_path / "v.safetensors"
    assert voice.request.voice is None and voice.sampling == {"top_k": 0}
    assert icl.message == f"{path}:2: ref_text: required for in-context cloning; give the reference transcript or set x_vector_only"
    assert spk.message.startswith(f"{path}:3: speaker: this base checkpoint has no preset speakers")


def _icl_voice_file(path, ckpt, ref_text="A saved transcript."):
    """A saved in-context voice for checkpoint `ckpt` (a few reference frames of code 0), no model needed."""
    import torch

    from omnitts.request import Voice
    from omnitts.voice import checkpoint_identity, save_voice

    cfg = load_config(ckpt)
    voice = Voice(x_vector=torch.ones(cfg.talker.hidden_size), ref_codes=torch.zeros(5, cfg.talker.num_code_groups,
                                                                                       dtype=torch.long),
                  ref_text=ref_text, checkpoint=checkpoint_identity(ckpt))
    return save_voice(voice, path)


def test_an_empty_ref_text_is_no_transcript_as_an_absent_one_is_wherever_it_is_given(ckpt_dir, tmp_path, ref_wav):
    """`"ref_text": ""` beside a saved voice is taken as if absent, as an empty ref_text is everywhere: beside an
    inline clip (in context: "required", the absent one's error; x_vector_only: not used), on another kind, by
    `resolve` (the API's check) and in a table, whose empty cell is absent. A table gives a ref_text column a cell on
    every row, so refusing "" beside a voice would refuse a mixed table's voice rows while its CSV form passed."""
    from omnitts.request import Request
    from omnitts.text.prompt import resolve

    _folder(tmp_path, ref_wav)
    base, custom = ckpt_dir("base"), ckpt_dir("custom_voice")
    _voice_file(tmp_path / "xv.safetensors", base)
    _icl_voice_file(tmp_path / "icl.safetensors", base)
    rows = [({"text": "Saved icl voice.", "voice": "icl.safetensors"}, base),
            ({"text": "Saved x-vector voice.", "voice": "xv.safetensors"}, base),
            ({"text": "Inline in context.", "ref_audio": "refs/r.wav"}, base),
            ({"text": "Inline x-vector only.", "ref_audio": "refs/r.wav", "x_vector_only": True}, base),
            ({"text": "Another kind.", "speaker": "ryan"}, custom)]

    def verdicts(extra, suffix=".jsonl"):
        out = []
        for i, (row, ckpt) in enumerate(rows):
            path = tmp_path / f"m{i}{suffix}"
            line = {"id": "a", **row, **extra}
            if suffix == ".csv":
                path.write_text(",".join(line) + "\n" + ",".join(str(v).lower() if isinstance(v, bool) else v
                                                                for v in line.values()) + "\n", encoding="utf-8")
            else:
                path.write_text(_line(line) + "\n", encoding="utf-8")
            (got,) = iter_manifest(path, load_config(ckpt))
            out.append("good" if isinstance(got, Item) else got.message.removeprefix(f"{path}:").split(": ", 1)[1])
        return out

    absent = verdicts({})
    assert absent == ["good", "good", "ref_text: required for in-context cloning; give the reference transcript or "
                      "set x_vector_only", "good", "good"], absent
    assert verdicts({"ref_text": ""}) == absent
    assert verdicts({"ref_text": " \u200b"}) == absent  # a text of no words is empty (README)
    assert verdicts({"ref_text": ""}, ".csv") == absent  # an empty cell is absent
    resolve(load_config(base), Request("Hi.", voice=tmp_path / "icl.safetensors", ref_text=""))  # the API: taken
    said = verdicts({"ref_text": "Other words."})[:2]  # a transcript beside a saved voice would be ignored: said
    assert all(m.endswith("ref_text: a saved voice keeps the mode and transcript it was saved with; remove ref_text "
                          "(or clone from ref_audio)") for m in said), said


def test_x_vector_only_beside_a_voice_is_a_bad_line_unless_it_agrees_with_the_voices_mode(ckpt_dir, tmp_path, ref_wav):
    """`"x_vector_only": false` beside a voice saved x-vector only was taken without a word, and the line ran x-vector
    only: false asks for in-context cloning, which that voice (no reference codes) cannot do, so it is a bad line,
    as true beside an in-context voice is, in validate (with or without the checkpoint), tables and `TTS.stream`'s
    dicts alike. A value that agrees with the voice's mode says nothing more and runs, as an absent one does (true
    beside an x-vector voice was refused, so a table's boolean column had no value its x-vector voice rows could
    hold)."""
    from omnitts.batch.manifest import _voice_mode

    _folder(tmp_path, ref_wav)
    base = ckpt_dir("base")
    _voice_file(tmp_path / "xv.safetensors", base)
    _icl_voice_file(tmp_path / "icl.safetensors", base)
    rows = [{"id": "xv_false", "text": "Saved voice.", "voice": "xv.safetensors", "x_vector_only": False},
            {"id": "xv_absent", "text": "Saved voice.", "voice": "xv.safetensors"},
            {"id": "icl_false", "text": "Saved voice.", "voice": "icl.safetensors", "x_vector_only": False},
            {"id": "icl_absent", "text": "Saved voice.", "voice": "icl.safetensors"},
            {"id": "xv_true", "text": "Saved voice.", "voice": "xv.safetensors", "x_vector_only": True},
            {"id": "icl_true", "text": "Saved voice.", "voice": "icl.safetensors", "x_vector_only": True}]
    said = (f"x_vector_only: false asks for in-context cloning, which voice {tmp_path / 'xv.safetensors'} does not "
            "do: it was saved x-vector only (it holds no reference codes), and a saved voice keeps the mode it was "
            "saved with; remove x_vector_only (or clone from ref_audio)")
    said_true = (f"x_vector_only: true asks for x-vector-only cloning, which voice {tmp_path / 'icl.safetensors'} "
                 "does not do: it was saved in context (it holds reference codes), and a saved voice keeps the mode "
                 "it was saved with; remove x_vector_only (or clone from ref_audio)")
    jsonl, csv = tmp_path / "m.jsonl", tmp_path / "m.csv"
    jsonl.write_text("".join(_line(r) + "\n" for r in rows), encoding="utf-8")
    csv.write_text("id,text,voice,x_vector_only\n" + "".join(
        f"{r['id']},{r['text']},{r['voice']},{str(r['x_vector_only']).lower() if 'x_vector_only' in r else ''}\n"
        for r in rows), encoding="utf-8")
    _voice_mode.cache_clear()
    for path, first in ((jsonl, 1), (csv, 2)):
        for cfg in (load_config(base), None):  # the voice's mode is read from its file, checkpoint or not
            entries = list(iter_manifest(path, cfg))
            assert [type(e) for e in entries] == [BadLine, Item, Item, Item, Item, BadLine], entries
            assert entries[0].message == f"{path}:{first}: {said}"
            assert entries[5].message == f"{path}:{first + 5}: {said_true}"
            assert not any(e.request.x_vector_only for e in entries[1:5])  # the voice's own mode decides
    result = runner.invoke(app, ["validate", str(jsonl), "-m", str(base)])
    assert result.exit_code == 1 and result.stdout == (f"{jsonl}:1: {said}\n{jsonl}:6: {said_true}\n"
                                                       f"{jsonl}: 4 good, 2 bad\n"), result.output
    assert _voice_mode.cache_info().misses == 2  # each voice beside an x_vector_only is read once (per file version)


def test_validate_checks_saved_voices_against_the_checkpoint(ckpt_dir, tmp_path):
    """What synth would refuse at synthesis (a voice made with another checkpoint, shapes that do not
    fit, a file that is not a voice) is a bad line for validate, and for synth before the model loads."""
    ckpt = ckpt_dir("base")
    _voice_file(tmp_path / "mine.safetensors", ckpt)
    _voice_file(tmp_path / "other.safetensors", ckpt, identity="base-0b6-0123456789abcdef")
    _voice_file(tmp_path / "shape.safetensors", ckpt, hidden=8)
    (tmp_path / "junk.safetensors").write_bytes(b"not a voice")
    rows = [{"id": name, "text": "Hi.", "voice": f"{name}.safetensors"} for name in ("mine", "other", "shape", "junk")]
    rows.append({"id": "again", "text": "Hi.", "voice": "other.safetensors"})  # each file is checked once
    path = tmp_path / "m.jsonl"
    path.write_text("".join(_line(r) + "\n" for r in rows), encoding="utf-8")
    result = runner.invoke(app, ["validate", str(path), "-m", str(ckpt)])
    assert result.exit_code == 1
    out = result.output.splitlines()
    assert out[-1] == f"{path}: 1 good, 4 bad"
    assert out[0].startswith(f"{path}:2: voice: {tmp_path / 'other.safetensors'}: this voice was made with "
                             "checkpoint base-0b6-0123456789abcdef, not with ")
    assert f"re-create it with `omnitts voice-clone --model {ckpt} --save ...`" in out[0]
    assert out[1].startswith(f"{path}:3: voice: ") and "x_vector must be 64 finite values for this checkpoint" in out[1]
    assert out[2].startswith(f"{path}:4: voice: ") and "not a saved voice" in out[2]
    assert out[3].startswith(f"{path}:5: voice: ") and "made with checkpoint base-0b6-0123456789abcdef" in out[3]


def test_an_id_belongs_to_the_first_line_even_a_bad_one(ckpt_dir, tmp_path):
    """A duplicate of a bad line's id is itself a bad line: validate counts it, synth records it (the good
    duplicate would otherwise be skipped silently as the bad line's failed id)."""
    rows = [{"id": "x", "text": "Hi.", "speaker": "bob"},  # bad: unknown speaker
            {"id": "x", "text": "Good words.", "speaker": "ryan"},  # same id: a duplicate
            {"id": "y", "text": "Other words.", "speaker": "ryan"}]
    path = tmp_path / "m.jsonl"
    path.write_text("".join(_line(r) + "\n" for r in rows), encoding="utf-8")
    ckpt = ckpt_dir("custom_voice")
    first, second, third = iter_manifest(path, load_config(ckpt))
    assert isinstance(first, BadLine) and first.id == "x"
    assert isinstance(second, BadLine) and second.id == "line:2"
    assert second.message == (f"{path}:2: id: 'x' already used on line 1 (a bad line: fix that one, or give "
                              "this line another id)")
    assert isinstance(third, Item)
    result = runner.invoke(app, ["validate", str(path), "-m", str(ckpt)])
    assert result.exit_code == 1 and result.output.splitlines()[-1] == f"{path}: 1 good, 2 bad"
    out = tmp_path / "out"
    result = runner.invoke(app, ["synth", str(path), "-m", str(ckpt), "-o", str(out), "--greedy", "--max-frames", "2",
                                 "-q"])
    assert result.exit_code == 1 and f"{path}:2: id: 'x' already used on line 1" in result.output
    records = {r["id"]: r["status"] for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert records == {"x": "error", "line:2": "error", "y": "ok"}


def test_a_bad_line_takes_the_id_a_good_line_would_read(tmp_path):
    """A bad line's id is read as a good line's: 7.0 (pandas' integer with gaps) is the id '7', which a later
    line cannot take (it ran beside the bad line, recorded as line:1); under --id-column key, the id is key's,
    not the key "id" that the mapping ignores (that one took 'zzz' from the line whose key is zzz)."""
    path = tmp_path / "m.jsonl"
    path.write_text("".join(_line(r) + "\n" for r in [
        {"id": 7.0, "text": " ", "speaker": "ryan"}, {"id": 7, "text": "Hi."}]), encoding="utf-8")
    first, second = iter_manifest(path)
    assert isinstance(first, BadLine) and first.id == "7"
    assert isinstance(second, BadLine) and second.message.startswith(f"{path}:2: id: '7' already used on line 1 ")
    path.write_text("".join(_line(r) + "\n" for r in [
        {"key": "a", "id": "zzz", "text": "Hi."}, {"key": "zzz", "text": "Hi."}]), encoding="utf-8")
    first, second = iter_manifest(path, None, column_map(id_column="key"))
    assert isinstance(first, BadLine) and first.id == "a", first
    assert isinstance(second, Item) and second.request.id == "zzz"


# ---------------------------------------------------------------- tables and column mapping

ROWS = [  # canonical field names; None = absent
    {"id": "t1", "text": "Hello, world.", "speaker": "ryan", "language": "english", "seed": 7, "max_seconds": 1.5,
     "non_streaming": True, "temperature": 0.7, "top_k": 20},
    {"id": "t2", "text": "Line two,\nwith a newline.", "speaker": "vivian", "language": None, "seed": None,
     "max_seconds": None, "non_streaming": False, "temperature": None, "top_k": None},
    {"id": "t3", "text": "Third.", "speaker": "ryan", "language": "auto", "seed": 0, "max_seconds": 2.0,
     "non_streaming": None, "temperature": 1.2, "top_k": 0},
]
RENAME = {"id": "utt", "text": "sentence", "speaker": "spk"}
OPTIONS = ["--id-column", "utt", "--text-column", "sentence", "--column", "speaker=spk"]


def _tabular(row):
    """A row with renamed columns and an extra column the reader must ignore."""
    return {**{RENAME.get(k, k): v for k, v in row.items()}, "notes": "ignored"}


def _write_all(tmp_path):
    """The ROWS as JSONL (canonical names) and as CSV, Parquet, saved dataset, Arrow (renamed columns)."""
    import datasets

    paths = {"jsonl": tmp_path / "m.jsonl", "csv": tmp_path / "m.csv", "parquet": tmp_path / "m.parquet",
             "jsonl-mapped": tmp_path / "mapped.jsonl", "datasets": tmp_path / "saved"}
    paths["jsonl"].write_text("".join(json.dumps({k: v for k, v in r.items() if v is not None}) + "\n"
                                      for r in ROWS), encoding="utf-8")
    paths["jsonl-mapped"].write_text("".join(json.dumps({k: v for k, v in _tabular(r).items() if v is not None
                                                         and k != "notes"}) + "\n" for r in ROWS), encoding="utf-8")
    table = [_tabular(r) for r in ROWS]
    header = list(table[0])
    cell = lambda v: "" if v is None else str(v).lower() if isinstance(v, bool) else str(v)  # noqa: E731
    import csv

    with open(paths["csv"], "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows([[cell(r[k]) for k in header] for r in table])
    pq.write_table(pa.Table.from_pylist(table), paths["parquet"])
    datasets.Dataset.from_list(table).save_to_disk(str(paths["datasets"]))
    paths["arrow"] = next(paths["datasets"].glob("*.arrow"))
    return paths


def _requests(path, cfg=None, columns=None):
    entries = list(iter_manifest(path, cfg, columns))
    assert all(isinstance(e, Item) for e in entries), [e for e in entries if isinstance(e, BadLine)]
    return [(e.request, e.seed, e.sampling, e.voice_path) for e in entries]


def test_csv_parquet_arrow_and_datasets_give_the_same_requests_as_jsonl(ckpt_dir, tmp_path):
    paths = _write_all(tmp_path)
    cfg = load_config(ckpt_dir("custom_voice"))
    expected = _requests(paths["jsonl"], cfg)
    assert expected[0][1] == 7 and expected[0][2] == {"temperature": 0.7, "top_k": 20}
    assert expected[1][0].text == "Line two,\nwith a newline." and expected[1][1] is None
    columns = column_map(["speaker=spk"], id_column="utt", text_column="sentence")
    for kind in ("csv", "parquet", "datasets", "arrow", "jsonl-mapped"):
        assert _requests(paths[kind], cfg, columns) == expected, kind
        assert count_rows(paths[kind]) == len(ROWS), kind
    # CSV line numbers count the header and the line inside the quoted cell.
    assert [e.line for e in iter_manifest(paths["csv"], cfg, columns)] == [2, 3, 5]
    assert [e.line for e in iter_manifest(paths["parquet"], cfg, columns)] == [1, 2, 3]


def test_synth_on_csv_with_column_options_matches_jsonl(ckpt_dir, tmp_path):
    paths = _write_all(tmp_path)
    model = str(ckpt_dir("custom_voice"))
    for kind, extra in (("jsonl", []), ("csv", OPTIONS), ("datasets", OPTIONS)):
        result = runner.invoke(app, ["synth", str(paths[kind]), "-m", model, "-o", str(tmp_path / kind), "--greedy",
                                     "--max-frames", "3", "--save-codes", "-q", *extra])
        assert result.exit_code == 0, result.output
    for kind in ("csv", "datasets"):
        for row in ROWS:
            np.testing.assert_array_equal(np.load(tmp_path / kind / f"{row['id']}.codes.npy"),
                                          np.load(tmp_path / "jsonl" / f"{row['id']}.codes.npy"))


def test_byte_order_marks_of_concatenated_files_are_fine(ckpt_dir, tmp_path):
    """`cat a.jsonl b.jsonl`, each saved with a byte order mark: the second file's first line opened with one, read
    as "malformed JSON (Unexpected UTF-8 BOM (decode using utf-8-sig) ...)"."""
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"id": "a", "text": "Hi.", "speaker": "ryan"}\r\n'
                     b'\xef\xbb\xbf{"id": "b", "text": "Hi.", "speaker": "ryan"}\r\n')
    assert [e.request.id for e in iter_manifest(path, load_config(ckpt_dir("custom_voice")))] == ["a", "b"]


def test_a_line_that_is_not_utf8_is_one_bad_line_and_the_lines_after_it_are_read(ckpt_dir, tmp_path):
    """A manifest saved in another encoding (Latin-1, say) has bytes that are not UTF-8: the line holding
    them is a bad line naming the byte and its column, in JSONL and CSV alike, and the run goes on."""
    cfg = load_config(ckpt_dir("custom_voice"))
    jsonl = tmp_path / "m.jsonl"
    jsonl.write_bytes(b'\xef\xbb\xbf{"id": "first", "text": "Hi.", "speaker": "ryan"}\r\n'
                      b'{"id": "cafe", "text": "Caf\xe9 au lait.", "speaker": "ryan"}\r\n'
                      b'{"id": "last", "text": "Bye.", "speaker": "ryan"}\r\n')
    csv = tmp_path / "m.csv"
    csv.write_bytes(b"id,text,speaker\nfirst,Hi.,ryan\ncafe,Caf\xe9 au lait.,ryan\nlast,Bye.,ryan\n")
    for path, line in ((jsonl, 2), (csv, 3)):
        entries = list(iter_manifest(path, cfg))
        assert [type(e) for e in entries] == [Item, BadLine, Item], entries
        column = 28 if path is jsonl else 9
        assert entries[1].message == f"{path}:{line}: not UTF-8 text (byte 0xe9 at column {column}; save the file as UTF-8)"
        assert [e.request.id for e in (entries[0], entries[2])] == ["first", "last"]
        assert count_rows(path) == 3
    result = runner.invoke(app, ["validate", str(jsonl), "-m", str(ckpt_dir("custom_voice"))])
    assert result.exit_code == 1 and result.output.splitlines()[-1] == f"{jsonl}: 2 good, 1 bad", result.output
    out = tmp_path / "out"
    result = runner.invoke(app, ["synth", str(jsonl), "-m", str(ckpt_dir("custom_voice")), "-o", str(out),
                                 "--greedy", "--max-frames", "3", "--quiet"])
    assert result.exit_code == 1 and f"{jsonl}:2: not UTF-8 text (byte 0xe9" in result.output, result.output
    records = {r["id"]: r["status"] for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert records == {"first": "ok", "line:2": "error", "last": "ok"}
    header = tmp_path / "h.csv"
    header.write_bytes(b"id,t\xe9xt,speaker\nfirst,Hi.,ryan\n")
    with pytest.raises(OmniTTSError, match=r"h\.csv:1: the header line is not UTF-8 text \(byte 0xe9 at column 5"):
        list(iter_manifest(header, cfg))


@pytest.mark.parametrize("field", ["id", "text", "speaker", "language"])
def test_a_lone_surrogate_escape_is_a_bad_line_naming_its_field(ckpt_dir, tmp_path, field):
    """JSON can escape half of a surrogate pair ("\\ud83d" alone), which is no text: no file name, tokenizer
    or log line can hold it. The line is bad, naming the field and the character."""
    row = {"id": "ok", "text": "Hi there.", "speaker": "ryan", "language": "english"}
    line = json.dumps(row).replace(f'"{field}": "', f'"{field}": "x\\ud83d', 1)
    path = tmp_path / "m.jsonl"
    path.write_text(_line(GOOD[0]) + "\n" + line + "\n", encoding="utf-8")
    entries = list(iter_manifest(path, load_config(ckpt_dir("custom_voice"))))
    assert isinstance(entries[0], Item) and isinstance(entries[1], BadLine), entries
    assert entries[1].message == (f"{path}:2: {field}: a lone surrogate '\\ud83d' at character 2 is not text (write "
                                  "the character itself, or both halves of its surrogate pair)")
    pair = json.dumps(row).replace('"text": "', '"text": "\\ud83d\\ude00 ', 1)  # a whole pair is a character
    path.write_text(pair + "\n", encoding="utf-8")
    assert [e.request.text for e in iter_manifest(path, load_config(ckpt_dir("custom_voice")))] == ["\U0001F600 Hi there."]


def test_table_errors_name_rows_fields_and_columns(ckpt_dir, tmp_path):
    model = str(ckpt_dir("custom_voice"))
    table = [{"utt": "a", "sentence": "Fine.", "speaker": "ryan", "seed": 1},
             {"utt": "b", "sentence": None, "speaker": "ryan", "seed": 2},
             {"utt": "c", "sentence": "Hi.", "speaker": "bob", "seed": None},
             {"utt": "d", "sentence": "Fine too.", "speaker": "ryan", "seed": 3}]
    path = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pylist(table), path)
    result = runner.invoke(app, ["validate", str(path), "-m", model, "--id-column", "utt", "--text-column", "sentence"])
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        f"{path}:row 2: text: missing (read from column 'sentence'); give the words to speak",
        f"{path}:row 3: speaker: 'bob' is not known to this checkpoint; choose one of "
        + ", ".join(load_config(model).talker.speakers),
        f"{path}: 2 good, 2 bad"]
    # A mapped column that does not exist is one error for the whole file, naming the columns there are: the
    # manifest cannot be read, exit 2, as synth exits.
    missing = runner.invoke(app, ["validate", str(path), "-m", model, "--id-column", "utt", "--text-column", "words"])
    assert missing.exit_code == 2 and missing.output.splitlines() == [
        f"error: {path}: column 'words' (mapped to text) not found; the columns are 'utt', 'sentence', 'speaker', "
        "'seed'"], missing.output
    unmapped = runner.invoke(app, ["validate", str(path), "-m", model])
    assert unmapped.exit_code == 2 and f"error: {path}: no 'id' column" in unmapped.output
    # A field's own column mapped to another field: that field has no column, and the message says why.
    csv = tmp_path / "c.csv"
    csv.write_text("ident,id,text,speaker\nx,a,Hello.,ryan\n")
    taken = runner.invoke(app, ["validate", str(csv), "-m", model, "--column", "speaker=text"], env={"COLUMNS": "200"})
    assert taken.exit_code == 2 and " ".join(taken.output.split()) == (
        f"error: {csv}: the 'text' column is read as speaker (--column speaker=text), so no column gives text; map "
        "one with --text-column NAME"), taken.output
    bad_option = runner.invoke(app, ["validate", str(path), "-m", model, "--column", "pitch=sentence"])
    assert bad_option.exit_code == 2 and "unknown field 'pitch'" in bad_option.output
    typo = runner.invoke(app, ["validate", str(path), "-m", model, "--column", "langauge=lang"])
    assert typo.exit_code == 2 and "unknown field 'langauge' (did you mean 'language'?)" in typo.output, typo.output


def test_typed_tables_accept_integer_ids_and_whole_float_seeds(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": [10, 11, 12], "text": ["A.", "B.", "C."], "seed": [1.0, float("nan"), 2.5]}), path)
    a, b, c = iter_manifest(path, None)
    assert (a.request.id, a.seed, b.request.id, b.seed) == ("10", 1, "11", None)
    assert c.message == f"{path}:row 3: seed: expected int, got float" and c.id == "12"


def test_decimal_columns_are_numbers_and_whole_decimals_keep_every_digit(tmp_path):
    """A SQL or Spark export stores numbers as DECIMAL (Parquet's decimal128): they are numbers, as floats are; a
    whole one in an integer field (a seed past a float's 53 bits) is that integer exactly, and names an id as
    7 does. They were refused ("max_seconds: expected number, got Decimal")."""
    from decimal import Decimal

    path = tmp_path / "d.parquet"
    whole = pa.decimal128(20, 0)
    pq.write_table(pa.table({"id": pa.array([Decimal(7), Decimal(8)], whole), "text": ["A.", "B."],
                             "max_seconds": pa.array([Decimal("1.5"), None], pa.decimal128(5, 2)),
                             "seed": pa.array([Decimal(12345678901234567), Decimal(3)], whole),
                             "top_k": pa.array([Decimal(5), Decimal("2.5")], pa.decimal128(5, 1))}), path)
    a, b = iter_manifest(path, None)
    assert (a.request.id, a.request.max_seconds, a.seed, a.sampling) == ("7", 1.5, 12345678901234567, {"top_k": 5})
    assert isinstance(b, BadLine) and b.message == f"{path}:row 2: top_k: expected int, got float" and b.id == "8"
    # NaN decimals (Python's; Arrow's decimals hold none) are NaN: a bad line naming the field. A signalling one
    # raised float()'s "cannot convert signaling NaN to float", naming nothing, from a stream's dict
    from omnitts.batch.manifest import _typed_values, parse_item
    from omnitts.errors import RequestError

    for nan in (Decimal("NaN"), Decimal("sNaN")):
        with pytest.raises(RequestError, match=r"^max_seconds: must be > 0, got nan$"):
            parse_item(_typed_values({"id": "n", "text": "Hi.", "max_seconds": nan}), 1, tmp_path)


def test_csv_cells_are_converted_with_errors_naming_line_and_field(ckpt_dir, tmp_path):
    path = tmp_path / "m.csv"
    path.write_text('id,text,speaker,seed,max_seconds,x_vector_only,top_p\n'
                    'a,"Two\nlines.",ryan,1,1.5,,\n'
                    'b,Hi.,ryan,one,,,\n'
                    'c,Hi.,ryan,,fast,,\n'
                    'd,Hi.,ryan,,,maybe,\n'
                    'e,Hi.,ryan,,,,0\n'
                    'f,Hi.,ryan,2,,,,extra\n'
                    '\n'
                    'g,Hi.,ryan, 5 ,,false,1\n', encoding="utf-8")
    entries = list(iter_manifest(path, load_config(ckpt_dir("custom_voice"))))
    assert [(e.line, e.message.split(": ", 1)[1]) for e in entries if isinstance(e, BadLine)] == [
        (4, "seed: expected an integer, got 'one'"),
        (5, "max_seconds: expected a number, got 'fast'"),
        (6, "x_vector_only: expected true or false, got 'maybe'"),
        (7, "top_p: must be in (0, 1], got 0.0"),
        (8, "8 cells but the header names 7 columns (quote cells that contain the delimiter)")]
    good = [e for e in entries if isinstance(e, Item)]
    assert [(e.line, e.request.id, e.seed) for e in good] == [(2, "a", 1), (10, "g", 5)]
    assert good[0].request.max_seconds == 1.5 and good[1].sampling == {"top_p": 1.0}
    assert all(e.message.startswith(f"{path}:{e.line}: ") for e in entries if isinstance(e, BadLine))


def test_a_csv_nul_byte_past_the_first_64_kib_is_refused_on_its_line(ckpt_dir, tmp_path):
    """A NUL byte in a CSV's first 64 KiB refuses the file as binary; one further on went into the text without a
    word. Now that line is bad, naming its column, and the lines around it are read."""
    path = tmp_path / "m.csv"
    filler = "".join(f"{i},{'x' * 100},ryan\n" for i in range(1000))  # > 64 KiB before the NUL
    path.write_text("id,text,speaker\n" + filler + "nul,Bad\0text.,ryan\nz,Hi.,ryan\n", encoding="utf-8")
    *_, bad, last = iter_manifest(path, load_config(ckpt_dir("custom_voice")))
    assert isinstance(bad, BadLine)
    assert bad.message == (f"{path}:1002: text: a NUL byte at character 4 is not text (the file may be damaged or "
                           "have binary data pasted in; remove it)")
    assert isinstance(last, Item) and last.request.id == "z"


def test_csv_cells_lose_the_spaces_around_them_as_the_header_does(ckpt_dir, tmp_path):
    """"a, Hello., ryan" is a common way to write CSV: the speaker is ryan, not ' ryan' (unknown); a cell of
    spaces is empty, so absent."""
    path = tmp_path / "m.csv"
    path.write_text("id, text, speaker, seed\n a , Hello there. , ryan,  \n", encoding="utf-8")
    (entry,) = iter_manifest(path, load_config(ckpt_dir("custom_voice")))
    assert isinstance(entry, Item), entry
    assert (entry.request.id, entry.request.text, entry.request.speaker, entry.seed) == ("a", "Hello there.", "ryan",
                                                                                         None)


def test_csv_and_tsv_integer_cells_take_whole_floats_as_pandas_writes_them(ckpt_dir, tmp_path):
    """pandas' `to_csv` writes an integer column with gaps as 1.0, , 3.0: read as JSON's 7.0 and Parquet's are
    (every integer field); a fraction is still refused."""
    cfg = load_config(ckpt_dir("custom_voice"))
    for name, sep in (("m.csv", ","), ("m.tsv", "\t")):
        path = tmp_path / name
        path.write_text(sep.join(["id", "text", "speaker", "seed", "top_k"]) + "\n"
                        + "".join(sep.join(row) + "\n" for row in (["a", "Hi.", "ryan", "1.0", "20.0"],
                                                                     ["b", "Hi.", "ryan", "", ""],
                                                                     ["c", "Hi.", "ryan", "3.0", "1e1"],
                                                                     ["d", "Hi.", "ryan", "1.5", ""],
                                                                     ["e", "Hi.", "ryan", "", "2.5"])), encoding="utf-8")
        a, b, c, d, e = iter_manifest(path, cfg)
        assert [(x.seed, x.sampling) for x in (a, b, c)] == [(1, {"top_k": 20}), (None, {}), (3, {"top_k": 10})]
        assert type(a.seed) is int and type(a.sampling["top_k"]) is int
        assert d.message == f"{path}:5: seed: expected an integer, got '1.5'"
        assert e.message == f"{path}:6: top_k: expected an integer, got '2.5'"


def test_csv_number_cells_are_read_as_json_numbers(ckpt_dir, tmp_path):
    """Python's int() and float() read "1_000" and other scripts' digits; a JSON line refuses them, and so does a
    CSV cell now (1e3 is a JSON number, read as 1000 as in a JSON line)."""
    path = tmp_path / "m.csv"
    path.write_text("id,text,speaker,seed,temperature\n"
                    "a,Hi.,ryan,1_000,\nb,Hi.,ryan,\u0661\u0662,\nc,Hi.,ryan,,1_0\nd,Hi.,ryan,1e3,0.5\n", encoding="utf-8")
    a, b, c, d = iter_manifest(path, load_config(ckpt_dir("custom_voice")))
    assert [x.message for x in (a, b, c)] == [f"{path}:2: seed: expected an integer, got '1_000'",
                                              f"{path}:3: seed: expected an integer, got '\u0661\u0662'",
                                              f"{path}:4: temperature: expected a number, got '1_0'"]
    assert isinstance(d, Item) and d.seed == 1000 and d.sampling == {"temperature": 0.5}


def test_json_lines_take_integer_ids_and_whole_floats_as_tables_do(ckpt_dir, tmp_path):
    """pandas' `to_json(orient="records", lines=True)` writes an integer column with gaps as 7.0 and an
    integer id as 7: read as Parquet's are; a fraction where an integer is expected is still refused."""
    path = tmp_path / "m.jsonl"
    path.write_text('{"id": 7, "text": "Hi.", "speaker": "ryan", "seed": 3.0, "top_k": 20.0}\n'
                    '{"id": "b", "text": "Hi.", "speaker": "ryan", "top_k": 2.5}\n', encoding="utf-8")
    good, bad = iter_manifest(path, load_config(ckpt_dir("custom_voice")))
    assert (good.request.id, good.seed, good.sampling) == ("7", 3, {"top_k": 20})
    assert type(good.seed) is int and type(good.sampling["top_k"]) is int
    assert bad.message == f"{path}:2: top_k: expected int, got float"
    # An id column of integers with a gap, as pandas stores it (floats; the gap a NaN): 7.0 is the id "7" (it was
    # "id: expected str, got float" on every row), the gap a missing id; a fraction is no id.
    frame = pa.table({"id": [7.0, None, 9.5], "text": ["Hi."] * 3, "speaker": ["ryan"] * 3})
    pq.write_table(frame, tmp_path / "gaps.parquet")
    seven, gap, fraction = iter_manifest(tmp_path / "gaps.parquet", load_config(ckpt_dir("custom_voice")))
    assert seven.request.id == "7"
    assert gap.message.endswith("row 2: id: missing; every line needs an id (it names the output file)")
    assert fraction.message.endswith("row 3: id: expected str, got float")


def test_a_csv_cell_going_on_after_its_closing_quote_is_a_bad_line_not_silently_unquoted(ckpt_dir, tmp_path):
    """`"Hi," he said.` was read as `Hi, he said.`: the quotes of the text dropped without a word. In a CSV it is a
    bad line naming the fix, and the lines after it are read (a TSV reads it as it is: the test below)."""
    name, sep = "m.csv", ","
    path = tmp_path / name
    rows = [["id", "text", "speaker"], ["a", '"Hi," he said.', "ryan"], ["b", 'She said "no".', "ryan"],
            ["c", '"""Hi,"" he said."', "ryan"], ["d", "Next.", "ryan"]]
    path.write_text("".join(sep.join(row) + "\n" for row in rows), encoding="utf-8")
    entries = list(iter_manifest(path, load_config(ckpt_dir("custom_voice"))))
    assert [(e.request.id, e.request.text) for e in entries if isinstance(e, Item)] == [
        ("b", 'She said "no".'), ("c", '"Hi," he said.'), ("d", "Next.")]
    (bad,) = [e for e in entries if isinstance(e, BadLine)]
    assert bad.message == (f"{path}:2: malformed {name[-3:].upper()}: a cell opens with a quote and goes on after the "
                           'quote that closes it; quote the whole cell and double the quotes inside it ("""Hi,"" he '
                           'said.")')
    assert count_rows(path) == 4


def test_the_lines_a_malformed_quoted_cell_ran_over_are_read_again(ckpt_dir, tmp_path):
    """A CSV cell opening with a quote that closes on a later line (`"Hello, he said.`, closed by the quote of
    `"four"` three lines down) and goes on after it is a bad line; the reader went on after the line where the
    quote closed, so the lines between were neither run nor reported ("1 good, 1 bad" of 5 lines). They are read
    again as the records they are."""
    name, sep = "m.csv", ","
    path = tmp_path / name
    rows = [["id", "text", "speaker"], ["c1", '"Hello, he said.', "ryan"], ["c2", "Plain line two.", "ryan"],
            ["c3", "Line three.", "ryan"], ["c4", 'And "four" here.', "ryan"], ["c5", "Five.", "ryan"]]
    path.write_text("".join(sep.join(row) + "\n" for row in rows), encoding="utf-8")
    entries = list(iter_manifest(path, load_config(ckpt_dir("custom_voice"))))
    assert [(e.request.id, e.request.text) for e in entries if isinstance(e, Item)] == [
        ("c2", "Plain line two."), ("c3", "Line three."), ("c4", 'And "four" here.'), ("c5", "Five.")]
    (bad,) = [e for e in entries if isinstance(e, BadLine)]
    assert bad.message.startswith(f"{path}:2: malformed {name[-3:].upper()}: a cell opens with a quote and goes on")
    assert count_rows(path) == 5
    numbers = [e.line for e in entries]  # each record by its own line
    assert numbers == [2, 3, 4, 5, 6]


def test_a_tsv_line_not_quoted_as_spreadsheets_quote_is_read_as_it_is(ckpt_dir, tmp_path):
    """Common Voice's TSV sentences open with quotes (`"Hi," he said.`, `"Hello, he said.`), which a CSV reader
    takes for quoting: each was a bad line (and the second one swallowed lines up to the next quote). TSV has no
    quoting of its own (IANA; the Hugging Face Common Voice loader reads it with csv.QUOTE_NONE): such a line is
    read as it is, split at its tabs, and a cell quoted as a spreadsheet quotes it is still unquoted."""
    path = tmp_path / "m.tsv"
    rows = [["id", "text", "speaker"], ["a", '"Hi," he said.', "ryan"], ["b", '"Hello, he said.', "ryan"],
            ["c", "Plain.", "ryan"], ["d", 'And "four" here.', "ryan"], ["e", '"""Q,"" he said."', "ryan"],
            ["f", '"never closed', "ryan"], ["g", "Last.", "ryan"]]
    path.write_text("".join("\t".join(row) + "\n" for row in rows), encoding="utf-8")
    entries = list(iter_manifest(path, load_config(ckpt_dir("custom_voice"))))
    assert not [e for e in entries if isinstance(e, BadLine)]
    assert [(e.line, e.request.id, e.request.text, e.request.speaker) for e in entries] == [
        (2, "a", '"Hi," he said.', "ryan"), (3, "b", '"Hello, he said.', "ryan"), (4, "c", "Plain.", "ryan"),
        (5, "d", 'And "four" here.', "ryan"), (6, "e", '"Q," he said.', "ryan"), (7, "f", '"never closed', "ryan"),
        (8, "g", "Last.", "ryan")]
    assert count_rows(path) == 7


def test_a_csv_quote_never_closed_is_named_where_it_opens(ckpt_dir, tmp_path):
    """The reader takes every line after an unclosed quote as part of that cell: the line is the bad one
    (not "speaker: required", which the swallowed record used to say), and no later line runs unseen."""
    path = tmp_path / "m.csv"
    path.write_text('id,text,speaker\na,"Two\nlines.",ryan\nb,"Never closed,ryan\nc,Hi.,ryan\n', encoding="utf-8")
    entries = list(iter_manifest(path, load_config(ckpt_dir("custom_voice"))))
    assert [e.request.id for e in entries if isinstance(e, Item)] == ["a"]
    (bad,) = [e for e in entries if isinstance(e, BadLine)]
    assert bad.message == (f"{path}:4: a quoted cell opened on this line is never closed: lines 4-5, the rest of the "
                           "file, read as one record (close the quote, or double a quote inside a cell)")
    path.write_text('id,text,speaker\na,"Closed ""here"".",ryan\nb,Hi.,ryan', encoding="utf-8")  # no last newline
    assert [e.request.text for e in iter_manifest(path, load_config(ckpt_dir("custom_voice")))] == [
        'Closed "here".', "Hi."]


def test_a_csv_cell_past_the_csv_modules_limit_is_one_bad_line_and_the_lines_after_it_run(ckpt_dir, tmp_path):
    """csv refuses a cell over 128 Ki characters with an error it cannot read past, which ended the file there:
    the lines after a long text were never read. The text is judged as JSONL's is (the piece cap)."""
    path = tmp_path / "m.csv"
    path.write_text(f"id,text,speaker\na,Hi.,ryan\nb,{'word ' * 30000}.,ryan\nc,Hi.,ryan\n", encoding="utf-8")
    entries = list(iter_manifest(path, load_config(ckpt_dir("custom_voice"))))
    assert [e.request.id for e in entries if isinstance(e, Item)] == ["a", "c"]
    (bad,) = [e for e in entries if isinstance(e, BadLine)]
    assert bad.message.startswith(f"{path}:3: text: 150,001 characters make ") and bad.id == "b", bad.message
    assert count_rows(path) == 3


@pytest.mark.parametrize("kind", ["parquet", "arrow"])
def test_a_table_damaged_past_its_header_is_one_error_naming_it(ckpt_dir, tmp_path, kind):
    """A Parquet page that cannot be decoded, an Arrow stream (as `datasets` writes) cut short: pyarrow raises
    while the rows are read, which was a traceback in validate and "cannot write OUT: ..." (exit 1) in synth."""
    table = pa.table({"id": [f"x{i}" for i in range(3000)], "text": ["Hi."] * 3000, "speaker": ["ryan"] * 3000})
    path = tmp_path / f"m.{kind}"
    if kind == "parquet":
        pq.write_table(table, path)
        data = bytearray(path.read_bytes())
        data[4:40] = b"\xff" * 36  # the first page header, after the magic bytes
    else:
        with pa.ipc.new_stream(path, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=1000):
                writer.write_batch(batch)
        data = path.read_bytes()[:path.stat().st_size // 2]
    path.write_bytes(bytes(data))
    model = str(ckpt_dir("custom_voice"))
    for args in (["validate", str(path), "-m", model], ["synth", str(path), "-m", model, "-o", str(tmp_path / "out")]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args[0], result.output)
        (line,) = result.output.splitlines()
        assert line.startswith(f"error: {path}: cannot read {'Parquet' if kind == 'parquet' else 'Arrow'} file ("), line


@pytest.mark.parametrize("kind", ["parquet", "arrow"])
def test_a_table_naming_a_column_twice_is_one_error_unless_the_column_is_ignored(ckpt_dir, tmp_path, kind):
    """Parquet and Arrow let two columns share a name: pyarrow read the last 'text' without a word (Parquet) or
    raised a KeyError traceback (Arrow). Refused as a CSV header naming a column twice is; an ignored column
    named twice is harmless."""
    def write(path, names):
        table = pa.Table.from_arrays([pa.array(["a"]), pa.array(["First."]), pa.array(["ryan"]), pa.array(["Other."])],
                                     names=names)
        if kind == "parquet":
            pq.write_table(table, path)
        else:
            with pa.ipc.new_file(path, table.schema) as writer:
                writer.write_table(table)
        return path

    model = str(ckpt_dir("custom_voice"))
    path = write(tmp_path / f"m.{kind}", ["id", "text", "speaker", "text"])
    for args in (["validate", str(path), "-m", model], ["synth", str(path), "-m", model, "-o", str(tmp_path / "out")]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args[0], result.output)
        assert result.output.strip() == (f"error: {path}: column 'text' is in the table 2 times; which one to read is "
                                         "unclear"), result.output
    assert not (tmp_path / "out").exists()
    path = write(tmp_path / f"n.{kind}", ["id", "text", "notes", "notes"])
    (item,) = iter_manifest(path)
    assert (item.request.id, item.request.text) == ("a", "First.")


@pytest.mark.parametrize("name,header,message", [
    ("m.csv", "id,text,speaker,speaker", "the header names column 'speaker' twice; which one to read is unclear"),
    ("m.tsv", "id,text,speaker", ("the header is one column, 'id,text,speaker', holding commas: a .tsv file is read "
                                  "with tabs; give the file a .csv name")),
    ("m.csv", "id\ttext\tspeaker", ("the header is one column, 'id\\ttext\\tspeaker', holding tabs: a .csv file is "
                                    "read with commas; give the file a .tsv name")),
])
def test_a_csv_header_that_cannot_be_read_is_one_error(ckpt_dir, tmp_path, name, header, message):
    path = tmp_path / name
    path.write_text(header + "\n" + header.replace("id", "a").replace("text", "Hi.") + "\n", encoding="utf-8")
    result = runner.invoke(app, ["validate", str(path), "-m", str(ckpt_dir("custom_voice"))])
    assert result.exit_code == 2 and result.output.strip() == f"error: {path}:1: {message}", result.output


def test_jsonl_column_mapping_renames_keys(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({"key": "a", "words": "Hi."}) + "\n"
                    + json.dumps({"key": "b", "words": "Hi.", "text": "shadowed"}) + "\n"
                    + json.dumps({"key": "c"}) + "\n", encoding="utf-8")
    a, b, c = iter_manifest(path, None, column_map(["text=words"], id_column="key"))
    assert a.request.id == "a" and a.request.text == "Hi."
    assert b.message == f"{path}:2: text: this key is ignored because text is read from 'words'; remove it"
    assert c.message == f"{path}:3: text: missing (read from column 'words'); give the words to speak"


def test_column_map_rejects_malformed_options():
    from omnitts.errors import OmniTTSError

    assert column_map(["speaker = spk"], text_column="s") == {"speaker": "spk", "text": "s"}
    for specs, kwargs, needle in [(["text"], {}, "expected FIELD=COLUMN"), (["text="], {}, "expected FIELD=COLUMN"),
                                  (["text=a"], {"text_column": "b"}, "text: mapped to two columns, 'a' and 'b'"),
                                  (["text=a", "speaker=a"], {}, "column 'a' is mapped to both text and speaker")]:
        with pytest.raises(OmniTTSError, match=needle):
            column_map(specs, **kwargs)


# ---------------------------------------------------------------- laziness

def test_first_item_arrives_before_the_rest_of_the_file_is_written(tmp_path):
    """The JSONL reader consumes its input incrementally: a pipe whose writer waits for the first item."""
    fifo = tmp_path / "m.jsonl"
    os.mkfifo(fifo)
    first_seen, order = threading.Event(), []

    def writer():
        with open(fifo, "w", encoding="utf-8") as handle:
            handle.write(json.dumps({"id": "u0", "text": "First."}) + "\n")
            handle.flush()
            order.append("rest" if not first_seen.wait(timeout=20) else "first item seen")
            handle.writelines(json.dumps({"id": f"u{i}", "text": "More."}) + "\n" for i in range(1, 500))

    thread = threading.Thread(target=writer)
    thread.start()
    entries = iter_manifest(fifo, None)
    first = next(entries)
    first_seen.set()
    rest = list(entries)
    thread.join()
    assert first.request.id == "u0" and order == ["first item seen"] and len(rest) == 499


def _memory_peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("kind", ["jsonl", "csv", "parquet", "datasets"])
def test_reading_memory_grows_only_with_the_ids_seen(tmp_path, kind):
    import datasets

    def write(n):
        rows = [{"id": f"utt{i:06d}", "text": f"Sentence number {i}, long enough to matter.", "speaker": "ryan",
                 "seed": i} for i in range(n)]
        path = tmp_path / f"{n}.{kind}"
        if kind == "jsonl":
            path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        elif kind == "csv":
            path.write_text("id,text,speaker,seed\n" + "".join(f'{r["id"]},"{r["text"]}",ryan,{r["seed"]}\n'
                                                               for r in rows), encoding="utf-8")
        elif kind == "parquet":
            pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=2048)
        else:
            datasets.Dataset.from_list(rows).save_to_disk(str(path))
        return path

    small, large = write(1100), write(4400)  # both above one record batch (1024 rows)
    ids = lambda n: {f"utt{i:06d}": i for i in range(n)}  # noqa: E731 (what iter_manifest must keep)
    allowance = _memory_peak(lambda: ids(4400)) - _memory_peak(lambda: ids(1100))
    count = lambda path: sum(isinstance(e, Item) for e in iter_manifest(path, None))  # noqa: E731
    count(small)  # warm caches (imports, regexes) outside the measurement
    growth = _memory_peak(lambda: count(large)) - _memory_peak(lambda: count(small))
    as_list = _memory_peak(lambda: list(iter_manifest(large, None)))
    assert count(large) == 4400
    assert growth < allowance + 200_000, (growth, allowance)
    assert as_list > 3 * (growth + 1), (as_list, growth)  # materialising would show up


def test_synth_applies_per_item_sampling_overrides(ckpt_dir, tmp_path, monkeypatch):
    from omnitts.batch.outdir import Batch

    made = []
    original = Batch.job

    def recording(self, item):
        job = original(self, item)
        made.append(job.params)
        return job

    monkeypatch.setattr(Batch, "job", recording)
    path = tmp_path / "m.jsonl"
    path.write_text("".join(_line(r) + "\n" for r in GOOD), encoding="utf-8")
    result = runner.invoke(app, ["synth", str(path), "-m", str(ckpt_dir("custom_voice")), "-o", str(tmp_path / "o"),
                                 "--max-frames", "2", "--seed", "9", "-q"])
    assert result.exit_code == 0, result.output
    first, middle, last = made
    assert (middle.temperature, middle.top_k, middle.top_p, middle.repetition_penalty, middle.seed) == (0.7, 10, 0.9, 1.1, 3)
    assert first == last and (first.temperature, first.top_k, first.seed) == (0.9, 50, 9)
    assert middle.subtalker_temperature == first.subtalker_temperature  # overrides are the talker's only


def test_a_manifest_on_standard_input_is_refused_with_what_to_do(ckpt_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no file named "-" here
    reasons = {"synth": "a manifest is read more than once (checked, counted, run), so it is a file, not standard "
                        "input",
               "validate": "a manifest is a file, not standard input"}  # validate reads it once: not synth's reason
    for command in (["validate", "-"], ["synth", "-", "-o", str(tmp_path / "out")]):
        result = runner.invoke(app, [*command, "-m", str(ckpt_dir("custom_voice"))], input=_line(GOOD[0]) + "\n")
        assert result.exit_code == 2, result.output
        assert result.output == f"error: -: {reasons[command[0]]}: save it first (... > lines.jsonl)\n"


def test_a_manifest_path_that_cannot_be_looked_up_is_one_error(ckpt_dir, tmp_path):
    """A name too long for the filesystem (or, for a user, a folder above it without search permission): pathlib
    raises the OSError before Python 3.12; synth met it with an UnboundLocalError traceback, validate with the
    OSError's."""
    manifest = tmp_path / ("m" * 300 + ".jsonl")
    for command in (["validate", str(manifest)], ["synth", str(manifest), "-o", str(tmp_path / "out")]):
        result = runner.invoke(app, [*command, "-m", str(ckpt_dir("custom_voice"))])
        assert result.exit_code == 2, (command[0], result.output)
        assert result.output == f"error: {manifest}: cannot open manifest (File name too long)\n", result.output


@pytest.mark.parametrize("how", ["pipe", "fifo"])
def test_synth_refuses_a_piped_manifest_and_validate_reads_it(ckpt_dir, tmp_path, how):
    """`cat m.jsonl | omnitts synth /dev/stdin ...` (or `<(...)`, a FIFO) synthesized nothing and exited 0:
    synth reads its manifest more than once, and a pipe is empty the second time. validate reads it once."""
    model = str(ckpt_dir("custom_voice"))

    def piped():
        """A pipe holding the manifest, by a path: /dev/fd/N (as `<(...)` and /dev/stdin are), or a FIFO."""
        if how == "pipe":
            read, write = os.pipe()
            os.write(write, (_line(GOOD[0]) + "\n").encode())
            os.close(write)
            return f"/dev/fd/{read}", lambda: os.close(read)
        fifo = tmp_path / "m.jsonl"
        if not fifo.exists():
            os.mkfifo(fifo)
        writer = threading.Thread(target=lambda: fifo.write_text(_line(GOOD[0]) + "\n"), daemon=True)
        writer.start()
        return str(fifo), lambda: writer.join(timeout=0.1)

    path, done = piped()
    try:
        result = runner.invoke(app, ["synth", path, "-m", model, "-o", str(tmp_path / "out"), "--max-frames", "2"])
    finally:
        if how == "fifo":  # no reader came: let the writer through
            with open(path, encoding="utf-8") as handle:
                handle.read()
        done()
    assert result.exit_code == 2, result.output
    assert result.output == (f"error: {path}: a manifest is read more than once (checked, counted, run), so it is a "
                             "file, not a pipe: save it first (... > lines.jsonl)\n")
    assert not (tmp_path / "out").exists()
    path, done = piped()
    try:
        result = runner.invoke(app, ["validate", path, "-m", model])
    finally:
        done()
    assert result.exit_code == 0 and result.output == f"{path}: 1 good, 0 bad\n", result.output


def test_a_binary_or_utf16_file_or_one_json_document_given_as_the_manifest_is_one_error_and_leaves_no_out(
        ckpt_dir, tmp_path):
    """A reference clip given as the manifest (a slip of the shell's completion) was read as JSONL: hundreds of
    bad lines, each recorded into OUT; a UTF-16 file (Notepad's "Unicode"), every line "not UTF-8". Now one line,
    exit 2, and no OUT folder left behind, as for an empty manifest (which left an empty one)."""
    model = str(ckpt_dir("custom_voice"))
    sf.write(tmp_path / "clip.wav", np.zeros(4000, dtype=np.float32), 24000)
    clip = (tmp_path / "clip.wav").read_bytes()
    (tmp_path / "clip.jsonl").write_bytes(clip)
    (tmp_path / "clip.csv").write_bytes(clip)
    (tmp_path / "noise.jsonl").write_bytes(b'{"id": "a"}\n\x00\x01\x02\n')
    (tmp_path / "utf16.jsonl").write_text('{"id": "a", "text": "Hi.", "speaker": "ryan"}\n', encoding="utf-16")
    (tmp_path / "empty.jsonl").write_text("")
    # One JSON document over many lines (a JSON array, a pretty-printed object) was a bad line per line, no word of
    # why, and an array's last item, whole on its line, ran alone
    (tmp_path / "array.json").write_text('[\n  {"id": "a", "text": "Hi.", "speaker": "ryan"},\n'
                                         '  {"id": "b", "text": "Yo.", "speaker": "ryan"}\n]\n')
    (tmp_path / "packed.jsonl").write_text('\ufeff[{"id": "a", "text": "Hi.", "speaker": "ryan"},\n'
                                           ' {"id": "b", "text": "Yo.", "speaker": "ryan"}]\n')
    (tmp_path / "pretty.jsonl").write_text('\n{\n  "id": "a",\n  "text": "Hi.",\n  "speaker": "ryan"\n}\n')
    expected = {
        "clip.wav": "not a text manifest: it holds binary data (it looks like a WAV file); give a .jsonl, .csv or "
                    ".tsv file, a .parquet or .arrow file, or a Dataset.save_to_disk folder",
        "clip.jsonl": "not a text manifest: it holds binary data (it looks like a WAV file);",
        "clip.csv": "not a text manifest: it holds binary data (it looks like a WAV file);",
        "noise.jsonl": "not a text manifest: it holds binary data; give a .jsonl",
        "utf16.jsonl": "UTF-16 text; manifests are UTF-8: save it as UTF-8",
        "empty.jsonl": "no items (the manifest is empty)",
        "array.json": f"a JSON array, not JSON Lines; a manifest holds one JSON object per line: write it so (jq -c "
                      f"'.[]' {tmp_path / 'array.json'} > lines.jsonl)",
        "packed.jsonl": "a JSON array, not JSON Lines;",
        "pretty.jsonl": f"one JSON object spread over lines, not JSON Lines; a manifest holds one JSON object per "
                        f"line: write it so (jq -c . {tmp_path / 'pretty.jsonl'} > lines.jsonl)",
    }
    for name, message in expected.items():
        path, out = tmp_path / name, tmp_path / f"out-{name.replace('.', '-')}"  # (not a file name: out-clip.wav)
        for args in (["validate", str(path), "-m", model], ["synth", str(path), "-m", model, "-o", str(out)]):
            result = runner.invoke(app, args)
            assert result.exit_code == 2, (name, args[0], result.output)
            (line,) = result.output.splitlines()
            assert line.startswith(f"error: {path}: {message}"), line
        assert not out.exists(), name
    # A folder that was there stays; one holding a recorded bad line stays with it.
    (tmp_path / "kept").mkdir()
    assert runner.invoke(app, ["synth", str(tmp_path / "clip.wav"), "-m", model, "-o", str(tmp_path / "kept")]).exit_code == 2
    assert (tmp_path / "kept").is_dir()
    (tmp_path / "bad.jsonl").write_text('{"id": "a b", "text": "Hi."}\n')
    assert runner.invoke(app, ["synth", str(tmp_path / "bad.jsonl"), "-m", model, "-o", str(tmp_path / "rec")]).exit_code == 2
    assert (tmp_path / "rec" / "results.jsonl").is_file()


class _Str(str):
    pass


@pytest.mark.parametrize("obj, error", [
    ({"max_seconds": np.float64(2.5), "temperature": 1}, None),  # subclasses of int/float pass the isinstance check
    ({"seed": True}, "seed: expected int, got bool"),  # a bool is an int to isinstance, not a seed
    ({"top_p": False}, "top_p: expected number, got bool"),
    ({"x_vector_only": 1}, "x_vector_only: expected bool, got int"),
    ({"text": _Str("fine"), "speaker": "ryan"}, None),
    ({"text": _Str("a \ud800 b")}, "text: a lone surrogate '\\ud800' at character 3 is not text"),
    ({"seed": "7", "text": 3}, "text: expected str, got int"),  # the first field in FIELDS' order is named
])
def test_check_fields_exact_types_take_the_fast_path_others_the_full_check(obj, error):
    from omnitts.batch.manifest import check_fields
    from omnitts.errors import RequestError

    if error is None:
        check_fields(obj)
    else:
        with pytest.raises(RequestError) as exc:
            check_fields(obj)
        assert str(exc.value).startswith(error)


def test_one_json_decoder_for_every_line_reads_and_refuses_lines_as_json_loads_does(tmp_path):
    """sources._loads reuses one decoder: each line is read, or refused with the message, as
    json.loads(line, object_pairs_hook=...) reads or refuses it (a second byte order mark included)."""
    import json

    from omnitts.batch import sources

    lines = ['{"id": "a", "text": "Hi."}', '\ufeff\ufeff{"id": "b"}', '{"id": "c", "id": "d"}', '{"id": ',
             '{"id": "e"} x', '  {"id": "f", "n": 1.5e3}  ', '{"a": ' + '[' * 100000 + ']' * 100000 + '}']
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    for (number, row), line in zip(sources.JsonlSource(path).rows(), lines, strict=True):
        try:
            want = json.loads(line.removeprefix("\ufeff"), object_pairs_hook=sources._unique_keys)
        except json.JSONDecodeError as exc:
            want = f"malformed JSON ({exc.msg} at column {exc.colno})"
        except sources._TwiceGiven as exc:
            want = f"{exc.args[0]}: given twice in the line; which value counts is unclear, keep one"
        except RecursionError:
            want = "JSON nested too deeply to read (no field takes arrays or objects)"
        assert row == want, (number, row, want)


def test_a_json_line_cut_short_names_the_column_where_it_ends(ckpt_dir, tmp_path):
    """A line missing its closing brace (or CRLF-ended) is reported at its own end, not at "column 1" (the
    column of the line after its newline, where the decoder ran out of text)."""
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"id": "a", "text": "Hi."\r\n{"id": "b", "text": "Hi."\n{"id": \n')
    result = runner.invoke(app, ["validate", str(path), "-m", str(ckpt_dir("custom_voice"))])
    assert f"{path}:1: malformed JSON (Expecting ',' delimiter at column 26)" in result.output, result.output
    assert f"{path}:2: malformed JSON (Expecting ',' delimiter at column 26)" in result.output, result.output
    assert f"{path}:3: malformed JSON (Expecting value at column 8)" in result.output, result.output
