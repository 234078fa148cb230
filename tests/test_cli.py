"""`omnitts synth` end to end on the tiny checkpoints, through typer's CliRunner."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from typer.testing import CliRunner

import omnitts
from omnitts.cli import app

runner = CliRunner()


def _manifest(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n" for r in rows),
                    encoding="utf-8")
    return path


def test_synth_writes_playable_24khz_wavs_and_codes(ckpt_dir, tmp_path):
    manifest = _manifest(tmp_path / "m.jsonl", [
        {"id": "a", "text": "First line.", "language": "english", "speaker": "ryan"},
        {"id": "b", "text": "Second line.", "speaker": "Vivian", "seed": 5},
    ])
    out = tmp_path / "out"
    result = runner.invoke(app, ["synth", str(manifest), "--model", str(ckpt_dir("custom_voice")), "--out", str(out),
                                 "--greedy", "--max-frames", "6", "--save-codes", "--quiet"])
    assert result.exit_code == 0, result.output
    for name in ("a", "b"):
        audio, rate = sf.read(out / f"{name}.wav")
        assert rate == 24000 and audio.shape == (6 * 1920,)
        codes = np.load(out / f"{name}.codes.npy")
        assert codes.dtype == np.int64 and codes.shape == (6, 16)
    assert not list(out.glob(".*.tmp"))


def test_voice_clone_manifest_resolves_relative_ref_audio(ckpt_dir, tmp_path, ref_wav):
    (tmp_path / "refs").mkdir()
    (tmp_path / "refs" / "r.wav").write_bytes(ref_wav.read_bytes())
    omnitts.load(ckpt_dir("base")).clone_voice(ref_wav, "Reference words.").save(tmp_path / "refs" / "v.safetensors")
    manifest = _manifest(tmp_path / "m.jsonl", [
        {"id": "icl", "text": "Clone me.", "ref_audio": "refs/r.wav", "ref_text": "Reference words."},
        {"id": "xvec", "text": "Clone me.", "ref_audio": "refs/r.wav", "x_vector_only": True},
        {"id": "saved", "text": "Clone me.", "voice": "refs/v.safetensors"},  # a saved voice's path too
    ])
    result = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("base")), "-o", str(tmp_path / "o"),
                                 "--greedy", "--max-frames", "5", "-q"])
    assert result.exit_code == 0, result.output
    assert sf.info(tmp_path / "o" / "xvec.wav").frames == 5 * 1920 and (tmp_path / "o" / "saved.wav").is_file()


def test_bad_lines_are_reported_recorded_and_the_rest_runs(ckpt_dir, tmp_path):
    manifest = _manifest(tmp_path / "m.jsonl", [
        {"id": "ok", "text": "Fine.", "speaker": "ryan"},
        "{not json",
        {"id": "spk", "text": "Hi.", "speaker": "bob"},
        {"id": "lang", "text": "Hi.", "speaker": "ryan", "language": "elvish"},
        {"id": "ok", "text": "Duplicate id.", "speaker": "ryan"},
        {"id": "../evil", "text": "Hi.", "speaker": "ryan"},
        {"id": "extra", "text": "Hi.", "speaker": "ryan", "volume": 3},
        {"id": "clone", "text": "Hi.", "speaker": "ryan", "ref_audio": "missing.wav"},
        {"text": "No id.", "speaker": "ryan"},
    ])
    out = tmp_path / "out"
    args = ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(out), "--max-frames", "4", "-q"]
    result = runner.invoke(app, args)
    assert result.exit_code == 1  # some items failed
    text = result.output
    for line, needle in [(2, "malformed JSON"), (3, "speaker: 'bob' is not known"), (4, "language: 'elvish'"),
                         (5, "id: 'ok' already used on line 1"), (6, "id: '../evil' is not a safe file name"),
                         (7, "volume: unknown field"), (8, "ref_audio: file not found"), (9, "id: missing")]:
        assert f"m.jsonl:{line}: {needle}" in text, (line, text)
    assert sf.info(out / "ok.wav").frames == 4 * 1920  # the good line still ran
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert {r["id"]: r["status"] for r in records} == {
        "ok": "ok", "line:2": "error", "spk": "error", "lang": "error", "line:5": "error", "line:6": "error",
        "extra": "error", "clone": "error", "line:9": "error"}
    assert not (out / "spk.wav").exists()
    # --strict stops before synthesis; a re-run skips what is done and does not repeat error lines.
    strict = runner.invoke(app, args + ["--strict"])
    assert strict.exit_code == 2 and len((out / "results.jsonl").read_text().splitlines()) == len(records)


def test_a_manifest_that_changes_during_the_run_says_so_and_exits_1(ckpt_dir, tmp_path, monkeypatch):
    """Lines appended to the manifest while synth ran: a good one was run, a bad one was neither reported nor
    recorded (pass 1 had not seen it), and the run ended "1 done", exit 0, as if every line had audio. It says the
    manifest changed and exits 1; the same command then reports and records the bad line."""
    from omnitts.batch.outdir import Batch

    manifest = _manifest(tmp_path / "m.jsonl", [{"id": "a", "text": "Hi.", "speaker": "ryan"}])
    real = Batch.save

    def save(self, outcome):
        with open(manifest, "a", encoding="utf-8") as handle:  # the first item done: a producer appends two lines
            handle.write(json.dumps({"id": "late", "text": "Hi.", "speaker": "ryan"}) + "\n")
            handle.write(json.dumps({"id": "wrong", "text": "Hi.", "speaker": "nobody"}) + "\n")
        monkeypatch.setattr(Batch, "save", real)
        return real(self, outcome)

    monkeypatch.setattr(Batch, "save", save)
    out = tmp_path / "out"
    args = ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(out), "--max-frames", "3", "-q"]
    ran = runner.invoke(app, args)
    assert ran.exit_code == 1, ran.output
    assert (f"error: {manifest} changed while the run read it: its lines as they are now were not all checked (a "
            "bad line added or edited since the run began is neither reported nor recorded); run the same command "
            "again to check and finish them") in ran.output
    again = runner.invoke(app, args)
    assert again.exit_code == 1 and f"error: {manifest}:3: speaker: " in again.output  # now reported, recorded
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert sorted((r["id"], r["status"]) for r in records) == [("a", "ok"), ("late", "ok"), ("wrong", "error")]


def test_rerun_resumes_without_duplicates_and_redoes_broken_files(ckpt_dir, tmp_path):
    """A damaged output is not done: it runs again, and the summary says why, as for a changed line."""
    rows = [{"id": f"u{i}", "text": f"Utterance number {i}.", "speaker": "ryan"} for i in range(3)]
    manifest = _manifest(tmp_path / "m.jsonl", rows)
    out = tmp_path / "out"
    args = ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(out), "--max-frames", "3", "-q"]
    assert runner.invoke(app, args).exit_code == 0
    (out / "u1.wav").write_bytes(b"truncated")
    (out / ".u2.wav.omnitts-abc12345.tmp").write_bytes(b"leftover")  # a kill's leftover temporary file
    damaged = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert damaged.exit_code == 0, damaged.output
    assert "1 item run again: its file damaged or missing (each file replaced)" in damaged.output, damaged.output
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == ["u0", "u1", "u2", "u1"]
    assert sf.info(out / "u1.wav").frames == 3 * 1920
    assert not list(out.glob(".*.tmp"))
    (out / "u0.wav").unlink()
    _manifest(manifest, [rows[0], {**rows[1], "text": "Changed."}, {**rows[2], "text": "Changed too."}])
    both = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert both.exit_code == 0, both.output
    assert ("3 items run again: 2 with the line or the options changed since the earlier run, 1 with the file "
            "damaged or missing (each file replaced)") in both.output, both.output


def test_mode_the_checkpoint_cannot_do(ckpt_dir, tmp_path):
    manifest = _manifest(tmp_path / "m.jsonl", [{"id": "x", "text": "Hi.", "instruct": "Loud.", "speaker": "ryan"}])
    result = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(tmp_path / "o")])
    assert result.exit_code == 2  # nothing left to run
    assert "m.jsonl:1: instruct: 0.6B CustomVoice checkpoints take no instruction" in result.output


def test_missing_checkpoint_file_is_one_line(ckpt_dir, tmp_path):
    import shutil

    ckpt = tmp_path / "ckpt"
    shutil.copytree(ckpt_dir("custom_voice"), ckpt)
    (ckpt / "model.safetensors").unlink()
    manifest = _manifest(tmp_path / "m.jsonl", [{"id": "x", "text": "Hi.", "speaker": "ryan"}])
    result = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt), "-o", str(tmp_path / "o"), "-q"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1].startswith("error: ")
    assert "model.safetensors: file not found" in result.output


def test_info_lists_speakers(ckpt_dir):
    result = runner.invoke(app, ["info", str(ckpt_dir("custom_voice"))])
    assert result.exit_code == 0 and "ryan" in result.output and "custom_voice" in result.output


def test_info_json_is_what_the_library_describes(ckpt_dir):
    import omnitts

    model = ckpt_dir("custom_voice")
    result = runner.invoke(app, ["info", "--json", str(model)])
    assert result.exit_code == 0, result.output
    described = json.loads(result.output)  # one object, nothing else on stdout
    assert described == json.loads(json.dumps({**omnitts.load(model).info(), "path": str(model)}))
    assert described["kind"] == "custom_voice" and "ryan" in described["speakers"]
    missing = runner.invoke(app, ["info", "--json", str(model / "nope")])
    assert missing.exit_code == 2 and missing.output.startswith("error: ")


@pytest.mark.parametrize("inside", ["", "speech_tokenizer"])
def test_out_that_is_the_checkpoint_is_refused_before_anything_is_written(ckpt_dir, tmp_path, inside):
    """-o and -m mixed up: the audio and results.jsonl were written among the checkpoint's weights."""
    import shutil

    model = tmp_path / "ckpt"
    shutil.copytree(ckpt_dir("custom_voice"), model)
    before = sorted(p.relative_to(model) for p in model.rglob("*"))
    manifest = _manifest(tmp_path / "m.jsonl", [{"id": "a", "text": "Hi.", "speaker": "ryan"}])
    out = model / inside if inside else tmp_path / "." / "ckpt"
    result = runner.invoke(app, ["synth", str(manifest), "-m", str(model), "-o", str(out)], env={"COLUMNS": "200"})
    what = "the checkpoint directory" if not inside else f"the codec folder of checkpoint {model}"
    assert result.exit_code == 2 and result.output == (
        f"error: --out {out}: is {what}; write the outputs to a folder of their own\n"), result.output
    assert sorted(p.relative_to(model) for p in model.rglob("*")) == before
    elsewhere = runner.invoke(app, ["synth", str(manifest), "-m", str(model), "-o", str(model / "samples"), "-q",
                                    "--max-frames", "3"])
    assert elsewhere.exit_code == 0 and (model / "samples" / "a.wav").is_file(), elsewhere.output  # its own folder


