"""Saved voices: the file format, the checkpoint identity check, and `omnitts voice-clone`."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from typer.testing import CliRunner

import omnitts
from omnitts.cli import app
from omnitts.errors import CheckpointError, VoiceError
from omnitts.testing.checkpoint import build_checkpoint
from omnitts.voice import checkpoint_identity, load_voice

runner = CliRunner()
REF_TEXT = "Reference words."


@pytest.fixture(scope="module")
def other_base(tmp_path_factory):
    """A Base checkpoint of the same preset and shapes as ckpt_dir("base"), with other random weights."""
    return build_checkpoint(tmp_path_factory.mktemp("other") / "base", kind="base", preset="tiny-0.6b", seed=1)


@pytest.mark.parametrize("x_vector_only", [False, True], ids=["icl", "x_vector_only"])
def test_saved_voice_gives_the_same_codes_as_cloning_directly(ckpt_dir, ref_wav, tmp_path, x_vector_only):
    ref_text = None if x_vector_only else REF_TEXT
    first = omnitts.load(ckpt_dir("base"), dtype="float32")
    direct = first.synthesize("Say it again.", ref_audio=ref_wav, ref_text=ref_text, x_vector_only=x_vector_only,
                              greedy=True, max_frames=5)
    path = first.clone_voice(ref_wav, ref_text, x_vector_only).save(tmp_path / "v.safetensors")

    second = omnitts.load(ckpt_dir("base"), dtype="float32")  # a separate run: a fresh load of the checkpoint
    voice, meta = load_voice(path)
    assert meta["mode"] == ("x_vector_only" if x_vector_only else "icl") and meta["ref_audio"] == ref_wav.name
    assert meta["checkpoint"] == second.identity and float(meta["ref_seconds"]) == pytest.approx(2.0, abs=1e-3)
    assert voice.icl == (not x_vector_only) and voice.ref_text == ref_text
    by_object = second.synthesize("Say it again.", voice=second.load_voice(path), greedy=True, max_frames=5)
    by_path = second.synthesize("Say it again.", voice=path, greedy=True, max_frames=5)
    np.testing.assert_array_equal(by_object.codes, direct.codes)
    np.testing.assert_array_equal(by_path.codes, direct.codes)
    np.testing.assert_array_equal(by_path.audio, direct.audio)


def test_a_saved_voice_with_a_transcript_or_x_vector_only_beside_it_is_refused(tts_factory, ref_wav, tmp_path):
    """A saved voice's mode and transcript were fixed when it was cloned: a ref_text given with it would be
    ignored, and `x_vector_only=True` beside an in-context voice asks for what it cannot do, so each is an error
    naming the field; `x_vector_only=True` beside an x-vector voice (a Voice or its file) agrees with its mode
    and runs as the voice alone does, as a manifest line's true does (it was refused, keywords and Requests
    alike); cloning from ref_audio for a list of texts (encoded once) takes them as ever."""
    from omnitts.errors import RequestError
    from omnitts.request import Request

    tts = tts_factory("base")
    voice = tts.clone_voice(ref_wav, REF_TEXT)
    with pytest.raises(RequestError, match=r"^ref_text: a saved voice keeps the mode and transcript it was saved "
                                           r"with; remove ref_text \(or clone from ref_audio\)$"):
        tts.synthesize("Hi.", voice=voice, ref_text="Other words.")
    said = ("x_vector_only: true asks for x-vector-only cloning, which {} does not do: it was saved in context (it "
            "holds reference codes), and a saved voice keeps the mode it was saved with; remove x_vector_only (or "
            "clone from ref_audio)")
    with pytest.raises(RequestError, match=f"^{re.escape(said.format('the voice'))}$"):
        tts.synthesize("Hi.", voice=voice, x_vector_only=True)
    icl_file = voice.save(tmp_path / "icl.safetensors")
    with pytest.raises(RequestError, match=f"^requests\\[0\\] \\(id '0'\\): {re.escape(said.format(f'voice {icl_file}'))}$"):
        list(tts.stream([Request("Hi.", voice=icl_file, x_vector_only=True)], max_frames=2))
    xv = tts.clone_voice(ref_wav, x_vector_only=True)
    xv_file = xv.save(tmp_path / "xv.safetensors")
    alone = tts.synthesize("Hi.", voice=xv, greedy=True, max_frames=3)
    for given in (xv, xv_file, str(xv_file)):
        agreeing = tts.synthesize("Hi.", voice=given, x_vector_only=True, greedy=True, max_frames=3)
        np.testing.assert_array_equal(agreeing.codes, alone.codes)
        streamed, = tts.stream([Request("Hi.", voice=given, x_vector_only=True)], greedy=True, max_frames=3)
        np.testing.assert_array_equal(streamed.codes, alone.codes)
    both = tts.synthesize(["One.", "Two."], ref_audio=ref_wav, ref_text=REF_TEXT, greedy=True, max_frames=3)
    alone = tts.synthesize("One.", voice=voice, greedy=True, max_frames=3)
    np.testing.assert_array_equal(both[0].codes, alone.codes)


def test_a_stream_dict_with_x_vector_only_beside_a_voice_runs_only_if_it_agrees_with_its_mode(tts_factory, ref_wav, tmp_path):
    """A dict is read as a manifest line is: `"x_vector_only": false` beside a voice saved x-vector only asks for
    in-context cloning that voice cannot do (it ran x-vector only without a word); a value that agrees with the
    voice's mode (false beside an in-context voice, true beside an x-vector one) runs as the voice alone does."""
    from omnitts.errors import RequestError

    tts = tts_factory("base")
    xv, icl = tmp_path / "xv.safetensors", tmp_path / "icl.safetensors"
    tts.clone_voice(ref_wav, x_vector_only=True).save(xv)
    tts.clone_voice(ref_wav, REF_TEXT).save(icl)
    with pytest.raises(RequestError, match=rf"^requests\[0\]: x_vector_only: false asks for in-context cloning, "
                                           rf"which voice {re.escape(str(xv))} does not do: it was saved x-vector only"):
        list(tts.stream([{"text": "Hi.", "voice": str(xv), "x_vector_only": False}], max_frames=2))
    (ran,) = tts.stream([{"text": "Hi.", "voice": str(icl), "x_vector_only": False}], greedy=True, max_frames=2)
    np.testing.assert_array_equal(ran.codes, tts.synthesize("Hi.", voice=icl, greedy=True, max_frames=2).codes)
    (ran,) = tts.stream([{"text": "Hi.", "voice": str(xv), "x_vector_only": True}], greedy=True, max_frames=2)
    np.testing.assert_array_equal(ran.codes, tts.synthesize("Hi.", voice=xv, greedy=True, max_frames=2).codes)


def test_identity_follows_the_encoder_weights_not_the_folder(ckpt_dir, other_base, tmp_path):
    base = ckpt_dir("base")
    assert checkpoint_identity(base) == checkpoint_identity(base)
    assert checkpoint_identity(base).startswith("base-0b6-")
    assert checkpoint_identity(other_base) != checkpoint_identity(base)  # same shapes, other seed
    copy = shutil.copytree(base, tmp_path / "copy")
    assert checkpoint_identity(copy) == checkpoint_identity(base)
    # One changed byte inside a codec-encoder tensor changes it too.
    from safetensors.torch import load_file, save_file

    def bump(file, prefix):  # add 1 to the first value of the first float tensor named prefix*
        tensors = load_file(file)
        name = next(k for k in sorted(tensors) if k.startswith(prefix) and tensors[k].is_floating_point())
        tensors[name].view(-1)[0] += 1.0
        save_file(tensors, file, metadata={"format": "pt"})

    bump(copy / "model.safetensors", "talker.")  # the talker is not read: identity unchanged (cheap)
    assert checkpoint_identity(copy) == checkpoint_identity(base)
    bump(copy / "model.safetensors", "speaker_encoder.")
    after_speaker = checkpoint_identity(copy)
    assert after_speaker != checkpoint_identity(base)
    bump(copy / "speech_tokenizer" / "model.safetensors", "encoder.")
    assert checkpoint_identity(copy) not in (after_speaker, checkpoint_identity(base))


def test_identity_is_computed_once_and_a_voice_file_loaded_once(ckpt_dir, ref_wav, tmp_path, monkeypatch):
    import omnitts.tts as tts_module

    tts = omnitts.load(ckpt_dir("base"), dtype="float32")
    path = tts.clone_voice(ref_wav, REF_TEXT).save(tmp_path / "v.safetensors")
    calls = {"identity": 0, "load": 0}

    def counted(name, fn):
        def wrapper(*args):
            calls[name] += 1
            return fn(*args)
        return wrapper

    monkeypatch.setattr(tts_module, "checkpoint_identity", counted("identity", tts_module.checkpoint_identity))
    monkeypatch.setattr(tts_module, "load_voice", counted("load", tts_module.load_voice))
    fresh = omnitts.load(ckpt_dir("base"), dtype="float32")
    results = fresh.synthesize(["One.", "Two.", "Three."], voice=str(path), greedy=True, max_frames=4)
    assert len(results) == 3 and calls == {"identity": 1, "load": 1}


