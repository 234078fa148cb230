"""Requests a checkpoint cannot serve fail before any compute, naming the field."""

from __future__ import annotations

import pytest

import omnitts
from omnitts.errors import RequestError


@pytest.mark.parametrize("kind,kwargs,message", [
    ("custom_voice", dict(speaker="bob"), r"speaker: 'bob' is not known"),
    ("custom_voice", dict(), r"speaker: required"),
    ("custom_voice", dict(speaker="ryan", language="klingon"), r"language: 'klingon' is not known"),
    ("custom_voice", dict(speaker="ryan", language="sichuan_dialect"), r"language: 'sichuan_dialect' is not known"),
    ("custom_voice", dict(speaker="ryan", instruct="Be loud."), r"instruct: 0\.6B CustomVoice checkpoints take no instruction"),
    ("voice_design", dict(speaker="ryan"), r"speaker: this voice_design checkpoint has no preset speakers"),
    ("base", dict(), r"ref_audio: this Base checkpoint clones a voice"),
    ("base", dict(instruct="Be loud.", ref_audio="x.wav", ref_text="hi"), r"instruct: Base checkpoints take no instruction"),
])
def test_impossible_requests(tts_factory, kind, kwargs, message):
    tts = tts_factory(kind)
    with pytest.raises(RequestError, match=message):
        tts.synthesize("Some words.", greedy=True, max_frames=4, **kwargs)


def test_cloning_needs_base(tts_factory, ref_wav):
    with pytest.raises(RequestError, match="voice cloning needs a Base checkpoint"):
        tts_factory("voice_design").synthesize("Hi.", ref_audio=ref_wav, ref_text="Hello.", max_frames=4)


def test_icl_needs_ref_text(tts_factory, ref_wav):
    with pytest.raises(RequestError, match="ref_text: required"):
        tts_factory("base").synthesize("Hi.", ref_audio=ref_wav, max_frames=4)


def test_empty_text(tts_factory):
    tts = tts_factory("custom_voice")
    with pytest.raises(RequestError, match="text: empty"):
        tts.synthesize("   ", speaker="ryan")
    # Characters that print as nothing (zero-width space, byte order mark, joiner) are no words either.
    with pytest.raises(RequestError, match=r"text: empty \(only invisible characters such as U\+200B\)"):
        tts.synthesize("\u200b \ufeff\u200d", speaker="ryan")
    # A word beside them is text.
    assert tts.synthesize("\u200bHi.", speaker="ryan", greedy=True, max_frames=2).frames == 2


def test_cloning_fields_on_a_checkpoint_that_does_not_clone_are_refused(tts_factory):
    """A transcript or x_vector_only without a Base checkpoint would do nothing: said, not ignored."""
    tts = tts_factory("custom_voice")
    with pytest.raises(RequestError, match=r"^ref_text: voice cloning needs a Base checkpoint; this one is custom_voice$"):
        tts.synthesize("Hi.", speaker="ryan", ref_text="Reference words.")
    with pytest.raises(RequestError, match=r"^x_vector_only: voice cloning needs a Base checkpoint"):
        tts.synthesize("Hi.", speaker="ryan", x_vector_only=True)
    assert tts.synthesize("Hi.", speaker="ryan", x_vector_only=False, greedy=True, max_frames=2).frames == 2



def test_a_voice_on_a_checkpoint_that_does_not_clone_is_named(tts_factory):
    """Also without a speaker: the voice is the mistake (it said "speaker: required" and nothing of the voice)."""
    tts = tts_factory("custom_voice")
    with pytest.raises(RequestError, match=r"^voice: voice cloning needs a Base checkpoint; this one is custom_voice$"):
        tts.synthesize("Hi.", speaker="ryan", voice="x.safetensors")
    with pytest.raises(RequestError, match=r"^voice: voice cloning needs a Base checkpoint; this one is custom_voice$"):
        tts.synthesize("Hi.", voice="x.safetensors")
    with pytest.raises(RequestError, match=r"^ref_audio: voice cloning needs a Base checkpoint"):
        tts.synthesize("Hi.", ref_audio="r.wav", ref_text="Words.")
    with pytest.raises(RequestError, match=r"^ref_text: voice cloning needs a Base checkpoint; this one is voice_design$"):
        tts_factory("voice_design").run(omnitts.Request("Hi.", ref_text="Words.", speaker="ryan"),
                                        tts.default_params(greedy=True, max_frames=2))


@pytest.mark.parametrize("kwargs,message", [
    (dict(speaker=5), "speaker: expected str, got int"),
    (dict(speaker="ryan", language=5), "language: expected str, got int"),
    (dict(speaker="ryan", instruct=["calm"]), "instruct: expected str, got list"),
    (dict(speaker="ryan", non_streaming="no"), "non_streaming: expected bool, got str"),
])
def test_keywords_of_the_wrong_type_are_refused_as_manifest_fields(tts_factory, kwargs, message):
    """They escaped as AttributeError (or were str()-ed into the prompt); the manifest's check names them."""
    with pytest.raises(RequestError, match=rf"^{message}$"):
        tts_factory("custom_voice").synthesize("Hi.", max_frames=2, **kwargs)


def test_a_customvoice_checkpoint_without_speakers_says_so(ckpt_dir):
    """The speaker error ended "choose one of " and nothing when the config lists no speakers."""
    from dataclasses import replace

    from omnitts.config import load_config
    from omnitts.request import Request
    from omnitts.text.prompt import resolve

    cfg = load_config(ckpt_dir("custom_voice"))
    cfg = replace(cfg, talker=replace(cfg.talker, spk_id={}, spk_is_dialect={}))
    for speaker, start in ((None, "speaker: required by this CustomVoice checkpoint; "),
                           ("ryan", "speaker: 'ryan' is not known to this checkpoint; ")):
        with pytest.raises(RequestError) as raised:
            resolve(cfg, Request("Hi.", speaker=speaker))
        assert str(raised.value) == start + "it names no speakers (talker_config.spk_id in its config.json is empty)"