def test_max_seconds_field_sets_the_budget(ckpt_dir, tmp_path):
    manifest = _manifest(tmp_path / "m.jsonl", [
        {"id": "short", "text": "A line with a time limit.", "speaker": "ryan", "max_seconds": 0.4},
        {"id": "bad", "text": "Negative.", "speaker": "ryan", "max_seconds": -1},
    ])
    out = tmp_path / "out"
    result = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(out), "-q"])
    assert result.exit_code == 1 and "m.jsonl:2: max_seconds: must be > 0" in result.output
    record = json.loads((out / "results.jsonl").read_text().splitlines()[-1])
    assert record["id"] == "short" and record["frames"] == 5 and record["finish_reason"] == "length"


def test_flac_and_ogg_outputs(ckpt_dir, tmp_path):
    manifest = _manifest(tmp_path / "m.jsonl", [{"id": "x", "text": "Compressed output.", "speaker": "ryan"}])
    for fmt, given in (("flac", "flac"), ("ogg", "ogg"), ("flac", "FLAC"), ("ogg", ".ogg")):
        out = tmp_path / given
        result = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(out),
                                     "--max-frames", "4", "--format", given, "-q"])
        assert result.exit_code == 0, result.output
        info = sf.info(out / f"x.{fmt}")
        assert info.samplerate == 24000 and info.frames == 4 * 1920
        assert json.loads((out / "results.jsonl").read_text())["path"] == f"x.{fmt}"
    bad = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(tmp_path / "m"),
                              "--format", "mp3"])
    assert bad.exit_code == 2 and "--format 'mp3': choose wav, flac or ogg" in bad.output


