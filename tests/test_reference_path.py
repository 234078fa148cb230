"""The slow path's semantics: frame budget, EOS, seeds, voice cloning, decode lengths."""

from __future__ import annotations

import math

import numpy as np
import torch

from omnitts.engine.reference import decode_codes
from omnitts.io.audio import load_reference


def test_greedy_is_deterministic_and_fills_the_budget(tts_factory):
    tts = tts_factory("custom_voice")
    a = tts.synthesize("Deterministic words.", speaker="ryan", greedy=True, max_frames=12)
    b = tts.synthesize("Deterministic words.", speaker="ryan", greedy=True, max_frames=12)
    assert a.codes.shape == (12, 16) and a.finish_reason == "length"
    np.testing.assert_array_equal(a.codes, b.codes)
    assert a.audio.shape == (12 * 1920,) and a.sample_rate == 24000
    assert np.abs(a.audio).max() <= 1.0 and np.abs(a.audio).max() > 0


def test_seeded_sampling_is_reproducible_and_seed_matters(tts_factory):
    tts = tts_factory("custom_voice")
    run = lambda seed: tts.synthesize("Sampled words.", speaker="ryan", seed=seed, max_frames=8).codes  # noqa: E731
    np.testing.assert_array_equal(run(7), run(7))
    assert not np.array_equal(run(7), run(8))


def test_eos_stops_and_is_not_a_frame(tts_factory):
    tts = tts_factory("custom_voice", eos_scale=3.0)
    eos = tts.ckpt.config.talker.codec_eos_token_id
    reasons = set()
    for speaker in ("ryan", "vivian", "serena", "aiden"):
        r = tts.synthesize("Stop when the model says so.", speaker=speaker, greedy=True, max_frames=200)
        reasons.add(r.finish_reason)
        assert eos not in r.codes[:, 0]
        assert r.frames >= 2  # EOS is banned until the third codebook-0 token (official min_new_tokens=2)
        assert (r.codes[:, 0] < 2048).all() and (r.codes < 2048).all()  # control codes are suppressed
    assert "eos" in reasons


def test_codec_decode_is_causal(tts_factory):
    """Decoding a prefix equals the prefix of the full decode: the basis for exact streaming later."""
    tts = tts_factory("custom_voice")
    codes = torch.from_numpy(tts.synthesize("Causal check.", speaker="ryan", greedy=True, max_frames=10).codes)
    full = decode_codes(tts.ckpt, codes)
    part = decode_codes(tts.ckpt, codes[:6])
    np.testing.assert_allclose(part, full[: len(part)], atol=1e-5)


def test_voice_clone_icl_cuts_reference_and_reuses_voice(tts_factory, ref_wav):
    tts = tts_factory("base")
    voice = tts.clone_voice(ref_wav, ref_text="The reference transcript.")
    resampled = load_reference(ref_wav, 24000)  # 2.0 s at 22.05 kHz -> 48001 samples at 24 kHz
    frames = math.ceil(len(resampled) / 1920)
    assert voice.ref_codes.shape == (frames, 16)
    assert voice.x_vector.shape == (tts.ckpt.config.talker.hidden_size,)
    direct = tts.synthesize("Cloned speech.", ref_audio=ref_wav, ref_text="The reference transcript.",
                            greedy=True, max_frames=10)
    reused = tts.synthesize("Cloned speech.", voice=voice, greedy=True, max_frames=10)
    np.testing.assert_array_equal(direct.codes, reused.codes)
    # The reference frames + 10 generated are decoded together; the reference share is cut.
    total = (frames + 10) * 1920
    assert len(direct.audio) == total - int(frames / (frames + 10) * total)


def test_x_vector_only_differs_from_icl(tts_factory, ref_wav):
    tts = tts_factory("base")
    icl = tts.synthesize("Same words.", ref_audio=ref_wav, ref_text="Reference.", greedy=True, max_frames=8)
    xvec = tts.synthesize("Same words.", ref_audio=ref_wav, x_vector_only=True, greedy=True, max_frames=8)
    assert len(xvec.audio) == 8 * 1920
    assert not np.array_equal(icl.codes, xvec.codes)


def test_text_modes_differ(tts_factory):
    tts = tts_factory("voice_design", "tiny-1.7b")
    a = tts.synthesize("Two text modes.", instruct="Calm.", greedy=True, max_frames=8)
    b = tts.synthesize("Two text modes.", instruct="Calm.", greedy=True, max_frames=8, non_streaming=False)
    assert not np.array_equal(a.codes, b.codes)


def test_runaway_guard_bounds_requests_without_a_budget(tts_factory):
    """EOS never comes on this checkpoint: without max_frames the text-derived guard stops it."""
    tts = tts_factory("custom_voice")
    text = "Guarded words."
    tokens = len(tts.ckpt.tokenizer.assistant_ids(text)) - 8
    result = tts.synthesize(text, speaker="ryan", greedy=True)
    assert result.finish_reason == "length" and result.frames == 40 + 10 * tokens
    params = tts.default_params(True, max_frames=None)
    assert params.with_budget(tokens, max_seconds=0.4).max_frames == 5
    assert params.with_budget(10_000).max_frames == 8191  # never above generation_config's max_new_tokens - 1