def test_a_voice_file_written_over_or_deleted_is_not_served_from_memory(ckpt_dir, ref_wav, tmp_path):
    """Loaded voices are kept by path and the file's stamp: a file saved over is read again, a deleted one is
    refused as one never loaded was (the cache used to serve the first voice under that path forever)."""
    tts = omnitts.load(ckpt_dir("base"), dtype="float32")
    path = tmp_path / "bob.safetensors"
    tts.clone_voice(ref_wav, REF_TEXT).save(path)
    assert tts.load_voice(path).icl
    tts.synthesize("Hi.", voice=str(path), greedy=True, max_frames=3)
    second = tts.clone_voice(ref_wav, x_vector_only=True)
    second.save(path)
    assert not tts.load_voice(path).icl
    by_path = tts.synthesize("Hi.", voice=str(path), greedy=True, max_frames=3)
    np.testing.assert_array_equal(by_path.codes, tts.synthesize("Hi.", voice=second, greedy=True, max_frames=3).codes)
    path.unlink()
    with pytest.raises(VoiceError, match=r"bob\.safetensors: voice file not found"):
        tts.load_voice(path)
    with pytest.raises(VoiceError, match=r"bob\.safetensors: voice file not found"):
        tts.synthesize("Hi.", voice=str(path), max_frames=3)
    path.mkdir()  # a folder where the file was: it was "voice file not found" too
    with pytest.raises(VoiceError, match=r"bob\.safetensors: voice file is a directory$"):
        tts.load_voice(path)


def test_clone_voice_checks_its_arguments_as_a_request_does(tts_factory, ref_wav):
    """A lone surrogate in ref_text (no encoding writes it, no tokenizer reads it) and fields of the wrong type are
    RequestErrors naming the field, not a UnicodeEncodeError at save or a TypeError in the tokenizer."""
    from omnitts.errors import RequestError

    tts = tts_factory("base")
    with pytest.raises(RequestError, match=r"^ref_text: a lone surrogate '\\ud800' at character 2 is not text"):
        tts.clone_voice(ref_wav, ref_text="a\ud800b")
    with pytest.raises(RequestError, match=r"^ref_text: expected str, got int$"):
        tts.clone_voice(ref_wav, ref_text=5)
    with pytest.raises(RequestError, match=r"^ref_audio: expected a path or a \(samples, sample_rate\) pair, got int$"):
        tts.clone_voice(5, ref_text=REF_TEXT)
    with pytest.raises(RequestError, match=r"^voice: expected a Voice or the path of a voice file, got int$"):
        tts.synthesize("Hi.", voice=5, max_frames=3)


def test_a_ref_text_of_only_invisible_characters_is_no_transcript(tts_factory, ckpt_dir, ref_wav, tmp_path):
    """A text of only U+200B is empty (README), but a ref_text of it was taken as a transcript: clone_voice, synthesize
    and a manifest line cloned in context from a transcript of nothing. It is refused as a missing ref_text is."""
    from omnitts.errors import RequestError

    tts = tts_factory("base")
    for ref_text in ("\u200b", " \u200b\ufeff "):
        with pytest.raises(RequestError, match=r"^ref_text: required for in-context cloning"):
            tts.clone_voice(ref_wav, ref_text)
        with pytest.raises(RequestError, match=r"^ref_text: required for in-context cloning"):
            tts.synthesize("Hi.", ref_audio=ref_wav, ref_text=ref_text, max_frames=2)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"id": "a", "text": "Hi.", "ref_audio": str(ref_wav), "ref_text": "\u200b"}) + "\n")
    result = CliRunner().invoke(app, ["validate", str(manifest), "-m", str(ckpt_dir("base"))])
    assert result.exit_code != 0 and "ref_text: required for in-context cloning" in result.output, result.output
    result = CliRunner().invoke(app, ["voice-clone", "-m", str(ckpt_dir("base")), "--ref-audio", str(ref_wav),
                                      "--ref-text", "\u200b", "--save", str(tmp_path / "v.safetensors")])
    assert result.exit_code == 2 and "--ref-text is required for in-context cloning" in result.output, result.output


@pytest.mark.parametrize("rate", [0, -1, "24000", -24000.0, float("nan"), True])
def test_a_sample_rate_that_is_not_a_positive_integer_is_refused(tts_factory, rate):
    from omnitts.errors import AudioError

    samples = 0.3 * np.sin(np.arange(48000) / 10).astype(np.float32)
    with pytest.raises(AudioError, match=rf"^ref_audio: sample rate must be a positive integer, got {rate!r}$"):
        tts_factory("base").clone_voice((samples, rate), x_vector_only=True)


def test_a_whole_float_sample_rate_is_that_rate_and_a_fraction_is_refused(tts_factory):
    """Some libraries return the rate as a float: (samples, 24000.0) was refused, "ref_audio: sample rate must be
    a positive integer, got 24000.0", where (samples, 24000) was taken. A whole float is that rate; 24000.5 no rate."""
    from omnitts.errors import AudioError

    tts = tts_factory("base")
    samples = 0.3 * np.sin(np.arange(48000) / 10).astype(np.float32)
    as_int = tts.clone_voice((samples, 24000), x_vector_only=True)
    for rate in (24000.0, np.float32(24000)):
        assert tts.clone_voice((samples, rate), x_vector_only=True) == as_int
    with pytest.raises(AudioError, match=r"^ref_audio: sample rate 24000.5 is not a whole number of samples per "
                                         r"second; give the file's rate as an integer \(e.g. 24000\)$"):
        tts.clone_voice((samples, 24000.5), x_vector_only=True)


def test_a_pair_in_scipys_rate_then_data_order_is_refused_saying_so(tts_factory, tmp_path):
    """`scipy.io.wavfile.read` returns (rate, data), the other order than the (samples, sample_rate) the API takes
    and the README points to it: given as it came, the error was "sample rate must be a positive integer, got
    array([ 0, 565, ...], dtype=int16)". It says the order is swapped and how to give it."""
    import scipy.io.wavfile
    from omnitts.errors import AudioError

    path = tmp_path / "r.wav"
    scipy.io.wavfile.write(path, 24000, (0.3 * np.sin(np.arange(48000) / 10) * 32767).astype(np.int16))
    with pytest.raises(AudioError, match=r"^ref_audio: got \(sample_rate, samples\), the order scipy.io.wavfile.read "
                                         r"returns; give \(samples, sample_rate\): rate, samples = "
                                         r"wavfile.read\(path\); \(samples, rate\)$"):
        tts_factory("base").clone_voice(scipy.io.wavfile.read(path), x_vector_only=True)
    rate, samples = scipy.io.wavfile.read(path)
    assert tts_factory("base").clone_voice((samples, rate), x_vector_only=True).x_vector is not None


def test_samples_that_cannot_be_a_reference_are_named_by_the_field_once(tts_factory):
    """A pair's errors read "reference audio: reference audio is 0.40 s long" (and "...: reference audio contains
    NaN"), the words twice and no field, where a path's name the field: "ref_audio: r.wav: reference audio ..."."""
    from omnitts.errors import AudioError

    tts = tts_factory("base")
    short, nan = np.full(9600, 0.1, np.float32), np.full(48000, np.nan, np.float32)
    for samples, problem in ((short, r"reference audio is 0.40 s long; at least 0.5 s is needed"),
                             (nan, r"reference audio contains NaN or infinite samples")):
        with pytest.raises(AudioError, match=rf"^ref_audio: {problem}$"):
            tts.clone_voice((samples, 24000), x_vector_only=True)
        with pytest.raises(AudioError, match=rf"^ref_audio: {problem}$"):
            tts.synthesize("Hi.", ref_audio=(samples, 24000), x_vector_only=True, max_frames=2)


def test_samples_are_mono_or_samples_by_channels(tts_factory):
    """A (channels, n) array (librosa's layout) used to be averaged over its n "channels" into 2 samples and
    refused as 0.00 s long; it is refused saying the layout. (n, channels) is mixed to mono as before."""
    from omnitts.errors import AudioError

    tts = tts_factory("base")
    mono = 0.3 * np.sin(np.arange(48000) / 10).astype(np.float32)
    with pytest.raises(AudioError, match=r"shape \(2, 48000\) look like \(channels, n\); give mono samples, "
                                         r"shape \(n,\), or \(n, channels\): transpose them"):
        tts.clone_voice((np.stack([mono, mono]), 24000), x_vector_only=True)
    with pytest.raises(AudioError, match=r"shape \(2, 2, 48000\); give mono samples"):
        tts.clone_voice((np.zeros((2, 2, 48000), np.float32), 24000), x_vector_only=True)
    stereo = tts.clone_voice((np.stack([mono, mono], axis=1), 24000), x_vector_only=True)
    torch.testing.assert_close(stereo.x_vector, tts.clone_voice((mono, 24000), x_vector_only=True).x_vector)