def test_bad_codec_dtype_stops_before_loading(ckpt_dir, tmp_path):
    manifest = _manifest(tmp_path / "m.jsonl", [{"id": "x", "text": "Hi.", "speaker": "ryan"}])
    bad = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(tmp_path / "o"),
                              "--codec-dtype", "float16"])
    assert bad.exit_code == 2 and "--codec-dtype 'float16': choose float32 or bfloat16" in bad.output
    assert not (tmp_path / "o").exists()


# -- the command line itself: version, help, option checks, closing lines ------------------------------------------

def _no_load(monkeypatch):
    """Make loading a checkpoint fail the test: these checks must come before it."""
    import omnitts.api

    def load(*args, **kwargs):
        raise AssertionError("the checkpoint was loaded")

    monkeypatch.setattr(omnitts.api, "load", load)


def test_version():
    from omnitts import __version__

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.startswith(f"omnitts {__version__} (torch ")


@pytest.mark.parametrize("args, missing", [
    (["synth"], "argument 'MANIFEST'"), (["synth", "m.jsonl"], "option '--model' / '-m'"),
    (["synth", "m.jsonl", "-m", "ckpt"], "option '--out' / '-o'"), (["validate"], "argument 'MANIFEST'"),
    (["info"], "argument 'MODEL'"), (["voice-clone", "--ref-audio", "r.wav"], "option '--model' / '-m'")])
def test_a_missing_required_argument_is_a_usage_error(args, missing):
    """Typer before 0.18 with click 8.3+ let a required value go missing: `synth m.jsonl -m ckpt` ran on with
    `--out` None into a TypeError traceback (pyproject.toml's typer floor)."""
    result = runner.invoke(app, args, terminal_width=200)
    assert result.exit_code == 2 and f"Missing {missing}." in result.output, result.output


@pytest.mark.parametrize("command", [[], ["synth"], ["validate"], ["info"], ["demo"], ["voice-clone"]])
def test_help_reads_well_at_80_columns(command):
    result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) == 80  # the boxes span the width: the width was 80
    assert "…" not in result.output  # nothing cut short (an option name was "--official-token…")
    assert "<bool>" not in result.output  # flags take no value
    assert "[default: None]" not in result.output  # typer 0.16 with click 8.3+ printed it for unset options
    if command == ["synth"]:
        assert len(lines) < 100  # was 157, with a help column 13 characters wide
        panels = [line.strip("╭─ ").split(" ")[0] for line in lines if line.startswith("╭─ ")]
        assert panels == ["Arguments", "Options", "Input", "Decoding", "Engine", "Output"]
    if command == ["voice-clone"]:  # one text, no items: synth's help for --seed and --max-frames spoke of items
        text = " ".join(result.output.split())
        assert "Frame budget of --text" in text and "Seed of --text" in text and "item" not in text, text


def test_validate_help_documents_the_exit_codes_it_gives(ckpt_dir, tmp_path):
    """The help said "0 if every line is good, 1 otherwise", yet a manifest it cannot read exits 2."""
    shown = " ".join(runner.invoke(app, ["validate", "--help"], terminal_width=200).output.replace("│", " ").split())
    assert "Exit code 0 if every line is good, 1 otherwise; 2 when the manifest cannot be read" in shown, shown
    (tmp_path / "folder").mkdir()
    result = runner.invoke(app, ["validate", str(tmp_path / "folder"), "-m", str(ckpt_dir("custom_voice"))])
    assert result.exit_code == 2 and result.output.startswith(f"error: {tmp_path / 'folder'}: a folder but not"), \
        result.output


def test_every_option_sits_in_a_panel():
    import typer.main

    group = typer.main.get_command(app)
    for name, command in group.commands.items():
        for param in command.params:
            if param.param_type_name == "option":
                assert getattr(param, "rich_help_panel", None) in ("Input", "Decoding", "Engine", "Output"), \
                    (name, param.opts)


def test_on_off_flags(ckpt_dir, tmp_path, monkeypatch):
    import omnitts.batch.settings

    seen, real = [], omnitts.batch.settings.Settings
    monkeypatch.setattr(omnitts.batch.settings, "Settings", lambda **kw: seen.append(kw["greedy"]) or real(**kw))
    manifest = _manifest(tmp_path / "m.jsonl", [{"id": "a", "text": "Hi.", "speaker": "bob"}])  # stops: --strict
    base = ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(tmp_path / "o"), "--strict"]
    for flags in (["--greedy"], ["--no-greedy"], [], ["--greedy", "--no-greedy"]):
        assert runner.invoke(app, base + flags).exit_code == 2
    assert seen == [True, False, False, False]
    value = runner.invoke(app, base + ["--greedy", "true"])
    assert value.exit_code == 2 and "unexpected extra argument" in value.output  # a flag takes no value


@pytest.mark.parametrize("flag, value, message", [
    ("--dtype", "float64", "--dtype 'float64': choose auto, float32, bfloat16 or float16"),
    ("--device", "tpu", "--device 'tpu': choose cpu, cuda or npu"),
    ("--codec-dtype", "float16", "--codec-dtype 'float16': choose float32 or bfloat16"),
    ("--format", "mp3", "--format 'mp3': choose wav, flac or ogg"),
    ("--loudness", "6", "--loudness 6: choose a level from -70 to 0 LUFS (e.g. -23 or -16)"),
])
def test_every_option_is_checked_before_the_checkpoint_loads(ckpt_dir, tmp_path, monkeypatch, flag, value, message):
    _no_load(monkeypatch)
    manifest = _manifest(tmp_path / "m.jsonl", [{"id": "a", "text": "Hi.", "speaker": "ryan"}])
    result = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o",
                                 str(tmp_path / "o"), flag, value])
    assert result.exit_code == 2 and result.output.strip() == f"error: {message}", result.output
    assert not (tmp_path / "o").exists()
    if flag in ("--dtype", "--device", "--codec-dtype", "--format"):
        clone = runner.invoke(app, ["voice-clone", "-m", str(ckpt_dir("base")), "--ref-audio", "r.wav",
                                    "--x-vector-only", "--save", str(tmp_path / "v.safetensors"), flag, value])
        assert clone.exit_code == 2 and clone.output.strip() == f"error: {message}", clone.output


