"""The fingerprint a record keeps of what made its audio: every input the line asks for counts, the machine does not."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from omnitts.batch.fingerprint import fingerprint
from omnitts.params import SamplingParams
from omnitts.request import Request, Voice


def test_every_input_of_a_line_changes_the_fingerprint_and_nothing_else_does(tmp_path):
    clip, voice = tmp_path / "ref.wav", tmp_path / "v.safetensors"
    clip.write_bytes(b"RIFF-one")
    voice.write_bytes(b"voice-one")
    request = Request("Hello.", "english", speaker="ryan", instruct="Calm.", ref_audio=clip, ref_text="Ref.",
                      voice=voice, id="a")
    params = SamplingParams(seed=7, max_frames=40)
    base = fingerprint(request, params, "base-0b6-0123", "wav", None, None)
    assert base == fingerprint(replace(request, id="b"), params, "base-0b6-0123", "wav")  # the id is not an input
    assert base == "9960b441cd517b96"  # what records hold: a new input left at its default never moves it
    changed = [
        fingerprint(replace(request, text="Hello!"), params, "base-0b6-0123", "wav"),
        fingerprint(replace(request, language="german"), params, "base-0b6-0123", "wav"),
        fingerprint(replace(request, speaker="vivian"), params, "base-0b6-0123", "wav"),
        fingerprint(replace(request, instruct=None), params, "base-0b6-0123", "wav"),
        fingerprint(replace(request, ref_text="Other."), params, "base-0b6-0123", "wav"),
        fingerprint(replace(request, x_vector_only=True), params, "base-0b6-0123", "wav"),
        fingerprint(replace(request, non_streaming=True), params, "base-0b6-0123", "wav"),
        fingerprint(replace(request, max_seconds=3.0), params, "base-0b6-0123", "wav"),
        fingerprint(request, replace(params, seed=8), "base-0b6-0123", "wav"),
        fingerprint(request, replace(params, max_frames=41), "base-0b6-0123", "wav"),
        fingerprint(request, replace(params, temperature=0.5), "base-0b6-0123", "wav"),
        fingerprint(request, params.greedy(), "base-0b6-0123", "wav"),
        fingerprint(request, params, "base-0b6-9999", "wav"),
        fingerprint(request, params, "base-0b6-0123", "flac"),
        fingerprint(request, params, "base-0b6-0123", "wav", -23.0),
        fingerprint(request, params, "base-0b6-0123", "wav", None, 120),
        fingerprint(request, params, "base-0b6-0123", "wav", official_tokenizer=True),
    ]
    assert len(set(changed)) == len(changed) and base not in changed
    # A file's contents count, not its name or place; an edit counts.
    moved = tmp_path / "moved.wav"
    clip.rename(moved)
    assert fingerprint(replace(request, ref_audio=moved), params, "base-0b6-0123", "wav") == base
    moved.write_bytes(b"RIFF-two")
    assert fingerprint(replace(request, ref_audio=moved), params, "base-0b6-0123", "wav") != base
    voice.write_bytes(b"voice-two")
    assert fingerprint(request, params, "base-0b6-0123", "wav") != base


def test_in_memory_references_and_voices_are_fingerprinted_by_value():
    samples = np.linspace(-0.5, 0.5, 4800, dtype=np.float32)
    params = SamplingParams(seed=1)
    by_samples = [fingerprint(Request("Hi.", ref_audio=(s, r), ref_text="Ref."), params, "c", "wav")
                  for s, r in ((samples, 24000), (samples.copy(), 24000), (samples, 16000), (samples * 2, 24000))]
    assert by_samples[0] == by_samples[1] and len(set(by_samples)) == 3
    voice = Voice(torch.ones(8), torch.zeros(5, 16, dtype=torch.int64), "Ref.", checkpoint="c")
    same = Voice(torch.ones(8), torch.zeros(5, 16, dtype=torch.int64), "Ref.", checkpoint="c")
    other = Voice(torch.ones(8), torch.ones(5, 16, dtype=torch.int64), "Ref.", checkpoint="c")
    prints = [fingerprint(Request("Hi.", voice=v), params, "c", "wav") for v in (voice, same, other)]
    assert prints[0] == prints[1] != prints[2]


def test_an_unseeded_item_keeps_its_fingerprint_across_runs():
    request = Request("Hello.", speaker="ryan")
    assert fingerprint(request, SamplingParams(), "c", "wav") == fingerprint(request, SamplingParams(), "c", "wav")


def _synth(manifest, model, out, *extra):
    from typer.testing import CliRunner

    from omnitts.cli import app

    return CliRunner().invoke(app, ["synth", str(manifest), "-m", str(model), "-o", str(out), "-q", *extra])


def _lines(path, texts: dict, **fields):
    import json

    path.write_text("".join(json.dumps({"id": k, "text": v, "speaker": "ryan", **fields}) + "\n"
                            for k, v in texts.items()))


def test_a_rerun_redoes_exactly_the_items_whose_line_or_options_changed(ckpt_dir, tmp_path):
    from omnitts.batch.ledger import read_results

    model, out, manifest = ckpt_dir("custom_voice"), tmp_path / "out", tmp_path / "m.jsonl"
    _lines(manifest, {"a": "First line.", "b": "Second line.", "c": "Third line."})
    first = _synth(manifest, model, out, "--max-frames", "4", "--seed", "1")
    assert first.exit_code == 0, first.output
    prints = {k: r["fingerprint"] for k, r in read_results(out).items()}
    assert len(set(prints.values())) == 3 and all(len(p) == 16 for p in prints.values())
    again = _synth(manifest, model, out, "--max-frames", "4", "--seed", "1")
    assert "3 items already done" in again.output and "run again" not in again.output
    _lines(manifest, {"a": "First line.", "b": "Second line, edited.", "c": "Third line."})
    edited = _synth(manifest, model, out, "--max-frames", "4", "--seed", "1")
    assert edited.exit_code == 0, edited.output
    assert "1 item run again: its line or the options changed" in edited.output
    assert "2 items already done" in edited.output
    now = read_results(out)
    assert now["b"]["fingerprint"] != prints["b"] and now["a"]["fingerprint"] == prints["a"]
    for options, changed in ((("--max-frames", "5", "--seed", "1"), 3), (("--max-frames", "5", "--seed", "2"), 3),
                             (("--max-frames", "5", "--seed", "2", "--format", "flac"), 3),
                             (("--max-frames", "5", "--seed", "2", "--format", "flac"), 0),
                             # other token ids for CamelCase ("iPhone"): it was skipped as done
                             (("--max-frames", "5", "--seed", "2", "--format", "flac", "--official-tokenizer"), 3),
                             (("--max-frames", "5", "--seed", "2", "--format", "flac", "--official-tokenizer"), 0)):
        result = _synth(manifest, model, out, *options)
        assert result.exit_code == 0, result.output
        assert (f"{changed} items run again" in result.output) == bool(changed), (options, result.output)
    assert {r["path"] for r in read_results(out).values()} == {"a.flac", "b.flac", "c.flac"}


def test_a_fixed_bad_line_runs_without_retry_failed_and_the_export_skips_stale_audio(ckpt_dir, tmp_path):
    import json

    from omnitts.batch.manifest import iter_manifest
    from omnitts.batch.outdir import Batch
    from omnitts.batch.settings import Settings
    from omnitts.config import load_config
    from omnitts.voice import checkpoint_identity

    model, out, manifest = ckpt_dir("custom_voice"), tmp_path / "out", tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"id": "a", "text": "Fine.", "speaker": "ryan"}) + "\n"
                        + json.dumps({"id": "b", "text": "Bad speaker.", "speaker": "nobody"}) + "\n")
    assert _synth(manifest, model, out, "--max-frames", "3").exit_code == 1
    _lines(manifest, {"a": "Fine.", "b": "Bad speaker."})  # b fixed
    fixed = _synth(manifest, model, out, "--max-frames", "3")
    assert fixed.exit_code == 0 and (out / "b.wav").is_file(), fixed.output
    cfg = load_config(model)
    _lines(manifest, {"a": "Fine, but changed.", "b": "Bad speaker."})  # a's audio is now stale
    batch = Batch(out, Settings(max_frames=3), cfg, checkpoint_identity(model))
    current = {item.request.id: batch.is_current(item) for item in iter_manifest(manifest, cfg)}
    assert current == {"a": False, "b": True}


def test_the_sampling_parameters_are_serialised_as_dataclasses_asdict_gives_them():
    """Records made while the fingerprint took `asdict(params)` still match: the same keys, values and types (a
    temperature of 1 stays the int 1), so the same JSON text; every field is a scalar (asdict would turn a
    nested dataclass into a dict, where json's default=repr would write its repr)."""
    import json
    from dataclasses import asdict, fields

    from omnitts.batch import fingerprint as fp

    for params in (SamplingParams(), SamplingParams(seed=7, max_frames=40).greedy(),
                   SamplingParams(temperature=1, top_p=1, repetition_penalty=2, seed=-(2**63)),
                   SamplingParams.from_generation_config({"temperature": 0.7, "max_new_tokens": 100}, top_k=0)):
        ours = {name: getattr(params, name) for name in fp._field_names(type(params))}
        assert json.dumps(ours, sort_keys=True) == json.dumps(asdict(params), sort_keys=True)
        assert [type(v) for v in ours.values()] == [type(v) for v in asdict(params).values()]
    assert all(isinstance(getattr(SamplingParams(seed=1, max_frames=2), f.name), (bool, int, float))
               for f in fields(SamplingParams))


def test_a_file_named_on_many_lines_is_read_once_per_version(tmp_path):
    """`io.versioned.per_version`, which the clip check, the voice-mode read and the file digest share: one read
    per (path, arguments) while the file stays, a new one once it changes (its size or mtime), OSError where it
    cannot be looked up."""
    import os

    from omnitts.io.versioned import per_version

    reads = []

    @per_version()
    def head(path: str, n: int) -> bytes:
        reads.append((path, n))
        with open(path, "rb") as handle:
            return handle.read(n)

    path = tmp_path / "clip.bin"
    path.write_bytes(b"abcdef")
    assert [head(path, 2), head(str(path), 2), head(path, 3)] == [b"ab", b"ab", b"abc"]
    assert reads == [(str(path), 2), (str(path), 3)]
    path.write_bytes(b"xyzxyz")  # the same size: the new mtime tells it apart
    os.utime(path, ns=(1, 1))
    assert head(path, 2) == b"xy" and len(reads) == 3
    path.unlink()
    with pytest.raises(FileNotFoundError):
        head(path, 2)