@pytest.mark.parametrize("x_vector_only", [False, True], ids=["icl", "x_vector_only"])
def test_a_voice_and_ref_audio_together_are_refused_as_in_a_manifest(tts_factory, ref_wav, tmp_path, x_vector_only):
    """One of them would be ignored without a word; a manifest line or stream dict refuses the pair, so the
    keywords and a `Request` do too."""
    from omnitts.errors import RequestError

    tts = tts_factory("base")
    path = tts.clone_voice(ref_wav, REF_TEXT).save(tmp_path / "a.safetensors")
    ref_text = None if x_vector_only else REF_TEXT
    for voice in (path, tts.load_voice(path)):
        with pytest.raises(RequestError, match=r"^voice: give either ref_audio or voice, not both$"):
            tts.synthesize("Hi.", voice=voice, ref_audio=ref_wav, ref_text=ref_text, x_vector_only=x_vector_only,
                           max_frames=3)
    with pytest.raises(RequestError, match=r"^voice: give either ref_audio or voice, not both$"):
        tts.synthesize(["One.", "Two."], voice=path, ref_audio=ref_wav, ref_text=ref_text, x_vector_only=x_vector_only)
    request = omnitts.Request("Hi.", voice=path, ref_audio=ref_wav, ref_text=ref_text, x_vector_only=x_vector_only)
    with pytest.raises(RequestError, match=r"^requests\[0\]: voice: give either ref_audio or voice, not both$"):
        list(tts.stream([request], max_frames=3))


def test_voice_from_another_checkpoint_is_refused(tts_factory, other_base, ref_wav, tmp_path):
    path = tts_factory("base").clone_voice(ref_wav, REF_TEXT).save(tmp_path / "alice.safetensors")
    other = omnitts.load(other_base, dtype="float32")
    with pytest.raises(VoiceError) as info:
        other.load_voice(path)
    message = str(info.value)
    assert str(path) in message and tts_factory("base").identity in message and other.identity in message
    with pytest.raises(VoiceError, match="alice.safetensors"):
        other.synthesize("Hi.", voice=path, max_frames=4)
    in_memory = tts_factory("base").load_voice(path)  # a Voice object carries its checkpoint too
    with pytest.raises(VoiceError, match="made with checkpoint"):
        other.synthesize("Hi.", voice=in_memory, max_frames=4)


def test_a_voice_keyword_that_cannot_be_used_is_named_as_the_keyword_for_a_list(tts_factory, other_base, ref_wav,
                                                                                tmp_path):
    """synthesize([...], voice=...) with a voice of another checkpoint, or a missing file, said "text[0]: voice: ..."
    ("text[0]: /x/alice.safetensors: ..."): the keyword's fault, named as the first text's; it is named as one text's
    is, and a list still speaks in a usable voice as each text alone does."""
    base = tts_factory("base")
    voice = base.clone_voice(ref_wav, REF_TEXT)
    path = voice.save(tmp_path / "alice.safetensors")
    other = omnitts.load(other_base, dtype="float32")
    with pytest.raises(VoiceError, match=r"^voice: made with checkpoint"):
        other.synthesize(["Hi.", "Yo."], voice=voice, max_frames=2)
    with pytest.raises(VoiceError, match=rf"^{re.escape(str(path))}: this voice was made with checkpoint"):
        other.synthesize(["Hi.", "Yo."], voice=path, max_frames=2)
    with pytest.raises(VoiceError, match=r"^\S*nope.safetensors: voice file not found"):
        base.synthesize(["Hi.", "Yo."], voice=tmp_path / "nope.safetensors", max_frames=2)
    both = base.synthesize(["Hi.", "Yo."], voice=path, greedy=True, max_frames=2)
    assert np.array_equal(both[1].codes, base.synthesize("Yo.", voice=voice, greedy=True, max_frames=2).codes)


def test_a_reference_clip_given_as_a_voice_is_named_as_audio(tts_factory, ckpt_dir, ref_wav, tmp_path):
    """`voice="ref.wav"` (the clip, where a saved voice goes) said "unreadable safetensors file: Error while
    deserializing header: header too large"; it names the clip as audio and both ways to use it. (A manifest's
    voice field takes .safetensors files only, and says so.)"""
    tts = tts_factory("base")
    flac = tmp_path / "ref.flac"
    sf.write(flac, sf.read(ref_wav)[0], 24000)
    for clip in (ref_wav, flac):
        with pytest.raises(VoiceError) as info:
            tts.synthesize("Hi.", voice=str(clip), max_frames=2)
        assert str(info.value).startswith(f"{clip}: is an audio file, not a saved voice: give it as ref_audio"), info.value
        assert "omnitts voice-clone --ref-audio CLIP --save v.safetensors" in str(info.value)


def test_malformed_files_are_refused_naming_the_file(tts_factory, ckpt_dir, ref_wav, tmp_path):
    from safetensors.torch import save_file

    tts = tts_factory("base")
    good = tts.clone_voice(ref_wav, REF_TEXT).save(tmp_path / "good.safetensors")
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x00\x01not a safetensors file at all")
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(good.read_bytes()[:-40])
    foreign = tmp_path / "foreign.safetensors"
    save_file({"x_vector": torch.zeros(64)}, str(foreign), metadata={"format": "pt"})
    cases = {garbage: "not a saved voice", truncated: "not a saved voice", foreign: "not a saved voice",
             ckpt_dir("base") / "model.safetensors": "not a saved voice", tmp_path / "missing.safetensors": "not found"}
    for path, problem in cases.items():
        with pytest.raises(VoiceError, match=problem) as info:
            tts.load_voice(path)
        assert str(path) in str(info.value)
    _, meta = load_voice(good)
    broken = tmp_path / "broken.safetensors"
    save_file({"x_vector": torch.zeros(64)}, str(broken), metadata=meta)  # icl metadata, no ref_codes
    with pytest.raises(VoiceError, match="broken.safetensors: a voice of mode icl holds tensors ref_codes, x_vector"):
        load_voice(broken)
    save_file({"x_vector": torch.zeros(64)}, str(broken), metadata={**meta, "format_version": "99"})
    with pytest.raises(VoiceError, match="version '99' is not supported"):
        load_voice(broken)


def test_crafted_voice_tensors_are_refused_and_fail_only_their_item(tts_factory, ckpt_dir, ref_wav, tmp_path):
    """A voice file with valid metadata (this checkpoint's identity) whose tensors do not fit: each is one
    VoiceError naming the file; in a manifest run only its item fails, the others are written."""
    from safetensors.torch import save_file

    tts = tts_factory("base")
    good = tts.clone_voice(ref_wav, REF_TEXT)
    _, meta = load_voice(good.save(tmp_path / "good.safetensors"))
    codes, hidden = good.ref_codes, good.x_vector.shape[0]
    crafted = {
        "too_high": (good.x_vector, codes.clone().index_fill_(0, torch.tensor([0]), 2048),
                     r"values from \d+ to 2048; codes of this checkpoint lie in 0..2047"),
        "negative": (good.x_vector, codes.clone().index_fill_(0, torch.tensor([1]), -3), "values from -3"),
        "groups": (good.x_vector, codes[:, :8].contiguous(), "ref_codes must be integer"),
        "nan": (torch.full((hidden,), float("nan")), codes, "x_vector must be a finite float32"),
        "width": (torch.zeros(hidden + 1), codes, "x_vector must be"),
    }
    for name, (x_vector, ref_codes, problem) in crafted.items():
        path = tmp_path / f"{name}.safetensors"
        save_file({"x_vector": x_vector.contiguous(), "ref_codes": ref_codes.contiguous()}, str(path), metadata=meta)
        with pytest.raises(VoiceError, match=problem) as info:
            tts.load_voice(path)
        assert str(path) in str(info.value)
    # A Voice object built in Python is checked the same way before it reaches the model.
    with pytest.raises(VoiceError, match="voice: ref_codes hold values"):
        tts.synthesize("Hi.", voice=omnitts.Voice(good.x_vector, codes + 2048, REF_TEXT, checkpoint=tts.identity),
                       max_frames=3)
    lines = [{"id": "a", "text": "Fine line.", "voice": "good.safetensors"},
             {"id": "b", "text": "Crafted line.", "voice": "too_high.safetensors"},
             {"id": "c", "text": "Fine again.", "voice": "good.safetensors"}]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = runner.invoke(app, ["synth", str(tmp_path / "m.jsonl"), "-m", str(ckpt_dir("base")), "-o",
                                 str(tmp_path / "o"), "--greedy", "--max-frames", "3", "-q"])
    assert result.exit_code == 1, result.output
    records = {r["id"]: r for r in map(json.loads, (tmp_path / "o" / "results.jsonl").read_text().splitlines())}
    assert records["a"]["status"] == records["c"]["status"] == "ok"
    assert records["b"]["status"] == "error" and "too_high.safetensors: ref_codes hold values" in records["b"]["error"]
    assert (tmp_path / "o" / "a.wav").is_file() and not (tmp_path / "o" / "b.wav").exists()