@pytest.mark.parametrize("device, visible", [("cuda:1", "CUDA_VISIBLE_DEVICES=1"), ("npu:0", "ASCEND_RT_VISIBLE_DEVICES=0")])
def test_a_device_with_an_index_says_how_to_pick_that_device(ckpt_dir, tmp_path, monkeypatch, device, visible):
    """`--device cuda:1` (torch's name of one device) read "choose cpu, cuda or npu", naming no way to run on
    device 1; `omnitts.load(device="cuda:1")` says how. The commands say it too: --devices (synth) or the variable."""
    _no_load(monkeypatch)
    manifest = _manifest(tmp_path / "m.jsonl", [{"id": "a", "text": "Hi.", "speaker": "ryan"}])
    kind = device.partition(":")[0]
    result = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o",
                                 str(tmp_path / "o"), "--device", device])
    assert result.exit_code == 2 and result.output.strip() == (
        f"error: --device {device!r}: give the kind, {kind!r}; to run on device {device[-1]}: --devices {device}, "
        f"or {visible} before the command with --device {kind}"), result.output
    clone = runner.invoke(app, ["voice-clone", "-m", str(ckpt_dir("base")), "--ref-audio", "r.wav", "--x-vector-only",
                                "--save", str(tmp_path / "v.safetensors"), "--device", device])
    assert clone.exit_code == 2 and clone.output.strip() == (
        f"error: --device {device!r}: give the kind, {kind!r}; to run on device {device[-1]}: "
        f"{visible} before the command with --device {kind}"), clone.output
    assert not (tmp_path / "o").exists()


def test_device_and_dtype_names_are_read_in_any_case_as_format_is(ckpt_dir, tmp_path, monkeypatch):
    """`--device CPU` and `--dtype FLOAT32` were refused ("choose cpu, cuda or npu") while `--format WAV` was
    taken: the names are read in lower case, so the engine gets exactly the settings the lower-case flags give."""
    import omnitts.api

    seen = []

    def load(path, **kwargs):
        seen.append({k: kwargs.get(k) for k in ("device", "dtype", "codec_dtype")})
        raise omnitts.api.OmniTTSError("stop here")

    monkeypatch.setattr(omnitts.api, "load", load)
    manifest = _manifest(tmp_path / "m.jsonl", [{"id": "a", "text": "Hi.", "speaker": "ryan"}])
    base = ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(tmp_path / "o")]
    for flags in (["--device", "CPU", "--dtype", "FLOAT32", "--codec-dtype", "BFloat16"],
                  ["--device", "cpu", "--dtype", "float32", "--codec-dtype", "bfloat16"]):
        runner.invoke(app, base + flags)
    assert seen == [dict(device="cpu", dtype="float32", codec_dtype="bfloat16")] * 2, seen
    many = runner.invoke(app, base + ["--devices", "CPU,Cpu", "--workers", "3"])
    assert many.exit_code == 2 and "--devices 'cpu,cpu' (2 devices) disagree" in many.output, many.output
    one = runner.invoke(app, base + ["--devices", "cpu", "--workers", "2"])
    assert one.exit_code == 2 and "--devices 'cpu' (1 device) disagree" in one.output, one.output


@pytest.mark.parametrize("flag, value", [("--retry-runaway", "11"), ("--retry-runaway", "-1"), ("--max-batch", "0"),
                                         ("--max-frames", "0"), ("--split-chars", "-1")])
def test_numbers_out_of_range_are_refused_before_the_checkpoint_loads(ckpt_dir, tmp_path, monkeypatch, flag, value):
    _no_load(monkeypatch)
    manifest = _manifest(tmp_path / "m.jsonl", [{"id": "a", "text": "Hi.", "speaker": "ryan"}])
    result = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o",
                                 str(tmp_path / "o"), flag, value])
    assert result.exit_code == 2 and f"Invalid value for '{flag}'" in result.output, result.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("flags, message", [
    (["--greedy"], "--retry-runaway 2 retries sampled items with new seeds; under --greedy a retry gives the same "
                   "audio (drop one of them)"),
    (["--max-frames", "25"], "--retry-runaway 2 retries items that ran out of the budget derived from their text; "
                             "--max-frames gives every item its own budget, so none would be (drop one of them)"),
])
def test_retry_runaway_where_it_would_retry_nothing_is_refused(ckpt_dir, tmp_path, monkeypatch, flags, message):
    """`--retry-runaway 2 --greedy` (or with --max-frames) ran without a word and retried nothing."""
    _no_load(monkeypatch)
    manifest = _manifest(tmp_path / "m.jsonl", [{"id": "a", "text": "Hi.", "speaker": "ryan"}])
    result = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o",
                                 str(tmp_path / "o"), "--retry-runaway", "2", *flags], env={"COLUMNS": "300"})
    assert result.exit_code == 2 and result.output.strip() == f"error: {message}", result.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("case", ["ref_audio", "other_format", "manifest", "another_shard", "link"])
def test_an_item_named_like_a_file_it_reads_in_out_is_refused(ckpt_dir, ref_wav, tmp_path, monkeypatch, case):
    """The manifest's folder as OUT, with id "alice" and "ref_audio": "alice.wav": the item's audio replaced the
    reference clip (deleted it under --format flac, as an earlier format's file); a manifest named m.wav with an
    id "m" was replaced by that item's audio. Refused before anything loads, every file as it was. A clip in OUT
    that is a symbolic link to one elsewhere was missed (its target is not in OUT), and the item's audio replaced
    the link: a later line reading it cloned that audio, and a re-run failed on it."""
    import shutil

    _no_load(monkeypatch)
    out = tmp_path / "voices"
    out.mkdir()
    if case == "link":
        shutil.copy(ref_wav, tmp_path / "clip.wav")
        (out / "alice.wav").symlink_to(tmp_path / "clip.wav")
    else:
        shutil.copy(ref_wav, out / "alice.wav")
    line = {"id": "alice", "text": "Hi.", "ref_audio": "alice.wav", "x_vector_only": True}
    lines, name, what = [line], "alice.wav", f"the ref_audio of {out / 'm.jsonl'}:1"
    if case == "another_shard":  # the line reading it runs in another process: this one must not replace it
        lines = [{"id": "bob", "text": "Hi.", "ref_audio": "alice.wav", "x_vector_only": True},
                 {"id": "alice", "text": "Hi.", "ref_audio": str(ref_wav), "x_vector_only": True}]
    manifest = _manifest(out / ("alice.wav" if case == "manifest" else "m.jsonl"),
                         [{"id": "alice", "text": "Hi.", "ref_audio": str(ref_wav), "x_vector_only": True}]
                         if case == "manifest" else lines)
    if case == "manifest":
        what = "the manifest"
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    args = ["synth", str(manifest), "-m", str(ckpt_dir("base")), "-o", str(out), "--max-frames", "2"]
    args += {"other_format": ["--format", "flac"], "another_shard": ["--shard", "1/2"]}.get(case, [])
    if case == "another_shard":
        from omnitts.batch.shard import in_shard

        assert in_shard("alice", 1, 2) and not in_shard("bob", 1, 2)
    result = runner.invoke(app, args, env={"COLUMNS": "400"})
    assert result.exit_code == 2, result.output
    assert result.output == (f"error: --out {out}: {what}, {out / name}, is named as item 'alice''s output, which "
                             "the run replaces (or deletes, under another --format); choose another --out (or rename "
                             "the id or the file)\n"), result.output
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert (out / "alice.wav").is_symlink() == (case == "link")


