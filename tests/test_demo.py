"""`omnitts demo --kind`: a tiny checkpoint of each kind, built and run end to end."""

from __future__ import annotations

import json

import pytest
import soundfile as sf
from typer.testing import CliRunner

from omnitts.cli import DEMO_LINES, app


@pytest.mark.parametrize("kind", ["voice_design", "base"])
def test_demo_runs_each_kind(tmp_path, kind):
    out, model = tmp_path / "out", tmp_path / "ckpt"
    result = CliRunner().invoke(app, ["demo", "--kind", kind, "-o", str(out), "--model-dir", str(model)])
    assert result.exit_code == 0, result.output
    assert json.loads((model / "config.json").read_text())["tts_model_type"] == kind
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in records if r["status"] == "ok") == sorted(line["id"] for line in DEMO_LINES[kind])
    assert all(sf.info(out / r["path"]).frames == 25 * 1920 for r in records)
    again = CliRunner().invoke(app, ["demo", "--kind", kind, "-o", str(out), "--model-dir", str(model)],
                               env={"COLUMNS": "200"})
    assert again.exit_code == 0, again.output  # a re-run says why nothing ran
    assert f"{len(DEMO_LINES[kind])} items already done in {out}: skipped (--force redoes them)" in again.output
    # Its folder given for another kind: the demo's lines would all fail on it; one line says so instead
    other = CliRunner().invoke(app, ["demo", "-o", str(tmp_path / "other"), "--model-dir", str(model)],
                               env={"COLUMNS": "200"})
    assert other.exit_code == 2 and other.output == (
        f"error: --model-dir {model}: holds a {kind} checkpoint, not custom_voice; pass --kind {kind}, or another "
        "--model-dir to build one\n"), other.output
    assert not (tmp_path / "other").exists()


def test_demo_quiet_prints_the_summary_alone(tmp_path):
    out, model = tmp_path / "out", tmp_path / "ckpt"
    loud = CliRunner().invoke(app, ["demo", "-o", str(out), "--model-dir", str(model)], env={"COLUMNS": "200"})
    assert loud.exit_code == 0 and "building tiny demo checkpoint" in loud.output, loud.output
    quiet = CliRunner().invoke(app, ["demo", "-q", "--force", "-o", str(tmp_path / "q"), "--model-dir",
                                     str(tmp_path / "m2")], env={"COLUMNS": "200"})
    assert quiet.exit_code == 0, quiet.output
    assert "building" not in quiet.output and "loading checkpoint" not in quiet.output, quiet.output
    assert quiet.output.count("realtime") == 1  # the closing summary, as synth -q prints it
    assert len((tmp_path / "q" / "results.jsonl").read_text().splitlines()) == len(DEMO_LINES["custom_voice"])


def test_demo_rejects_an_unknown_kind(tmp_path):
    result = CliRunner().invoke(app, ["demo", "--kind", "opera", "-o", str(tmp_path)])
    assert result.exit_code == 2 and "--kind 'opera': choose custom_voice, voice_design, base" in result.output


def test_demo_takes_a_kind_as_the_readme_names_it(tmp_path, monkeypatch):
    """`--kind Base` (the README's name for the kind) was refused: "choose custom_voice, voice_design, base"."""
    import omnitts.cli as cli

    ran = []
    monkeypatch.setattr(cli, "synth", lambda **kwargs: ran.append(kwargs["model"]))
    for given, kind in (("Base", "base"), ("CustomVoice", "custom_voice"), ("voice-design", "voice_design")):
        result = CliRunner().invoke(app, ["demo", "--kind", given, "-o", str(tmp_path / kind), "--model-dir",
                                          str(tmp_path / f"m-{kind}")])
        assert result.exit_code == 0, result.output
        assert json.loads((tmp_path / f"m-{kind}" / "config.json").read_text())["tts_model_type"] == kind