def test_cli_saved_voice_in_a_manifest_matches_ref_audio(ckpt_dir, ref_wav, tmp_path):
    model = str(ckpt_dir("base"))
    (tmp_path / "voices").mkdir()
    result = runner.invoke(app, ["voice-clone", "-m", model, "--ref-audio", str(ref_wav), "--ref-text", REF_TEXT,
                                 "--save", str(tmp_path / "voices" / "alice.safetensors")])
    assert result.exit_code == 0, result.output
    assert "saved voice" in result.output and not list((tmp_path / "voices").glob(".*.tmp"))
    rows = {"by_voice": {"voice": "voices/alice.safetensors"},
            "by_ref": {"ref_audio": str(ref_wav), "ref_text": REF_TEXT}}
    for name, fields in rows.items():
        (tmp_path / f"{name}.jsonl").write_text(json.dumps({"id": "a", "text": "Cloned line.", **fields}) + "\n")
        result = runner.invoke(app, ["synth", str(tmp_path / f"{name}.jsonl"), "-m", model, "-o",
                                     str(tmp_path / name), "--greedy", "--max-frames", "5", "-q"])
        assert result.exit_code == 0, result.output
    by_voice, rate = sf.read(tmp_path / "by_voice" / "a.wav")
    by_ref, _ = sf.read(tmp_path / "by_ref" / "a.wav")
    assert rate == 24000 and by_voice.shape == (5 * 1920,)
    np.testing.assert_array_equal(by_voice, by_ref)
    # An upper-case suffix, which the manifest's voice field takes, is one --save takes too (it was refused)
    result = runner.invoke(app, ["voice-clone", "-m", model, "--ref-audio", str(ref_wav), "--ref-text", REF_TEXT,
                                 "--save", str(tmp_path / "voices" / "BOB.SAFETENSORS")])
    assert result.exit_code == 0, result.output
    (tmp_path / "upper.jsonl").write_text(json.dumps({"id": "a", "text": "Cloned line.",
                                                      "voice": "voices/BOB.SAFETENSORS"}) + "\n")
    result = runner.invoke(app, ["synth", str(tmp_path / "upper.jsonl"), "-m", model, "-o", str(tmp_path / "upper"),
                                 "--greedy", "--max-frames", "5", "-q"])
    assert result.exit_code == 0, result.output
    np.testing.assert_array_equal(sf.read(tmp_path / "upper" / "a.wav")[0], by_ref)


def test_cli_voice_from_another_checkpoint_is_a_bad_line(ckpt_dir, other_base, ref_wav, tmp_path):
    """Found by the manifest check (validate, and synth before the model loads), recorded as the line's error."""
    voice = tmp_path / "v.safetensors"
    result = runner.invoke(app, ["voice-clone", "-m", str(other_base), "--ref-audio", str(ref_wav),
                                 "--x-vector-only", "--save", str(voice)])
    assert result.exit_code == 0, result.output
    (tmp_path / "m.jsonl").write_text(json.dumps({"id": "a", "text": "Hi.", "voice": "v.safetensors"}) + "\n")
    result = runner.invoke(app, ["synth", str(tmp_path / "m.jsonl"), "-m", str(ckpt_dir("base")), "-o",
                                 str(tmp_path / "o"), "--max-frames", "4", "-q"])
    assert result.exit_code == 2 and "m.jsonl:1: voice: " in result.output  # nothing left to run
    record = json.loads((tmp_path / "o" / "results.jsonl").read_text().splitlines()[0])
    assert record["status"] == "error" and "made with checkpoint" in record["error"] and str(voice) in record["error"]


def test_cli_text_writes_a_playable_file_and_the_voice(ckpt_dir, ref_wav, tmp_path):
    out, voice = tmp_path / "hello.flac", tmp_path / "v.safetensors"
    result = runner.invoke(app, ["voice-clone", "-m", str(ckpt_dir("base")), "--ref-audio", str(ref_wav),
                                 "--x-vector-only", "--text", "Hello there.", "-o", str(tmp_path), "--id", "hello",
                                 "--format", "flac", "--language", "english", "--greedy", "--max-frames", "6",
                                 "--save", str(voice)])
    assert result.exit_code == 0, result.output
    # (finish_reason "length" read as a word of the line: the budget is named)
    assert f"wrote {out} (0.48 s, 6 frames, cut at the frame budget; x-vector only voice)" in result.output, result.output
    audio, rate = sf.read(out)
    assert rate == 24000 and audio.shape == (6 * 1920,) and np.abs(audio).max() > 0
    assert load_voice(voice)[1]["mode"] == "x_vector_only"