def test_a_refused_out_records_no_bad_line_in_it(ckpt_dir, ref_wav, tmp_path, monkeypatch):
    """A bad line before the clash was recorded as pass 1 met it: the refused run left a results.jsonl in the
    user's folder (and made OUT, when it was new). Bad lines are recorded once OUT passed its checks."""
    import shutil

    _no_load(monkeypatch)
    out = tmp_path / "voices"
    out.mkdir()
    shutil.copy(ref_wav, out / "alice.wav")
    manifest = _manifest(out / "m.jsonl", [{"id": "bad", "text": " "},
                                           {"id": "alice", "text": "Hi.", "ref_audio": "alice.wav",
                                            "x_vector_only": True}])
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    result = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("base")), "-o", str(out)])
    assert result.exit_code == 2 and "is named as item 'alice''s output" in result.output, result.output
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    _manifest(manifest, [{"id": "bad", "text": " "}, {"id": "alice", "text": "Hi.", "ref_audio": str(ref_wav),
                                                       "x_vector_only": True}])
    result = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("base")), "-o", str(tmp_path / "o")])
    assert [json.loads(line)["id"] for line in (tmp_path / "o" / "results.jsonl").read_text().splitlines()] == [
        "bad"], result.output  # a usable OUT: the bad line recorded before the model loads