@pytest.mark.parametrize("option, path, problem", [
    ("-o", "file", "--out {file}: is a file, not a directory"),
    ("-o", "file/x", "--out {file}/x: {file} is a file, not a directory"),
    ("--model-dir", "file", "--model-dir {file}: is a file, not a directory"),
    ("--model-dir", "file/x", "--model-dir {file}/x: {file} is a file, not a directory"),
    ("--model-dir", "mine", "--model-dir {mine}: not empty and not a demo checkpoint; the demo builds its "
                            "checkpoint in a new or empty folder (choose another --model-dir)"),
    # -o and --model-dir the same folder: the checkpoint was built and demo.jsonl written into it, then synth refused
    ("-o", "ckpt", "--out {ckpt}: is the checkpoint directory; write the outputs to a folder of their own"),
])
def test_demo_refuses_an_unusable_out_or_model_dir_in_one_line(tmp_path, option, path, problem):
    """A file where a folder goes was a FileExistsError / NotADirectoryError traceback; a folder of the user's
    own files got its config.json overwritten by the demo's."""
    (tmp_path / "file").write_text("a file")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "config.json").write_text('{"mine": true}')
    (tmp_path / "mine" / "notes.txt").write_text("notes")
    defaults = {"-o": str(tmp_path / "out"), "--model-dir": str(tmp_path / "ckpt")}
    args = [arg for name, value in {**defaults, option: str(tmp_path / path)}.items() for arg in (name, value)]
    result = CliRunner().invoke(app, ["demo", *args])
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1, result.output
    assert result.output.startswith("error: " + problem.format(file=tmp_path / "file", mine=tmp_path / "mine",
                                                               ckpt=tmp_path / "ckpt"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "mine"]  # nothing built, nothing written
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["config.json", "notes.txt"]
    assert (tmp_path / "mine" / "config.json").read_text() == '{"mine": true}'


@pytest.mark.parametrize("kind, name", [("custom_voice", "demo.jsonl"), ("base", "ref.wav")])
def test_demo_keeps_the_users_own_files_in_an_existing_out(tmp_path, kind, name):
    """`demo -o DIR` wrote its demo.jsonl (and ref.wav) over the user's files of those names in DIR."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / name).write_bytes(b"the user's own file")
    result = CliRunner().invoke(app, ["demo", "--kind", kind, "-o", str(out), "--model-dir", str(tmp_path / "ckpt")],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert result.output == (f"error: --out {out}: holds a {name} that the demo did not write, and the demo writes its "
                             "own there; choose another -o (or move the file)\n")
    assert (out / name).read_bytes() == b"the user's own file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]  # nothing built
    assert sorted(p.name for p in out.iterdir()) == [name]  # nothing written


def test_demo_of_one_kind_refuses_the_out_of_another_kinds_run(tmp_path):
    """`demo -o out/demo-base` (the base demo's folder) for the custom_voice demo wrote its lines over the base
    demo's manifest and ran them beside the base demo's results."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "demo.jsonl").write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in DEMO_LINES["base"]),
                                    encoding="utf-8")
    before = (out / "demo.jsonl").read_bytes()
    result = CliRunner().invoke(app, ["demo", "-o", str(out), "--model-dir", str(tmp_path / "ckpt")],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 2 and result.output == (
        f"error: --out {out}: holds the base demo's run, not custom_voice's; pass --kind base, or another -o\n")
    assert (out / "demo.jsonl").read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_the_readme_first_command_runs_the_customvoice_demo(tmp_path, monkeypatch):
    """`omnitts demo` with no options, as the README's quick start runs it: a tiny CustomVoice checkpoint
    built under .cache/, its 3-line manifest synthesized into the output folder the run names."""
    import re

    import numpy as np

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["demo"])
    assert result.exit_code == 0, result.output
    model = tmp_path / ".cache" / "demo-tiny-customvoice"
    assert json.loads((model / "config.json").read_text())["tts_model_type"] == "custom_voice"
    out = tmp_path / re.search(r"omnitts synth ->\s+(\S+)", result.output).group(1)  # the summary names it
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    expected = sorted(line["id"] for line in DEMO_LINES["custom_voice"])
    assert sorted(r["id"] for r in records if r["status"] == "ok") == expected
    for r in records:
        audio, rate = sf.read(out / r["path"])
        assert rate == 24000 and audio.shape == (25 * 1920,) and np.isfinite(audio).all() and audio.any()
        assert np.load(out / f"{r['id']}.codes.npy").shape == (25, 16)
    # "After `omnitts demo` this runs as is": the README's manifest on the demo checkpoint.
    (tmp_path / "lines.jsonl").write_text(
        '{"id": "intro", "text": "Hello, and welcome.", "language": "english", "speaker": "ryan"}\n'
        '{"id": "calm", "text": "Take a deep breath.", "speaker": "vivian", "instruct": "Calm and slow."}\n')
    result = CliRunner().invoke(app, ["synth", "lines.jsonl", "--model", ".cache/demo-tiny-customvoice",
                                      "--out", "out/lines", "--max-frames", "25"])
    assert result.exit_code == 0, result.output
    assert all(sf.info(tmp_path / "out" / "lines" / f"{name}.wav").frames == 25 * 1920 for name in ("intro", "calm"))


def test_the_readme_python_example_runs_as_is(ckpt_dir, ref_wav, tmp_path, monkeypatch, capsys):
    """README's "Python and notebooks" block, read from the README and run where the examples before it left
    the demo checkpoints (tiny-1.7b CustomVoice, tiny-0.6b Base) and `ref.wav`."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("### 3. Python and notebooks"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".cache").mkdir()
    (tmp_path / ".cache" / "demo-tiny-customvoice").symlink_to(ckpt_dir("custom_voice", "tiny-1.7b"))
    (tmp_path / ".cache" / "demo-tiny-base").symlink_to(ckpt_dir("base"))
    (tmp_path / "ref.wav").symlink_to(ref_wav)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    assert sf.info(tmp_path / "out" / "python" / "hello.flac").frames == 25 * 1920
    assert scope["audio"].frames == 25 and scope["voice"] is not None
    assert sorted(line.split()[0] for line in capsys.readouterr().out.splitlines()) == ["a", "b"]  # its print loop