@pytest.fixture(scope="module")
def bad_clips(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bad")
    sf.write(folder / "silent.wav", np.zeros(24000, dtype=np.float32), 24000)
    sf.write(folder / "short.wav", 0.3 * np.sin(np.arange(2400) / 5).astype(np.float32), 24000)
    (folder / "junk.wav").write_bytes(b"RIFF not really a wav")
    (folder / "text.wav").write_text("not audio at all")  # every decoder refuses it, audioread without a word
    (folder / "empty.wav").write_bytes(b"")
    nan = 0.3 * np.sin(np.arange(24000) / 5).astype(np.float32)
    nan[12000] = np.nan
    sf.write(folder / "nan.wav", nan, 24000, subtype="FLOAT")
    return folder


@pytest.mark.parametrize("case, problem", [
    ("silent", "reference audio is silent"),
    ("short", "reference audio is 0.10 s long"),
    ("junk", "cannot read audio"),
    ("text", "cannot read audio (not a format soundfile or audioread decodes)"),
    ("empty", "reference audio file is empty (0 bytes)"),
    ("missing", "reference audio file not found"),
    ("device", "/dev/null: reference audio is not a regular file (a device or a pipe)"),  # was "file not found"
    ("long_name", "cannot read audio (File name too long)"),  # it was "error: None: cannot write (...)"
    # as validate says it; it was librosa's "cannot read audio (ParameterError: Audio buffer is not finite everywhere)"
    ("nan", "nan.wav: reference audio contains NaN or infinite samples"),
    ("non_base", "voice cloning needs a Base checkpoint"),
    ("no_ref_text", "--ref-text is required"),
    ("no_action", "nothing to do"),
    ("out_alone", "--text and -o go together"),  # -o DIR with no --text: it was "nothing to do: give ..."
    ("surrogate", r"--ref-text: a lone surrogate '\udced' at character 2 is not text"),  # --ref-text $'a\xed\xa0\x80b'
])
def test_cli_errors_are_one_line_with_exit_code_2(ckpt_dir, ref_wav, bad_clips, tmp_path, case, problem):
    ref = {"silent": bad_clips / "silent.wav", "short": bad_clips / "short.wav", "junk": bad_clips / "junk.wav",
           "text": bad_clips / "text.wav", "empty": bad_clips / "empty.wav", "missing": bad_clips / "nope.wav",
           "long_name": bad_clips / ("n" * 300 + ".wav"), "nan": bad_clips / "nan.wav",
           "device": Path("/dev/null")}.get(case, ref_wav)
    model = ckpt_dir("custom_voice" if case == "non_base" else "base")
    args = ["voice-clone", "-m", str(model), "--ref-audio", str(ref)]
    args += {"no_ref_text": [], "surrogate": ["--ref-text", "a\udced\udca0\udc80b"]}.get(case, ["--ref-text", REF_TEXT])
    args += {"no_action": [], "out_alone": ["-o", str(tmp_path / "o")]}.get(case, ["--save", str(tmp_path / "v.safetensors")])
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and problem in lines[0], result.output
    assert not (tmp_path / "v.safetensors").exists()


def test_cli_text_refuses_to_write_over_its_reference_clip(ckpt_dir, ref_wav, tmp_path, monkeypatch):
    """`--ref-audio clips/clone.wav --text ... -o clips` wrote the spoken audio over the reference clip (the default
    --id is clone)."""
    import shutil

    import omnitts.api

    monkeypatch.setattr(omnitts.api, "load", lambda *a, **k: pytest.fail("the model loaded"))
    shutil.copy(ref_wav, tmp_path / "clone.wav")
    result = runner.invoke(app, ["voice-clone", "-m", str(ckpt_dir("base")), "--ref-audio", str(tmp_path / "clone.wav"),
                                 "--x-vector-only", "--text", "Hi.", "-o", str(tmp_path)], env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    assert result.output == (f"error: -o {tmp_path} --id clone: {tmp_path / 'clone.wav'} is the reference clip "
                             "(--ref-audio), which the spoken audio would replace; give another --id or -o\n")
    assert (tmp_path / "clone.wav").read_bytes() == ref_wav.read_bytes()


def test_cli_text_leaves_no_empty_out_when_the_checkpoint_fails_to_load(ckpt_dir, ref_wav, tmp_path, monkeypatch):
    """-o is made before the model loads (to refuse one that cannot be made first); a checkpoint that then failed
    to load left the new, empty folder behind. A folder that was there is kept."""
    import omnitts.api

    def broken(*args, **kwargs):
        raise CheckpointError("model.safetensors: tensor talker.x is unreadable")

    monkeypatch.setattr(omnitts.api, "load", broken)
    (tmp_path / "there").mkdir()
    for out in (tmp_path / "new" / "deeper", tmp_path / "there"):
        result = runner.invoke(app, ["voice-clone", "-m", str(ckpt_dir("base")), "--ref-audio", str(ref_wav),
                                     "--x-vector-only", "--text", "Hi.", "-o", str(out)])
        assert result.exit_code == 2 and result.output == "error: model.safetensors: tensor talker.x is unreadable\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["there"]


@pytest.mark.parametrize("given, flag", [
    (["--seed", "3"], "--seed"), (["--greedy"], "--greedy"), (["--max-frames", "5"], "--max-frames"),
    (["--language", "english"], "--language"), (["--id", "clone"], "--id"), (["--format", "wav"], "--format"),
    (["--official-tokenizer"], "--official-tokenizer")])
def test_cli_save_alone_refuses_the_options_of_text(ckpt_dir, ref_wav, tmp_path, monkeypatch, given, flag):
    """`voice-clone --save v.safetensors --seed 3` (or --greedy, --id, ...) saved the voice and ignored them unsaid:
    only --text's synthesis reads them, even given at their default."""
    import omnitts.api

    monkeypatch.setattr(omnitts.api, "load", lambda *a, **k: pytest.fail("the model loaded"))
    result = runner.invoke(app, ["voice-clone", "-m", str(ckpt_dir("base")), "--ref-audio", str(ref_wav),
                                 "--x-vector-only", "--save", str(tmp_path / "v.safetensors"), *given],
                           env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    assert result.output == (f'error: {flag} goes with --text "..." -o DIR (it is for the spoken audio); --save alone '
                             "speaks nothing\n"), result.output
    assert not (tmp_path / "v.safetensors").exists()


@pytest.mark.parametrize("given, problem", [
    (["--text", " "], "--text: empty; give the words to speak"),
    (["--text", "Hi.", "--language", "klingon"], "--language: 'klingon' is not known to this checkpoint"),
    (["--text", "a\udced\udca0\udc80b"], r"--text: a lone surrogate '\udced' at character 2 is not text"),
])
def test_cli_text_errors_name_the_flag_not_the_manifest_field(ckpt_dir, ref_wav, tmp_path, monkeypatch, given,
                                                              problem):
    """voice-clone said "error: language: 'klingon' is not known...", the manifest field's name, for --language."""
    import omnitts.api

    monkeypatch.setattr(omnitts.api, "load", lambda *a, **k: pytest.fail("the model loaded"))
    result = runner.invoke(app, ["voice-clone", "-m", str(ckpt_dir("base")), "--ref-audio", str(ref_wav),
                                 "--x-vector-only", "-o", str(tmp_path / "o"), *given], env={"COLUMNS": "300"})
    assert result.exit_code == 2 and result.output.startswith(f"error: {problem}"), result.output
    assert result.output.count("\n") == 1, result.output


@pytest.mark.parametrize("save, problem", [
    ("afile/v.safetensors", "--save {t}/afile/v.safetensors: {t}/afile is a file, not a directory"),
    ("afile/sub/v.safetensors", "--save {t}/afile/sub/v.safetensors: {t}/afile is a file, not a directory"),
    ("folder.safetensors", "--save {t}/folder.safetensors: is a directory; give the voice file's name"),
    ("n" * 300 + ".safetensors", "--save {t}/" + "n" * 300 + ".safetensors: File name too long"),  # a traceback
])
def test_cli_save_where_no_file_can_be_is_one_line_before_the_model_loads(ckpt_dir, ref_wav, tmp_path, monkeypatch,
                                                                          save, problem):
    """A file in the way of --save's folder said "cannot write the voice file (File exists)", after cloning."""
    import omnitts.api

    (tmp_path / "afile").write_text("a file")
    (tmp_path / "folder.safetensors").mkdir()
    monkeypatch.setattr(omnitts.api, "load", lambda *a, **k: pytest.fail("the model loaded"))
    result = runner.invoke(app, ["voice-clone", "-m", str(ckpt_dir("base")), "--ref-audio", str(ref_wav), "--ref-text",
                                 REF_TEXT, "--save", str(tmp_path / save)], env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: " + problem.format(t=tmp_path)) and result.output.count("\n") == 1, \
        result.output


@pytest.mark.parametrize("save", ["afile/v.safetensors", "afile/sub/v.safetensors"])
def test_voice_save_under_a_file_names_the_file_in_the_way(tts_factory, ref_wav, tmp_path, save):
    """`Voice.save` into a folder that is a file said "cannot write the voice file (File exists)" (or "Not a
    directory"): as --save says it, the file in the way is named."""
    (tmp_path / "afile").write_text("a file")
    voice = tts_factory("base").clone_voice(ref_wav, x_vector_only=True)
    with pytest.raises(VoiceError, match=rf"^{re.escape(str(tmp_path / save))}: {re.escape(str(tmp_path / 'afile'))} is "
                                         r"a file, not a directory; nothing was written$"):
        voice.save(tmp_path / save)
    assert (tmp_path / "afile").read_text() == "a file"


def test_a_voice_shows_as_one_line(tts_factory, ref_wav):
    tts = tts_factory("base")
    icl, xvec = tts.clone_voice(ref_wav, REF_TEXT), tts.clone_voice(ref_wav, x_vector_only=True)
    assert repr(icl) == (f"Voice(in-context, {len(icl.ref_codes)} reference frames, ref_text={REF_TEXT!r}, "
                         f"checkpoint={tts.identity!r})")
    assert repr(xvec) == f"Voice(x-vector only, checkpoint={tts.identity!r})"
    # A long transcript (one of a 30 s clip, hundreds of characters) filled the cell as the tensors would have
    long = tts.clone_voice(ref_wav, "word " * 200)
    assert repr(long) == (f"Voice(in-context, {len(long.ref_codes)} reference frames, ref_text={('word ' * 12)!r}... "
                          f"(1,000 characters), checkpoint={tts.identity!r})")


def test_voices_compare_by_what_they_speak_saved_and_loaded_alike(tts_factory, ref_wav, tmp_path):
    """`voice == tts.load_voice(path)` (or `voice in voices`) raised "RuntimeError: Boolean value of Tensor with
    more than one value is ambiguous" (the dataclass's == of tensors). Voices compare by embedding, reference codes,
    transcript and checkpoint; the file's meta (when it was saved) does not count."""
    tts = tts_factory("base")
    icl, xvec = tts.clone_voice(ref_wav, REF_TEXT), tts.clone_voice(ref_wav, x_vector_only=True)
    loaded = tts.load_voice(icl.save(tmp_path / "v.safetensors"))
    assert loaded.meta != icl.meta and loaded == icl and icl == tts.clone_voice(ref_wav, REF_TEXT)
    assert icl != xvec and xvec == tts.load_voice(xvec.save(tmp_path / "x.safetensors")) and xvec in [icl, xvec]
    assert icl != tts.clone_voice(ref_wav, "Other words.") and icl != "v.safetensors"
    other = tts.clone_voice((0.5 * sf.read(ref_wav)[0], 24000), REF_TEXT)
    assert other != icl and other.x_vector.shape == icl.x_vector.shape


@pytest.fixture(scope="module")
def long_clip(tmp_path_factory):
    """A 31 s clip (16 kHz): over the 30 s a reference may be; x-vector-only cloning uses its first 30 s."""
    path = tmp_path_factory.mktemp("long") / "long.wav"
    t = np.arange(16000 * 31) / 16000
    sf.write(path, (0.3 * np.sin(2 * np.pi * 180 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))).astype(np.float32),
             16000)
    return path


def test_paths_may_start_with_a_tilde(tts_factory, ref_wav, tmp_path, monkeypatch):
    """`~` is the home folder in every path the library takes (as in `omnitts.load`): it was taken literally, so
    load_voice said "not found" and saving made a folder named `~` in the current directory."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir(), cwd.mkdir()
    shutil.copy(ref_wav, home / "ref.wav")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    tts = tts_factory("base")
    voice = tts.clone_voice("~/ref.wav", REF_TEXT)
    assert voice.save("~/voices/v.safetensors") == home / "voices" / "v.safetensors"
    assert load_voice("~/voices/v.safetensors")[0].ref_text == REF_TEXT
    assert tts.load_voice("~/voices/v.safetensors").ref_text == REF_TEXT
    audio = tts.synthesize("Hi.", voice="~/voices/v.safetensors", greedy=True, max_frames=2)
    assert audio.save("~/out/a.wav") == home / "out" / "a.wav" and (home / "out" / "a.wav").is_file()
    lines = [{"id": "a", "text": "Hi.", "voice": "~/voices/v.safetensors"},  # manifest fields: the same
             {"id": "b", "text": "Hi.", "ref_audio": "~/ref.wav", "x_vector_only": True}]
    assert sorted(a.id for a in tts.stream(lines, greedy=True, max_frames=2)) == ["a", "b"]
    result = runner.invoke(app, ["voice-clone", "-m", str(tts.ckpt.path), "--ref-audio", "~/ref.wav", "--x-vector-only",
                                 "--save", "~/voices/cli.safetensors", "--text", "Hi.", "-o", "~/cli", "--max-frames",
                                 "2"])  # quoted on a command line: the shell leaves `~` alone
    assert result.exit_code == 0, result.output
    assert (home / "voices" / "cli.safetensors").is_file() and (home / "cli" / "clone.wav").is_file()
    (home / "run").mkdir()
    (home / "run" / "results.jsonl").write_text('{"id": "a", "status": "error", "error": "x"}\n')
    assert omnitts.read_results("~/run")["a"]["status"] == "error"  # it said "no such output directory"
    assert not (cwd / "~").exists()


def test_a_checkpoint_loaded_by_a_relative_path_still_works_after_the_folder_changes(ckpt_dir, ref_wav, monkeypatch,
                                                                                      tmp_path):
    """A notebook loads `omnitts.load("ckpts/base")`, then changes folder (`%cd`, `os.chdir`): the checkpoint's
    identity (read when the first voice is cloned) and `info()` read its files by the path as given, so cloning
    failed "ckpts/base/config.json: cannot read (No such file or directory)". The path is the folder it named."""
    folder = ckpt_dir("base")
    monkeypatch.chdir(folder.parent)
    tts = omnitts.load(folder.name, dtype="float32")
    monkeypatch.chdir(tmp_path)
    voice = tts.clone_voice(ref_wav, REF_TEXT)
    assert voice.checkpoint == checkpoint_identity(folder)
    assert tts.info()["kind"] == "base"
    assert tts.ckpt.path == folder


def test_an_empty_path_is_refused_by_the_library_naming_it_not_read_as_the_current_folder(tts_factory, ref_wav,
                                                                                             tmp_path, monkeypatch):
    """pathlib reads "" as ".": `read_results("")` read the current folder's results.jsonl, and `clone_voice("")`
    or `synthesize(voice="")` looked for a clip or a voice in the current folder. As the commands do, the library
    refuses an empty path, naming the argument or field."""
    from omnitts.errors import RequestError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "results.jsonl").write_text('{"id": "a", "status": "error", "error": "x"}\n')
    tts = tts_factory("base")
    empty = "empty path (not read as the current folder)"
    for call, name in ((lambda: omnitts.read_results(""), "out"), (lambda: omnitts.load(""), "path"),
                       (lambda: tts.clone_voice("", REF_TEXT), "ref_audio"), (lambda: tts.load_voice(""), "path"),
                       (lambda: load_voice(""), "path"),
                       (lambda: tts.clone_voice(ref_wav, REF_TEXT).save(""), "path")):
        with pytest.raises(ValueError, match=re.escape(f"{name}: {empty}")):
            call()
    for fields, name in (({"ref_audio": "", "ref_text": REF_TEXT}, "ref_audio"), ({"voice": " "}, "voice")):
        with pytest.raises(RequestError, match=f"^{name}: empty; give the path of"):
            tts.synthesize("Hi.", max_frames=2, **fields)
    audio = tts.synthesize("Hi.", ref_audio=ref_wav, x_vector_only=True, greedy=True, max_frames=2)
    with pytest.raises(ValueError, match=re.escape(f"path: {empty}")):
        audio.save("")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.jsonl"]


def test_a_url_is_refused_as_a_url_not_looked_for_as_a_file(tts_factory, tmp_path):
    """The official package downloads a `ref_audio` URL; omnitts runs offline, and pathlib kept a URL as a path of
    one slash less: `clone_voice("https://host/a.wav")` said "https:/host/a.wav: reference audio file not found", a
    manifest line looked for it beside the manifest. A URL (or a data: URI) is refused as such, naming the field."""
    from omnitts.batch.manifest import parse_item
    from omnitts.errors import RequestError

    tts = tts_factory("base")
    url, problem = "https://example.com/a.wav", "is a URL; omnitts reads local files only"
    with pytest.raises(ValueError, match=re.escape(f"ref_audio: {url!r} {problem}")):
        tts.clone_voice(url, x_vector_only=True)
    with pytest.raises(ValueError, match=re.escape(f"path: 'https://huggingface.co/Qwen/x' {problem}")):
        omnitts.load("https://huggingface.co/Qwen/x")
    for fields in ({"ref_audio": url, "x_vector_only": True}, {"voice": "s3://bucket/v.safetensors"},
                   {"ref_audio": "data:audio/wav;base64,UklGRiQAAAB=", "ref_text": REF_TEXT}):
        name = next(iter(fields))
        with pytest.raises(RequestError, match=rf"^{name}: '[^']+' {problem}"):
            tts.synthesize("Hi.", max_frames=2, **fields)
        with pytest.raises(RequestError, match=rf"^{name}: '[^']+' {problem}"):
            parse_item({"id": "a", "text": "Hi.", **fields}, 1, tmp_path)


def test_integer_pcm_samples_are_scaled_as_soundfile_reads_them(tts_factory, tmp_path):
    """A (samples, rate) pair of int16 (scipy.io.wavfile's) was taken unscaled, 32768 times too loud: the voice was
    silently another. Integer PCM is scaled as soundfile scales it; integer types without a PCM meaning are refused."""
    from omnitts.errors import AudioError

    tts = tts_factory("base")
    t = np.arange(2 * 24000) / 24000
    path = tmp_path / "r.wav"
    sf.write(path, 0.3 * np.sin(2 * np.pi * 220 * t), 24000, subtype="PCM_16")
    from_file = tts.clone_voice(path, x_vector_only=True).x_vector
    for dtype in ("int16", "int32"):
        samples, rate = sf.read(path, dtype=dtype)
        torch.testing.assert_close(tts.clone_voice((samples, rate), x_vector_only=True).x_vector, from_file)
    pcm8 = np.round(0.3 * np.sin(2 * np.pi * 220 * t) * 127)
    for samples, floats in ((pcm8.astype(np.int8), pcm8 / 128), ((pcm8 + 128).astype(np.uint8), pcm8 / 128)):
        torch.testing.assert_close(tts.clone_voice((samples, 24000), x_vector_only=True).x_vector,
                                   tts.clone_voice((floats.astype(np.float32), 24000), x_vector_only=True).x_vector)
    for dtype in ("int64", "uint16"):
        with pytest.raises(AudioError, match=rf"^ref_audio: samples of dtype {dtype} are not PCM audio; give "
                                             r"float samples in \[-1, 1\], or int16, int32, int8 or uint8 PCM"):
            tts.clone_voice((pcm8.astype(dtype), 24000), x_vector_only=True)
    with pytest.raises(AudioError, match=r"^ref_audio: samples of dtype complex128 are complex; give real"):
        tts.clone_voice(((pcm8 / 128).astype(np.complex128), 24000), x_vector_only=True)  # it took the real part


def test_float_samples_on_an_integer_scale_are_refused_and_a_small_overshoot_is_taken(tts_factory, ckpt_dir,
                                                                                       tmp_path):
    """Float samples far past [-1, 1] (int16 PCM cast to float: `samples.astype(np.float32)`, or a float WAV file
    holding such values) were taken as they were, thousands of times too loud, and cloned another voice without a
    word, as unscaled int16 once did. They are refused naming the peak, by the API, `validate` and `synth` alike; a
    full-scale clip resampled or filtered (a little past 1) is taken as before."""
    from typer.testing import CliRunner

    from omnitts.cli import app
    from omnitts.errors import AudioError

    tts = tts_factory("base")
    tone = np.sin(np.arange(48000) / 10).astype(np.float32)
    pcm = np.round(0.3 * tone * 32767)
    problem = (r"float samples peak at 9830; audio is in \[-1, 1\] \(integer PCM cast to or stored as float\? divide "
               r"int16 values by 32768, or give the integer samples themselves\)")
    for samples in (pcm.astype(np.float32), pcm.astype(np.float64), np.stack([pcm, pcm], axis=1)):
        with pytest.raises(AudioError, match=rf"^ref_audio: {problem}$"):
            tts.clone_voice((samples, 24000), x_vector_only=True)
        with pytest.raises(AudioError, match=rf"^ref_audio: {problem}$"):
            tts.synthesize("Hi.", ref_audio=(samples, 24000), x_vector_only=True, max_frames=2)
    path = tmp_path / "float.wav"
    sf.write(path, pcm, 24000, subtype="FLOAT")
    with pytest.raises(AudioError, match=rf"^ref_audio: {re.escape(str(path))}: {problem}$"):
        tts.clone_voice(path, x_vector_only=True)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"id": "a", "text": "Hi.", "ref_audio": str(path), "x_vector_only": True}) + "\n")
    result = CliRunner().invoke(app, ["validate", str(manifest), "-m", str(ckpt_dir("base"))])
    assert result.exit_code != 0 and "float samples peak at 9830" in result.output, result.output
    assert tts.clone_voice((pcm.astype(np.int16), 24000), x_vector_only=True) is not None  # PCM itself: scaled
    assert tts.clone_voice((1.05 * tone, 24000), x_vector_only=True) is not None


def test_a_voice_that_its_file_could_not_hold_is_refused_at_save_and_use(tts_factory, ref_wav, tmp_path):
    """An in-context voice without its transcript spoke from an empty one, and saved a file `load_voice` refused;
    an x_vector that is a numpy array failed with AttributeError ('numpy.ndarray' has no attribute 'dim')."""
    from dataclasses import replace

    tts = tts_factory("base")
    voice = tts.clone_voice(ref_wav, REF_TEXT)
    for ref_text in (None, "  "):
        bad = replace(voice, ref_text=ref_text)
        with pytest.raises(VoiceError, match=r"v.safetensors: an icl voice needs its ref_text, the transcript of its "
                                             rf"reference codes \(got {ref_text!r}\)$"):
            bad.save(tmp_path / "v.safetensors")
        with pytest.raises(VoiceError, match=r"^voice: an icl voice needs its ref_text"):
            tts.synthesize("Hi.", voice=bad, max_frames=2)
    assert not (tmp_path / "v.safetensors").exists()
    numpy_voice = replace(voice, x_vector=voice.x_vector.numpy())
    with pytest.raises(VoiceError, match=r"^voice: x_vector must be a torch.Tensor, got ndarray"):
        tts.synthesize("Hi.", voice=numpy_voice, max_frames=2)
    with pytest.raises(VoiceError, match=r"v.safetensors: x_vector must be a torch.Tensor, got ndarray"):
        numpy_voice.save(tmp_path / "v.safetensors")


def test_a_voice_that_load_voice_would_refuse_is_not_saved(tts_factory, ref_wav, tmp_path):
    """save wrote voices load_voice then refused ("ref_codes must be int64 (frames, groups); got torch.int64 (0, 16)",
    a NaN or 2-D x_vector), and cut float codes to integers without a word."""
    from dataclasses import replace

    voice = tts_factory("base").clone_voice(ref_wav, REF_TEXT)
    path = tmp_path / "v.safetensors"
    for name, value, problem in (
            ("ref_codes", voice.ref_codes[:0], r"ref_codes must be integer \(frames, groups\), one frame at least; "
                                               r"got torch.int64 \(0, 16\)"),
            ("ref_codes", voice.ref_codes.double() + 0.5, r"ref_codes must be integer .* got torch.float64"),
            ("ref_codes", voice.ref_codes.flatten(), r"ref_codes must be integer"),
            ("x_vector", torch.full_like(voice.x_vector, float("nan")), r"x_vector must be a vector of finite float32"),
            ("x_vector", voice.x_vector.double() * 1e300, r"x_vector must be a vector of finite float32 values; got "
                                                          r"torch.float64"),
            ("x_vector", voice.x_vector[None], r"x_vector must be a vector .* got torch.float32 \(1, \d+\)$")):
        with pytest.raises(VoiceError, match=rf"^{re.escape(str(path))}: {problem}"):
            replace(voice, **{name: value}).save(path)
    assert not path.exists()
    assert load_voice(voice.save(path))[0].ref_codes.shape == voice.ref_codes.shape


def test_a_stream_dict_takes_paths_as_path_objects(tts_factory, ref_wav, tmp_path):
    """A dict's ref_audio or voice given as a Path (which the dict's own check lets through as a file's path) was
    "requests[0]: voice: expected str, got PosixPath"."""
    tts = tts_factory("base")
    voice = tts.clone_voice(ref_wav, REF_TEXT).save(tmp_path / "v.safetensors")
    lines = [{"id": "a", "text": "Hi.", "voice": voice}, {"id": "b", "text": "Hi.", "voice": str(voice)},
             {"id": "c", "text": "Hi.", "ref_audio": ref_wav, "ref_text": REF_TEXT},
             {"id": "d", "text": "Hi.", "ref_audio": str(ref_wav), "ref_text": REF_TEXT}]
    codes = {a.id: a.codes for a in tts.stream(lines, greedy=True, max_frames=2)}
    assert np.array_equal(codes["a"], codes["b"]) and np.array_equal(codes["c"], codes["d"])


def test_a_voice_given_as_any_path_like_object_is_read_as_its_file(tts_factory, ref_wav, tmp_path):
    """`voice=` an os.PathLike that is not a pathlib.Path (which `check_request` lets through as a path) raised
    "AttributeError: 'PathLike' object has no attribute 'checkpoint'" from synthesize and stream: it was taken for
    a Voice."""
    import os

    class PathLike(os.PathLike):
        def __init__(self, path):
            self.path = str(path)

        def __fspath__(self):
            return self.path

    tts = tts_factory("base")
    saved = tts.clone_voice(ref_wav, REF_TEXT).save(tmp_path / "v.safetensors")
    alone = tts.synthesize("Hi.", voice=PathLike(saved), greedy=True, max_frames=2)
    streamed = next(tts.stream([omnitts.Request("Hi.", voice=PathLike(saved))], greedy=True, max_frames=2))
    expected = tts.synthesize("Hi.", voice=saved, greedy=True, max_frames=2)
    assert np.array_equal(alone.codes, expected.codes) and np.array_equal(streamed.codes, expected.codes)


def test_voice_and_checkpoint_files_follow_the_umask(tts_factory, ckpt_dir, ref_wav, tmp_path):
    """safetensors writes a new file of mode 0600: voice files (and the test and demo checkpoints' weights) were
    private while audio files got 0666 less the umask."""
    import os

    mask = os.umask(0o002)
    try:
        voice = tts_factory("base").clone_voice(ref_wav, x_vector_only=True)
        assert voice.save(tmp_path / "v.safetensors").stat().st_mode & 0o777 == 0o664
    finally:
        os.umask(mask)
    for path in (ckpt_dir("base") / "model.safetensors", ckpt_dir("base") / "speech_tokenizer" / "model.safetensors"):
        assert path.stat().st_mode & 0o777 == 0o666 & ~mask, path


def test_a_long_clip_warns_once_at_the_callers_line(tts_factory, long_clip):
    """The warning pointed at a line of omnitts (api.py); it names the call that made it."""
    tts = tts_factory("base")
    with pytest.warns(UserWarning, match=r"longer than 30 s; its first 30 s are used") as caught:
        tts.clone_voice(long_clip, x_vector_only=True)
    assert len(caught) == 1 and caught[0].filename == __file__, [(w.filename, w.lineno) for w in caught]
    with pytest.warns(UserWarning, match=r"longer than 30 s") as caught:  # through the engine's pipeline too
        tts.synthesize("Hi.", ref_audio=long_clip, x_vector_only=True, greedy=True, max_frames=2)
    assert {w.filename for w in caught} == {__file__}, [(w.filename, w.lineno) for w in caught]


def test_cli_long_clip_warns_once_in_a_warning_line(ckpt_dir, long_clip, tmp_path):
    """The clip is read before the model loads and again when it is cloned: the warning showed twice, as Python's
    two-line warnings with a source line. It is one `warning:` line."""
    import sys
    import warnings

    def shown(message, category, filename, lineno, file=None, line=None):  # as Python shows it outside pytest
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    with warnings.catch_warnings():
        warnings.showwarning = shown
        result = runner.invoke(app, ["voice-clone", "-m", str(ckpt_dir("base")), "--ref-audio", str(long_clip),
                                     "--x-vector-only", "--save", str(tmp_path / "v.safetensors")])
    assert result.exit_code == 0, result.output
    said = [line for line in result.output.splitlines() if "longer than 30 s" in line]
    assert said == [(f"warning: {long_clip}: reference audio is longer than 30 s; its first 30 s are used for the "
                     "speaker embedding")], result.output
    assert "UserWarning" not in result.output


def test_cli_long_clip_in_context_is_refused_in_the_commands_flags(ckpt_dir, long_clip, tmp_path, monkeypatch):
    """voice-clone said "trim the clip (and its ref_text) ..., or set x_vector_only", the manifest's fields."""
    import omnitts.api

    monkeypatch.setattr(omnitts.api, "load", lambda *a, **k: pytest.fail("the model loaded"))
    result = runner.invoke(app, ["voice-clone", "-m", str(ckpt_dir("base")), "--ref-audio", str(long_clip),
                                 "--ref-text", REF_TEXT, "--save", str(tmp_path / "v.safetensors")],
                           env={"COLUMNS": "300"})
    assert result.exit_code == 2 and result.output == (
        f"error: {long_clip}: reference audio is longer than 30 s; in-context cloning needs the transcript of exactly "
        "the audio used: trim the clip (and its --ref-text) to at most 30 s, or use --x-vector-only\n"), result.output


@pytest.mark.parametrize("workers", [pytest.param([], id="one-process"),
                                     pytest.param(["--workers", "2"], id="workers", marks=pytest.mark.slow)])
def test_synth_says_a_long_clip_once_in_a_warning_line(ckpt_dir, long_clip, tmp_path, workers):
    """Lines cloning from one clip over 30 s: the warning was Python's, with a library source line (and from
    worker processes, each its own); it is one `warning:` line per clip, whichever process read it."""
    import json
    import sys
    import warnings

    def shown(message, category, filename, lineno, file=None, line=None):  # as Python shows it outside pytest
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"id": f"l{i}", "text": "Hello.", "ref_audio": str(long_clip),
                                            "x_vector_only": True}) + "\n" for i in range(3)))
    with warnings.catch_warnings():
        warnings.showwarning = shown
        result = runner.invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("base")), "-o", str(tmp_path / "out"),
                                     "--max-frames", "2", "-q", *workers])
    assert result.exit_code == 0, result.output
    said = [line for line in result.output.splitlines() if "longer than 30 s" in line]
    assert said == [(f"warning: {long_clip}: reference audio is longer than 30 s; its first 30 s are used for the "
                     "speaker embedding")], result.output
    assert "UserWarning" not in result.output