def test_strict_and_all_bad_manifests_end_with_a_closing_line(ckpt_dir, tmp_path, monkeypatch):
    _no_load(monkeypatch)
    manifest = _manifest(tmp_path / "m.jsonl", [{"id": "a", "text": "Hi.", "speaker": "ryan"},
                                                {"id": "b", "text": "Hi.", "speaker": "bob"}])
    args = ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(tmp_path / "o")]
    result = runner.invoke(app, args + ["--strict"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == (
        f"error: --strict: 1 bad line in {manifest}; nothing was synthesized (fix it, or drop --strict to run "
        "the 1 good line)")
    _manifest(manifest, [{"id": "b", "text": "Hi.", "speaker": "bob"}])
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    last = result.output.strip().splitlines()[-1]
    assert last == f"error: {manifest}: no good lines (1 bad line); nothing to synthesize"


def test_rerun_says_why_items_were_skipped_and_force_redoes_them(ckpt_dir, tmp_path):
    manifest = _manifest(tmp_path / "m.jsonl", [{"id": f"u{i}", "text": f"Line {i}.", "speaker": "ryan"}
                                                for i in range(2)])
    out = tmp_path / "out"
    args = ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(out), "--max-frames", "3", "-q"]
    assert runner.invoke(app, args).exit_code == 0
    again = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert again.exit_code == 0
    assert f"2 items already done in {out}: skipped (--force redoes them)" in again.output
    assert "0.00x realtime" not in again.output and "loading checkpoint" not in again.output
    (out / "u0.wav").write_bytes(b"")  # --force must not depend on the file looking broken
    before = (out / "u1.wav").stat().st_mtime_ns
    forced = runner.invoke(app, args + ["--force"], env={"COLUMNS": "200"})
    assert forced.exit_code == 0, forced.output
    assert "already done" not in forced.output
    assert sf.info(out / "u0.wav").frames == 3 * 1920 and (out / "u1.wav").stat().st_mtime_ns != before
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == ["u0", "u1", "u0", "u1"] and all(r["status"] == "ok" for r in records)


def test_a_rerun_with_earlier_failures_still_exits_1_and_says_how_to_retry(ckpt_dir, tmp_path, monkeypatch):
    """Issue 36: a re-run skipped the failed items, printed "0 failed, 1 skipped" and exited 0."""
    sf.write(tmp_path / "silent.wav", np.zeros(24000, dtype=np.float32), 24000)  # fails when it runs
    # ... and only then: the manifest check passes it, as a clip replaced after the check would pass
    monkeypatch.setattr("omnitts.batch.manifest._audio_problem",
                        lambda path, icl=True: None if "silent" in path else "file not found")
    manifest = _manifest(tmp_path / "m.jsonl", [
        {"id": "ok", "text": "Fine.", "ref_audio": "silent.wav", "x_vector_only": True},
        {"id": "bad", "text": "Bad line.", "ref_audio": "missing.wav", "x_vector_only": True},
    ])
    out = tmp_path / "out"
    args = ["synth", str(manifest), "-m", str(ckpt_dir("base")), "-o", str(out), "--max-frames", "3", "-q"]
    first = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert first.exit_code == 1 and "error: ok: ref_audio: " in first.output, first.output  # the field named
    assert f"{tmp_path}/silent.wav: reference audio is silent" in first.output, first.output
    # The bad line is "fixed" (a changed line runs by itself, and fails: its clip is silent too); the
    # unchanged failure is not run again: neither has audio, so the run exits 1 and says how to retry.
    _manifest(manifest, [
        {"id": "ok", "text": "Fine.", "ref_audio": "silent.wav", "x_vector_only": True},
        {"id": "bad", "text": "Bad line.", "ref_audio": "silent.wav", "x_vector_only": True},
    ])
    again = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert again.exit_code == 1, again.output
    assert "error: bad: " in again.output and "error: ok: " not in again.output
    assert "1 item run again: its line or the options changed since the earlier run" in again.output
    assert (f"1 item failed in an earlier run and still has no audio: --retry-failed runs it again (errors in "
            f"{out}/results.jsonl)") in again.output
    assert not (out / "ok.wav").exists() and not (out / "bad.wav").exists()
    retried = runner.invoke(app, args + ["--retry-failed"], env={"COLUMNS": "200"})
    assert retried.exit_code == 1 and "failed in an earlier run" not in retried.output
    assert "run again" not in retried.output, retried.output  # failures tried again as they were: not "changed"
    assert retried.output.count("reference audio is silent") >= 2  # both ran again (and failed again)


def test_info_reports_the_size_its_shapes_have(ckpt_dir):
    result = runner.invoke(app, ["info", str(ckpt_dir("custom_voice"))], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if " size " in line)
    assert "tiny (its config says 0.6B, which sets its behaviour)" in row, row


def test_size_from_shapes_rule():
    from omnitts.info import size_from_shapes

    def shapes(hidden, layers, ffn, text_hidden=2048):
        talker = {"talker.model.codec_embedding.weight": [3072, hidden],
                  "talker.model.text_embedding.weight": [151936, text_hidden]}
        for i in range(layers):
            talker[f"talker.model.layers.{i}.mlp.gate_proj.weight"] = [ffn, hidden]
            talker[f"talker.model.layers.{i}.input_layernorm.weight"] = [hidden]
        return talker

    assert size_from_shapes(shapes(1024, 28, 3072)) == "0.6B"
    assert size_from_shapes(shapes(2048, 28, 6144)) == "1.7B"
    assert size_from_shapes(shapes(2048, 24, 6144)) == "custom"  # not a published shape, 0.3B+ parameters
    assert size_from_shapes(shapes(64, 2, 128, text_hidden=32)) == "tiny"


def test_demo_help_names_the_checkpoint_folders_it_builds():
    """`demo --help` gave `.cache/demo-tiny-KIND` beside KIND's custom_voice spelling, a folder the demo never
    makes: it builds .cache/demo-tiny-customvoice (no underscore), which the README's examples name."""
    result = runner.invoke(app, ["demo", "--help"], env={"COLUMNS": "200"}, terminal_width=200)
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert ".cache/demo-tiny-customvoice" in text and "demo-tiny-KIND" not in text, text


def test_demo_kinds_write_to_their_own_folders(tmp_path, monkeypatch):
    import omnitts.cli
    import omnitts.testing.checkpoint

    calls = []
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(omnitts.testing.checkpoint, "build_checkpoint",
                        lambda path, **kw: (path.mkdir(parents=True), calls.append(("build", path))))
    monkeypatch.setattr(omnitts.cli, "synth", lambda **kw: calls.append((kw["out"], kw["force"])))
    for kind, extra in (("custom_voice", []), ("base", ["--force"])):
        result = runner.invoke(app, ["demo", "--kind", kind, *extra])
        assert result.exit_code == 0, result.output
    # each built beside its folder, renamed into place once complete
    assert calls == [("build", Path(".cache/.demo-tiny-customvoice.building")), (Path("out/demo-custom_voice"), False),
                     ("build", Path(".cache/.demo-tiny-base.building")), (Path("out/demo-base"), True)]
    assert sorted(p.name for p in (tmp_path / ".cache").iterdir()) == ["demo-tiny-base", "demo-tiny-customvoice"]
    assert (tmp_path / "out" / "demo-base" / "ref.wav").is_file()


def test_voice_clone_out_is_a_directory(ckpt_dir, tmp_path, monkeypatch):
    _no_load(monkeypatch)
    args = ["voice-clone", "-m", str(ckpt_dir("base")), "--ref-audio", "r.wav", "--x-vector-only", "--text", "Hi."]
    old = runner.invoke(app, args + ["-o", str(tmp_path / "hello.flac")])
    assert old.exit_code == 2
    assert old.output.strip() == (f"error: -o {tmp_path / 'hello.flac'}: -o is the output directory, as in synth; "
                                  f"write -o {tmp_path} --id hello --format flac")
    unsafe = runner.invoke(app, args + ["-o", str(tmp_path), "--id", "../up"])
    assert unsafe.exit_code == 2 and "--id: '../up' is not a safe file name" in unsafe.output
    # synth's too: `-o out/x.wav` made a folder named x.wav and ran the manifest into it
    manifest = _manifest(tmp_path / "m.jsonl", [{"id": "a", "text": "Hi.", "speaker": "ryan"}])
    synth = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o",
                                str(tmp_path / "x.wav")])
    assert synth.exit_code == 2 and synth.output.strip() == (
        f"error: --out {tmp_path / 'x.wav'}: --out is the output directory (OUT/ID.wav for each line), not a file; "
        "give a folder (one that exists already is taken whatever its name)")
    assert not (tmp_path / "x.wav").exists()
    (tmp_path / "x.wav").mkdir()  # an existing folder of that name is taken: the run goes on to the load
    taken = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o",
                                str(tmp_path / "x.wav"), "--max-frames", "2", "-q"])
    assert str(taken.exception) == "the checkpoint was loaded", taken.output


def test_info_and_validate_load_no_weights(ckpt_dir, tmp_path, monkeypatch):
    """`info` reads the config and safetensors headers, `validate` checks lines against the config: neither
    builds a model (a load would reach models.loader.load_strict, made to fail here)."""
    from omnitts.models import loader

    def no_load(*args, **kwargs):
        raise AssertionError("weights loaded")

    monkeypatch.setattr(loader, "load_strict", no_load)
    manifest = _manifest(tmp_path / "m.jsonl", [{"id": "a", "text": "Hi.", "speaker": "ryan"}])
    model = str(ckpt_dir("custom_voice"))
    for args in (["info", model], ["validate", str(manifest), "-m", model]):
        result = runner.invoke(app, args)
        assert result.exit_code == 0 and result.exception is None, (args, result.output)
    synth = runner.invoke(app, ["synth", str(manifest), "-m", model, "-o", str(tmp_path / "o")])
    assert isinstance(synth.exception, AssertionError)  # the check can fail: synth does load weights