def test_cli_text_says_the_seed_that_reproduces_it(ckpt_dir, ref_wav, tmp_path):
    """An unseeded --text run drew a seed it did not say; the line gives it, and --seed with it gives the same audio."""
    import re

    args = ["voice-clone", "-m", str(ckpt_dir("base")), "--ref-audio", str(ref_wav), "--x-vector-only", "--text",
            "Hello there.", "-o", str(tmp_path), "--max-frames", "3"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    seed = re.search(r"x-vector only voice; seed (\d+)\)$", first.output.strip())
    assert seed, first.output
    again = runner.invoke(app, args + ["--seed", seed[1], "--id", "again"])
    assert again.exit_code == 0 and f"; seed {seed[1]})" in again.output, again.output
    np.testing.assert_array_equal(sf.read(tmp_path / "again.wav")[0], sf.read(tmp_path / "clone.wav")[0])
    greedy = runner.invoke(app, args + ["--greedy", "--id", "greedy"])
    assert greedy.exit_code == 0 and "; seed" not in greedy.output, greedy.output  # nothing drawn


@pytest.mark.parametrize("where", ["file", "under_file", "proc", "checkpoint"])
def test_cli_out_that_cannot_be_a_directory_fails_before_the_model_loads(ckpt_dir, ref_wav, tmp_path, monkeypatch,
                                                                        where):
    """-o naming a file (or a path /proc refuses) failed only after loading and cloning: "p_e.py: cannot write"."""
    import omnitts.api

    loads = []
    monkeypatch.setattr(omnitts.api, "load", lambda *args, **kwargs: loads.append(args))
    (tmp_path / "p_e.py").write_text("")
    out = {"file": tmp_path / "p_e.py", "under_file": tmp_path / "p_e.py" / "sub", "proc": "/proc/omnitts-nope",
           "checkpoint": ckpt_dir("base")}[where]
    result = runner.invoke(app, ["voice-clone", "-m", str(ckpt_dir("base")), "--ref-audio", str(ref_wav),
                                 "--x-vector-only", "--text", "Hi.", "-o", str(out)], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and not loads, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: -o {out}: "), result.output
    assert {"file": "not a directory", "under_file": "not a directory", "proc": "-o is the output directory",
            "checkpoint": "is the checkpoint directory; write the outputs to a folder of their own"}[where] in lines[0]


def test_a_voice_replaces_a_voice_file_but_not_a_checkpoints_weights(tts_factory, ref_wav, tmp_path, ckpt_dir,
                                                                    monkeypatch):
    """`voice-clone --save CKPT/model.safetensors` (a slip of the tab key) wrote the voice over the checkpoint's
    weights, and Voice.save over any safetensors file; a voice file saved again, or a damaged one, is replaced."""
    from dataclasses import replace

    from safetensors.torch import save_file

    import omnitts.api

    weights = tmp_path / "model.safetensors"
    save_file({f"talker.layers.{i}.w": torch.ones(3) for i in range(4)}, weights)
    before = weights.read_bytes()
    voice = tts_factory("base").clone_voice(ref_wav, REF_TEXT)
    with pytest.raises(VoiceError, match=rf"^{re.escape(str(weights))}: holds other tensors than a voice's "
                                         r"\(talker.layers.0.w, talker.layers.1.w, talker.layers.2.w, \.\.\.: a "
                                         r"checkpoint's weights\?\), which a voice is not written over"):
        voice.save(weights)
    monkeypatch.setattr(omnitts.api, "load", lambda *a, **k: pytest.fail("the model loaded"))
    result = runner.invoke(app, ["voice-clone", "-m", str(ckpt_dir("base")), "--ref-audio", str(ref_wav), "--ref-text",
                                 REF_TEXT, "--save", str(weights)], env={"COLUMNS": "300"})
    assert result.exit_code == 2 and result.output.startswith(f"error: --save {weights}: holds other tensors"), \
        result.output
    assert weights.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]
    first = voice.save(tmp_path / "v.safetensors")
    again = replace(voice, ref_text="Other words.").save(first)  # a voice file: replaced
    assert load_voice(again)[0].ref_text == "Other words."
    (tmp_path / "damaged.safetensors").write_bytes(b"not a voice")  # a damaged voice: replaced
    assert load_voice(voice.save(tmp_path / "damaged.safetensors"))[0].ref_text == REF_TEXT


def test_a_voice_is_not_saved_over_an_audio_file(tts_factory, ref_wav, tmp_path, ckpt_dir, monkeypatch):
    """`voice-clone --ref-audio clip.safetensors --save clip.safetensors` (a clip named as a voice) wrote the voice
    over its own reference clip, as Voice.save wrote over any audio file with a voice's suffix."""
    import omnitts.api

    clip = tmp_path / "clip.safetensors"
    shutil.copy(ref_wav, clip)
    before = clip.read_bytes()
    voice = tts_factory("base").clone_voice(clip, REF_TEXT)  # it is read as the audio it is
    with pytest.raises(VoiceError, match=rf"^{re.escape(str(clip))}: is an audio file \(a reference clip\?\), which "
                                         "a voice is not written over"):
        voice.save(clip)
    monkeypatch.setattr(omnitts.api, "load", lambda *a, **k: pytest.fail("the model loaded"))
    result = runner.invoke(app, ["voice-clone", "-m", str(ckpt_dir("base")), "--ref-audio", str(clip), "--ref-text",
                                 REF_TEXT, "--save", str(clip)], env={"COLUMNS": "300"})
    assert result.exit_code == 2 and result.output.startswith(f"error: --save {clip}: is an audio file"), result.output
    assert clip.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["clip.safetensors"]


def test_a_voice_of_compact_integer_codes_speaks_as_its_int64_codes_and_bool_codes_are_refused(tts_factory, ref_wav,
                                                                                                 tmp_path):
    """A Voice whose ref_codes are int16 (an array kept compact, which Voice.save took as integer codes) failed in
    synthesis with torch's "RuntimeError: Expected tensor for argument #1 'indices' to have one of the following
    scalar types: Long, Int; but got torch.ShortTensor"; bool "codes" were saved as 0s and 1s."""
    from dataclasses import replace

    tts = tts_factory("base")
    voice = tts.clone_voice(ref_wav, REF_TEXT)
    expected = tts.synthesize("Hi.", voice=voice, greedy=True, max_frames=3)
    compact = replace(voice, ref_codes=voice.ref_codes.to(torch.int16))
    assert np.array_equal(tts.synthesize("Hi.", voice=compact, greedy=True, max_frames=3).codes, expected.codes)
    assert load_voice(compact.save(tmp_path / "v.safetensors"))[0] == voice
    flags = replace(voice, ref_codes=voice.ref_codes.bool())
    with pytest.raises(VoiceError, match=r"^voice: ref_codes must be integer \(frames, 16\) .* got torch.bool"):
        tts.synthesize("Hi.", voice=flags, max_frames=2)
    with pytest.raises(VoiceError, match=r"b.safetensors: ref_codes must be integer .* got torch.bool"):
        flags.save(tmp_path / "b.safetensors")
    assert not (tmp_path / "b.safetensors").exists()


def test_a_clip_whose_channels_cancel_is_named_so_not_merely_silent(tts_factory, ckpt_dir, tmp_path):
    """A stereo clip with one channel phase-inverted plays loud, but its channels average to zero: it was refused as
    "reference audio is silent", which named no cause, by validate, synth's check, the API and a samples pair."""
    left = (0.3 * np.sin(np.arange(24000) / 5)).astype(np.float32)
    sf.write(tmp_path / "inverted.wav", np.stack([left, -left], axis=1), 24000)
    problem = (r"reference audio is silent once its 2 channels are averaged to mono: they cancel "
               r"\(one is phase-inverted\?\)")
    tts = tts_factory("base")
    with pytest.raises(omnitts.AudioError, match=rf"^ref_audio: {re.escape(str(tmp_path))}/inverted.wav: {problem}"):
        tts.clone_voice(tmp_path / "inverted.wav", x_vector_only=True)
    with pytest.raises(omnitts.AudioError, match=rf"^ref_audio: {problem}"):
        tts.clone_voice((np.stack([left, -left], axis=1), 24000), x_vector_only=True)
    (tmp_path / "m.jsonl").write_text(json.dumps({"id": "a", "text": "Hi.", "ref_audio": "inverted.wav",
                                                  "x_vector_only": True}) + "\n")
    result = runner.invoke(app, ["validate", str(tmp_path / "m.jsonl"), "-m", str(ckpt_dir("base"))],
                           env={"COLUMNS": "300"})
    assert re.search(rf"m.jsonl:1: ref_audio: .*inverted.wav: {problem}", result.output), result.output
    sf.write(tmp_path / "quiet.wav", np.zeros((24000, 2), dtype=np.float32), 24000)  # silent in every channel
    with pytest.raises(omnitts.AudioError, match=r"quiet.wav: reference audio is silent$"):
        tts.clone_voice(tmp_path / "quiet.wav", x_vector_only=True)