def test_a_checkpoint_without_its_tokenizer_is_refused_by_validate_as_by_synth(ckpt_dir, tmp_path, monkeypatch):
    """validate read only the config: a checkpoint without merges.txt was "1 good", exit 0, where synth refused it,
    and synth itself refused it only after "loading checkpoint: ...". Both now say it before any weight loads."""
    import shutil

    from omnitts.models import loader

    def no_load(*args, **kwargs):
        raise AssertionError("weights loaded")

    monkeypatch.setattr(loader, "load_strict", no_load)
    copy = tmp_path / "ckpt"
    shutil.copytree(ckpt_dir("custom_voice"), copy)
    (copy / "merges.txt").unlink()
    manifest = _manifest(tmp_path / "m.jsonl", [{"id": "a", "text": "Hi.", "speaker": "ryan"}])
    expected = f"error: {copy / 'merges.txt'}: file not found (the text tokenizer is vocab.json + merges.txt"
    for args in (["validate", str(manifest), "-m", str(copy)],
                 ["synth", str(manifest), "-m", str(copy), "-o", str(tmp_path / "o")]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and result.exception is None or isinstance(result.exception, SystemExit), \
            result.output
        assert expected in result.output and "loading checkpoint" not in result.output, result.output
    assert not (tmp_path / "o").exists()


def test_a_bad_line_is_recorded_again_only_when_its_message_changes(ckpt_dir, tmp_path):
    good = {"id": "ok", "text": "Fine.", "speaker": "ryan"}
    args = ["synth", str(tmp_path / "m.jsonl"), "-m", str(ckpt_dir("custom_voice")), "-o", str(tmp_path / "o"),
            "--max-frames", "2", "-q"]
    errors = []
    for speaker in ("bob", "bob", "alice"):
        _manifest(tmp_path / "m.jsonl", [good, {"id": "bad", "text": "Hi.", "speaker": speaker}])
        assert runner.invoke(app, args).exit_code == 1
        records = [json.loads(line) for line in (tmp_path / "o" / "results.jsonl").read_text().splitlines()]
        errors.append([r["error"] for r in records if r["id"] == "bad"])
    assert [len(e) for e in errors] == [1, 1, 2] and "'alice'" in errors[2][1]
    assert [r["id"] for r in records].count("ok") == 1


def test_the_summary_lists_the_failed_ids(ckpt_dir, tmp_path):
    manifest = _manifest(tmp_path / "m.jsonl", [{"id": "ok", "text": "Fine.", "speaker": "ryan"},
                                                {"id": "spk", "text": "Hi.", "speaker": "bob"}])
    result = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(tmp_path / "o"),
                                 "--max-frames", "2"], env={"COLUMNS": "200"})
    assert result.exit_code == 1
    summary = result.output[result.output.index("omnitts synth ->"):]
    assert re.search(r"failed spk: .*speaker: 'bob' is not known", summary) and "failed ok" not in summary


def test_a_run_says_what_it_loads_with_auto_resolved(ckpt_dir, tmp_path):
    from omnitts.device.features import resolve_dtype

    manifest = _manifest(tmp_path / "m.jsonl", [{"id": "a", "text": "Fine.", "speaker": "ryan"}])
    args = ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(tmp_path / "o"), "--max-frames", "2"]
    auto = runner.invoke(app, args)
    assert auto.exit_code == 0, auto.output
    assert (f"loading checkpoint: cpu, {resolve_dtype('auto', 'cpu')} (auto), codec float32, max batch 8"
            in auto.output.splitlines()), auto.output
    pinned = runner.invoke(app, args + ["--force", "--dtype", "float32", "--max-batch", "3"])
    assert "loading checkpoint: cpu, float32, codec float32, max batch 3" in pinned.output.splitlines(), pinned.output


def test_quiet_prints_the_summary_alone(ckpt_dir, tmp_path):
    """No bar, no "loading" line and no blank line before the summary (rich 13.0, the oldest supported,
    ended even a disabled bar with a newline when the console was not a terminal)."""
    manifest = _manifest(tmp_path / "m.jsonl", [{"id": "a", "text": "Fine.", "speaker": "ryan"}])
    result = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(tmp_path / "o"),
                                 "--max-frames", "2", "-q"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0].strip().startswith("omnitts synth ->"), result.output  # the table's title
    assert "synthesizing" not in result.output and "loading" not in result.output


def test_synth_writes_into_out_and_nowhere_else(ckpt_dir, tmp_path, monkeypatch):
    """docs/outputs.md: `synth` writes everything into OUT: the manifest's folder and the working directory
    are left as they were (a bad line is recorded in OUT too)."""
    (tmp_path / "in").mkdir(), (tmp_path / "cwd").mkdir()
    manifest = _manifest(tmp_path / "in" / "m.jsonl", [{"id": "a", "text": "Hi.", "speaker": "ryan"},
                                                         {"id": "b", "text": "Hi.", "speaker": "bob"}])
    monkeypatch.chdir(tmp_path / "cwd")
    result = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")),
                                 "-o", str(tmp_path / "out"), "--max-frames", "2", "--save-codes", "-q"])
    assert result.exit_code == 1, result.output
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "cwd", "in", "in/m.jsonl", "out", "out/a.codes.npy", "out/a.wav", "out/results.jsonl"]


def test_the_case_probe_says_tmp_keeps_case_and_leaves_nothing(tmp_path, monkeypatch):
    """The probe behind case-insensitive duplicate ids: this machine's /tmp tells `Alice` from `alice`, and
    no probe file (nor a folder made for it) stays behind, even when the probe fails."""
    from omnitts.batch import folder

    assert folder.folds_case(tmp_path) is False
    assert list(tmp_path.iterdir()) == []
    assert folder.case_folding(tmp_path / "new" / "out") is None  # --strict: before Batch makes OUT
    assert list(tmp_path.iterdir()) == []

    def broken(a, b):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(folder.os.path, "samefile", broken)
    with pytest.raises(PermissionError):
        folder.folds_case(tmp_path)
    with pytest.raises(folder.OutDirError, match="cannot be written"):
        folder.case_folding(tmp_path / "new")
    assert list(tmp_path.iterdir()) == []


def _alice_twice(ckpt_dir, tmp_path):
    manifest = _manifest(tmp_path / "m.jsonl", [{"id": "Alice", "text": "First.", "speaker": "ryan"},
                                                {"id": "alice", "text": "Second.", "speaker": "ryan"}])
    return manifest, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(tmp_path / "out"),
                      "--max-frames", "2", "-q"]


@pytest.mark.parametrize("workers", [[], ["--workers", "2"]], ids=["one-process", "workers"])
def test_ids_alike_but_for_case_are_duplicates_where_the_filesystem_folds_case(ckpt_dir, tmp_path, monkeypatch,
                                                                              workers):
    """On a case-insensitive OUT (macOS, Windows, vfat, SMB) `alice` would overwrite `Alice.wav`: it is a bad
    line naming the line it collides with, and one file is written, by the normal run and by --strict alike.
    Workers (spawned: the patched probe is not theirs) take the parent's answer."""
    from omnitts.batch import folder

    monkeypatch.setattr(folder, "folds_case", lambda path: True)
    manifest, args = _alice_twice(ckpt_dir, tmp_path)
    args += workers
    out = tmp_path / "out"
    message = (f"{manifest}:2: id: 'alice' names the same file as line 1's 'Alice' on this case-insensitive "
               f"filesystem ({out})")
    strict = runner.invoke(app, args + ["--strict"], env={"COLUMNS": "400"})
    assert strict.exit_code == 2 and f"error: {message}" in strict.output, strict.output
    assert not out.exists()  # --strict probed before OUT existed, and made nothing
    result = runner.invoke(app, args, env={"COLUMNS": "400"})
    assert result.exit_code == 1 and f"error: {message}" in result.output, result.output
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [(r["id"], r["status"], r["error"]) for r in records] == [("line:2", "error", message),
                                                                     ("Alice", "ok", None)]
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["Alice.wav", "results.jsonl"]


def test_ids_alike_but_for_case_both_run_where_the_filesystem_keeps_case(ckpt_dir, tmp_path):
    """On ext4 (this machine's /tmp) `Alice` and `alice` are two files, two items."""
    _, args = _alice_twice(ckpt_dir, tmp_path)
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    out = tmp_path / "out"
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert sorted((r["id"], r["status"]) for r in records) == [("Alice", "ok"), ("alice", "ok")]
    assert sorted(p.name for p in out.glob("*.wav")) == ["Alice.wav", "alice.wav"]


def test_path_options_take_a_tilde_the_shell_left(ckpt_dir, tmp_path, monkeypatch):
    """`--out=~/x` (and any quoted "~/...") reaches omnitts unexpanded: it made a folder named `~` in the current
    directory. Every path option reads `~` as the home folder, as the library does."""
    from omnitts.cache import cache_root

    monkeypatch.setenv("OMNITTS_CACHE_DIR", str(cache_root()))  # the kernels built already, under the real home
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir(), cwd.mkdir()
    (home / "ckpt").symlink_to(ckpt_dir("custom_voice"))
    (home / "m.jsonl").write_text(json.dumps({"id": "a", "text": "Hi.", "speaker": "ryan"}) + "\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    checked = runner.invoke(app, ["validate", "~/m.jsonl", "--model=~/ckpt"])
    assert checked.exit_code == 0 and "1 good, 0 bad" in checked.output, checked.output
    described = runner.invoke(app, ["info", "~/ckpt"])  # an argument, as the manifest is
    assert described.exit_code == 0 and "custom_voice" in described.output, described.output
    result = runner.invoke(app, ["synth", "~/m.jsonl", "--model=~/ckpt", "--out=~/out", "--max-frames", "2", "-q",
                                 "--export-dataset=~/ds"])
    assert result.exit_code == 0, result.output
    assert (home / "out" / "a.wav").is_file() and (home / "ds").is_dir() and list(cwd.iterdir()) == []


@pytest.mark.parametrize("args", [
    ["synth", "m.jsonl", "-m", "CKPT", "-o", ""], ["synth", "m.jsonl", "-m", "", "-o", "o"],
    ["synth", "", "-m", "CKPT", "-o", "o"], ["synth", "m.jsonl", "-m", "CKPT", "-o", "o", "--export-dataset", ""],
    ["validate", "m.jsonl", "-m", ""], ["info", ""], ["demo", "-o", ""], ["demo", "--model-dir", ""],
    ["voice-clone", "-m", "CKPT", "--ref-audio", "", "--x-vector-only", "--save", "v.safetensors"],
    ["voice-clone", "-m", "CKPT", "--ref-audio", "r.wav", "--x-vector-only", "--text", "Hi.", "-o", ""]])
def test_an_empty_path_is_refused_not_read_as_the_current_folder(ckpt_dir, tmp_path, monkeypatch, args):
    """`-o "$OUT"` with OUT unset: Path("") is ".", so synth wrote its audio and results.jsonl into the current
    folder (and demo and voice-clone theirs). Every path argument and option refuses an empty one."""
    _no_load(monkeypatch)
    _manifest(tmp_path / "m.jsonl", [{"id": "a", "text": "Hi.", "speaker": "ryan"}])
    monkeypatch.chdir(tmp_path)
    ckpt = str(ckpt_dir("base" if args[0] == "voice-clone" else "custom_voice"))
    result = runner.invoke(app, [ckpt if a == "CKPT" else a for a in args])
    assert result.exit_code == 2 and "an empty path" in result.output, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.jsonl"]


@pytest.mark.parametrize("args", [
    ["voice-clone", "-m", "CKPT", "--ref-audio", "https://example.com/a.wav", "--x-vector-only", "--save", "v.safetensors"],
    ["info", "https://huggingface.co/Qwen/Qwen3-TTS-12Hz-0.6B-Base"]])
def test_a_url_is_refused_naming_the_option_not_looked_for_as_a_file(ckpt_dir, tmp_path, monkeypatch, args):
    """`--ref-audio https://host/a.wav` (the official package downloads URLs) said "https:/host/a.wav: reference
    audio file not found", a path nobody gave. A URL is refused as the option's bad value: omnitts reads local files."""
    _no_load(monkeypatch)
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, [str(ckpt_dir("base")) if a == "CKPT" else a for a in args])
    words = " ".join(result.output.replace("│", " ").split())  # the error box wraps its lines
    assert result.exit_code == 2 and "is a URL; omnitts reads local files only" in words, result.output
    assert "file not found" not in words, result.output


def test_a_long_manifests_first_pass_shows_its_count_on_a_terminal_and_is_gone_after(tmp_path):
    """synth's first pass over a million lines was a minute of silence before "loading checkpoint"; on a terminal a
    transient line counts the lines read, from the first `every` on; a short manifest, -q or no terminal: nothing."""
    import io

    from rich.console import Console

    from omnitts.cli.display import Checking

    def shown(lines: int, quiet: bool = False, terminal: bool = True) -> str:
        screen = io.StringIO()
        with Checking("m.jsonl", quiet, every=100, console=Console(file=screen, force_terminal=terminal)) as checking:
            for _ in range(lines):
                checking.tick()
        return screen.getvalue()

    assert "checking m.jsonl: 200 lines" in shown(250)
    assert shown(250).endswith("\x1b[2K")  # transient: the line is erased when the pass ends
    assert shown(99) == "" and shown(250, quiet=True) == "" and shown(250, terminal=False) == ""
