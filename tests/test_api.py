"""The notebook API: `Audio` results, `TTS.stream`, `TTS.info`."""

from __future__ import annotations

import base64
import io
import json
import re

import numpy as np
import pytest
import soundfile as sf
import torch
from safetensors import safe_open
from typer.testing import CliRunner

import omnitts
from omnitts.cli import app
from omnitts.errors import RequestError
from omnitts.models.loader import safetensors_files

PCM16_STEP = 1 / 32768


@pytest.fixture(scope="module")
def cv(tts_factory):
    return tts_factory("custom_voice")


def test_audio_equals_the_file_the_cli_writes(cv, ckpt_dir, tmp_path):
    audio = cv.synthesize("First line.", speaker="ryan", language="english", greedy=True, max_frames=6)
    assert isinstance(audio, omnitts.Audio)
    assert audio.samples.dtype == np.float32 and audio.samples.shape == (6 * 1920,)
    assert audio.sample_rate == 24000 and audio.duration == pytest.approx(0.48)
    assert audio.frames == 6 and audio.codes.shape == (6, 16) and audio.finish_reason == "length"
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"id": "a", "text": "First line.", "language": "english", "speaker": "ryan"}) + "\n")
    for fmt in ("wav", "flac"):  # both 16-bit PCM
        out = tmp_path / fmt
        result = CliRunner().invoke(app, ["synth", str(manifest), "-m", str(ckpt_dir("custom_voice")), "-o", str(out),
                                          "--greedy", "--max-frames", "6", "--format", fmt, "--save-codes", "-q",
                                          "--dtype", "float32"])  # the api side is float32 (conftest)
        assert result.exit_code == 0, result.output
        written, rate = sf.read(out / f"a.{fmt}", dtype="float32")
        assert rate == audio.sample_rate
        np.testing.assert_allclose(written, audio.samples, rtol=0, atol=PCM16_STEP)
        np.testing.assert_array_equal(np.load(out / "a.codes.npy"), audio.codes)
    assert np.abs(audio.samples).max() > 100 * PCM16_STEP  # not silence: the comparison means something


def test_repr_html_embeds_a_decodable_wav(cv):
    audio = cv.synthesize("Play me inline.", speaker="vivian", greedy=True, max_frames=4)
    page = audio._repr_html_()
    assert "<audio controls" in page
    match = re.search(r'src="data:audio/wav;base64,([A-Za-z0-9+/=]+)"', page)
    assert match, page[:200]
    samples, rate = sf.read(io.BytesIO(base64.b64decode(match.group(1))), dtype="float32")
    assert rate == 24000 and samples.shape == audio.samples.shape
    np.testing.assert_allclose(samples, audio.samples, rtol=0, atol=PCM16_STEP)
    assert "4 frames" in page and "id=&#x27;0&#x27;" in page  # the caption, HTML-escaped


def test_save_picks_the_format_from_the_suffix(cv, tmp_path):
    audio = cv.synthesize("Save me.", speaker="ryan", greedy=True, max_frames=3, seed=4)
    assert audio.seed == 4
    for suffix, fmt in ((".wav", "WAV"), (".flac", "FLAC"), (".ogg", "OGG")):
        path = audio.save(tmp_path / "sub" / f"x{suffix}")
        assert sf.info(path).format == fmt and sf.info(path).frames == 3 * 1920
        assert path.stat().st_mode & 0o077, "readable like any new file (umask), not mkstemp's 0600"
    with pytest.raises(ValueError, match="unsupported audio format '.mp3'"):
        audio.save(tmp_path / "x.mp3")
    assert not list(tmp_path.rglob("*.tmp"))


def test_save_onto_a_folder_or_under_a_file_names_the_path(tmp_path):
    """An OSError as ever, naming the path given and what is wrong with it: onto a folder it named a temporary
    file ('.x.wav.omnitts-....tmp' -> 'x.wav'), under a file it said "File exists" of the file."""
    audio = omnitts.Audio(np.zeros(240, np.float32), 24000)
    (tmp_path / "x.wav").mkdir()
    (tmp_path / "f").write_text("a file")
    with pytest.raises(IsADirectoryError, match=r"is a folder; give the audio file's name .*: '.*/x\.wav'$"):
        audio.save(tmp_path / "x.wav")
    # A folder without a suffix (`-o` is a folder in every command) read "unsupported audio format ''"
    folder = re.escape(str(tmp_path))
    with pytest.raises(IsADirectoryError, match=rf"is a folder; give the audio file's name .*: '{folder}'$"):
        audio.save(tmp_path)
    for path in (tmp_path / "f" / "a.wav", tmp_path / "f" / "deeper" / "a.wav"):
        with pytest.raises(NotADirectoryError, match=rf"a folder on this path is a file: '{re.escape(str(path))}'$"):
            audio.save(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f", "x.wav"]  # no temporary file left


def test_save_into_a_folder_that_refuses_files_names_the_file_asked_for():
    """A folder that refuses new files (read-only, permission denied; /proc here, for root too) said
    "[Errno 30] Read-only file system: '.../.a.wav.omnitts-1f2e3d4c-k2j4h5g6.tmp'", a name the caller never gave."""
    audio = omnitts.Audio(np.zeros(240, np.float32), 24000)
    with pytest.raises(OSError) as raised:
        audio.save("/proc/omnitts-nope.wav")
    assert raised.value.filename == "/proc/omnitts-nope.wav" and ".tmp" not in str(raised.value), raised.value
    assert raised.value.errno is not None


def test_save_to_a_name_without_a_suffix_says_what_the_name_lacks(tmp_path, monkeypatch):
    """`save(".wav")` (pathlib reads it as a hidden file without a suffix), `save("new/")` (a folder not made
    yet) and `save("noext")` all said "unsupported audio format ''"; each now says what is wrong, writing nothing."""
    monkeypatch.chdir(tmp_path)
    audio = omnitts.Audio(np.zeros(240, np.float32), 24000)
    with pytest.raises(ValueError, match=r"^\.wav: '\.wav' is a suffix alone \(a hidden file's name\); use one of "
                                         r"\.wav, \.flac, \.ogg \(e\.g\. a\.wav\)$"):
        audio.save(".wav")
    with pytest.raises(IsADirectoryError, match=r"is a folder's path \(it ends in /\); give the audio file's name"):
        audio.save("new/")
    with pytest.raises(IsADirectoryError, match=r"is a folder's path"):
        audio.save(str(tmp_path / "x.wav") + "/")
    with pytest.raises(ValueError, match=r"^noext: the file name has no suffix; use one of"):
        audio.save("noext")
    assert list(tmp_path.iterdir()) == []


def test_an_audio_is_its_samples_to_numpy_and_the_libraries_that_take_arrays(tmp_path):
    """np.asarray(audio) was a 0-d object array holding the Audio, and sf.write(path, audio, rate) an IndexError
    from inside soundfile: an Audio converts to its samples (float32, shape (n,)), as arrays of audio do."""
    samples = np.linspace(-0.5, 0.5, 240, dtype=np.float32)
    audio = omnitts.Audio(samples, 24000)
    assert np.asarray(audio) is samples
    assert np.asarray(audio, dtype=np.float64).dtype == np.float64 and np.array(audio, copy=True) is not samples
    np.testing.assert_array_equal(np.array(audio), samples)
    sf.write(tmp_path / "a.wav", audio, audio.sample_rate)
    np.testing.assert_allclose(sf.read(tmp_path / "a.wav", dtype="float32")[0], samples, rtol=0, atol=PCM16_STEP)


def test_save_refuses_samples_that_are_not_numbers(tmp_path):
    """soundfile would write NaN as full scale: the file would be noise that nothing names."""
    for bad in (np.nan, np.inf):
        samples = np.zeros(240, np.float32)
        samples[7] = bad
        with pytest.raises(ValueError, match=r"a\.wav: some samples are not numbers \(NaN or infinity\); nothing"):
            omnitts.Audio(samples, 24000).save(tmp_path / "a.wav")
    assert list(tmp_path.iterdir()) == []


def test_empty_audio_saves_as_wav_and_ogg_and_flac_refuses_it(tmp_path):
    """libsndfile writes an empty FLAC as a 0-byte file that soundfile itself cannot open ("Format not
    recognised"): save wrote it without complaint. wav and ogg hold 0 samples and read back."""
    empty = omnitts.Audio(np.zeros(0, np.float32), 24000)
    for suffix in (".wav", ".ogg"):
        samples, rate = sf.read(empty.save(tmp_path / f"a{suffix}"))
        assert (samples.size, rate) == (0, 24000)
    with pytest.raises(ValueError, match=r"a\.flac: the audio has no samples, .* save it as \.wav or \.ogg; nothing"):
        empty.save(tmp_path / "a.flac")
    assert not (tmp_path / "a.flac").exists()


@pytest.mark.parametrize("suffix, rate, most", [(".ogg", 200001, 200000), (".flac", 655351, 655350)])
def test_a_rate_the_format_cannot_hold_is_refused_naming_the_file(tmp_path, suffix, rate, most):
    """An Audio built by hand at a rate past what the format holds: libvorbis crashed the process (a notebook's kernel)
    writing Vorbis above 200 kHz (leaving its temporary file), and FLAC above 655,350 Hz failed "Error opening
    '.a.flac.omnitts-....tmp': flac does not support this sample rate". Run in a child process: the crash would end
    this one."""
    import subprocess
    import sys

    code = (f"import numpy as np, omnitts\n"
            f"try:\n    omnitts.Audio(np.zeros(2400, np.float32), {rate}).save({str(tmp_path / ('a' + suffix))!r})\n"
            f"except ValueError as exc:\n    print(exc)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.fullmatch(rf".*a\{suffix}: a sample rate of {rate} Hz is past what {suffix} holds \({most:,} Hz at most\); "
                        r"resample the audio, or save it as \.wav; nothing was written\n", done.stdout), done.stdout
    assert list(tmp_path.iterdir()) == []
    path = omnitts.Audio(np.zeros(2400, np.float32), most).save(tmp_path / f"b{suffix}")  # the limit itself is taken
    assert sf.info(path).samplerate == most


def test_result_is_the_old_name_of_audio(cv):
    assert omnitts.Result is omnitts.Audio
    audio = cv.synthesize("Old name.", speaker="ryan", greedy=True, max_frames=2)
    assert audio.audio is audio.samples


def test_stream_yields_every_request_once(cv):
    greedy = cv.default_params(True, max_frames=3)
    requests = [
        {"id": "d", "text": "A dict line.", "speaker": "ryan", "seed": 11},
        omnitts.Request("A request without an id.", speaker="vivian"),
        ({"id": "p", "text": "A pair with its own parameters.", "speaker": "eric"}, greedy),
        (omnitts.Request("Another pair.", speaker="ryan", id="q"), greedy),
        {"text": "A dict without an id.", "speaker": "serena", "max_seconds": 0.4},
    ]
    results = list(cv.stream(iter(requests), max_frames=6, seed=100))
    by_id = {r.id: r for r in results}
    assert len(results) == 5 and set(by_id) == {"d", "1", "p", "q", "4"}
    assert by_id["d"].seed == 11 and by_id["1"].seed == 101 and by_id["4"].seed == 104  # seed + position
    assert by_id["d"].frames == 6 and by_id["p"].frames == 3 and by_id["q"].frames == 3
    assert by_id["4"].frames == 5  # an item's own max_seconds wins over the run-wide max_frames (as in synth)
    alone = cv.synthesize("A pair with its own parameters.", speaker="eric", greedy=True, max_frames=3)
    np.testing.assert_array_equal(by_id["p"].codes, alone.codes)  # batched with others = alone
    # An empty id is none, in a Request as in a dict (a Request's kept "": two of them were "used by an earlier")
    empty = [omnitts.Request("No id.", speaker="ryan", id=""), {"id": "", "text": "No id.", "speaker": "ryan"}]
    assert sorted(r.id for r in cv.stream(empty, max_frames=2)) == ["0", "1"]


def test_stream_errors_name_the_item(cv):
    with pytest.raises(RequestError, match=r"requests\[1\]: volume: unknown field"):
        list(cv.stream([{"text": "Fine.", "speaker": "ryan"}, {"text": "Hi.", "speaker": "ryan", "volume": 2}]))
    with pytest.raises(RequestError, match=r"requests\[1\]: id: 'x' is used by an earlier request"):
        list(cv.stream([{"id": "x", "text": "One.", "speaker": "ryan"}, {"id": "x", "text": "Two.", "speaker": "ryan"}]))
    with pytest.raises(RequestError, match=r"requests\[0\] \(id '0'\): speaker: 'bob'"):
        list(cv.stream([{"text": "Hi.", "speaker": "bob"}]))
    with pytest.raises(RequestError, match=r"requests\[0\]: expected a Request"):
        list(cv.stream(["just a string"]))
    for name, value in (("ref_audio", (np.zeros(2400, np.float32), 24000)), ("voice", omnitts.Voice)):
        with pytest.raises(RequestError, match=rf"requests\[0\]: {name}: a dict takes a file's path, as a manifest "
                                               rf"line does, got \w+; give a Request\(\.\.\., {name}=\.\.\.\)"):
            list(cv.stream([{"text": "Hi.", name: value}]))
    with pytest.raises(RequestError, match=r"requests\[0\]: a pair must be"):
        list(cv.stream([({"text": "Hi.", "speaker": "ryan"}, {"top_k": 3})]))
    with pytest.raises(RequestError, match=r"text: a lone surrogate '\\ud800' at character 6 is not text"):
        cv.synthesize("Half \ud800 of a pair.", speaker="ryan", max_frames=3)


def test_stream_yields_what_it_read_before_an_error_then_raises_it(cv):
    """An error loses nothing already read: the requests under way finish and are yielded, then the first
    error is raised; after a malformed item (or a failing source) no more requests are read."""
    read = []

    def source(bad: int, field: dict, count: int = 6, broken: bool = False):
        for i in range(count):
            read.append(i)
            yield {"id": f"r{i}", "text": "Fine.", "speaker": "ryan", **(field if i == bad else {})}
        if broken:
            raise ValueError("the feed broke")

    def gather(requests, error, match) -> list[str]:
        got = []
        with pytest.raises(error, match=match):
            for audio in cv.stream(requests, max_frames=3):
                assert audio.samples.size and audio.frames == 3  # a whole item
                got.append(audio.id)
        return got

    assert sorted(gather(source(2, {"volume": 2}), RequestError, r"requests\[2\]: volume")) == ["r0", "r1"]
    assert read == [0, 1, 2]
    # A request that fails later (here when prepared): the others already read still finish.
    got = gather(source(2, {"speaker": "bob"}), RequestError, r"requests\[2\] \(id 'r2'\): speaker: 'bob'")
    assert sorted(got) == ["r0", "r1", "r3", "r4", "r5"]
    # The source itself raises: what it gave is yielded, then its own exception.
    assert sorted(gather(source(-1, {}, count=3, broken=True), ValueError, "the feed broke")) == ["r0", "r1", "r2"]


@pytest.mark.parametrize("kind,preset", [("custom_voice", "tiny-0.6b"), ("custom_voice", "tiny-1.7b"),
                                         ("voice_design", "tiny-1.7b"), ("base", "tiny-0.6b")])
def test_info_describes_each_kind(tts_factory, ckpt_dir, kind, preset):
    info = tts_factory(kind, preset).info()
    path = ckpt_dir(kind, preset)
    assert info["kind"] == kind and info["path"] == str(path)
    assert info["size"] == "tiny"  # from the shapes; the config's name decides behaviour
    assert info["config_size"] == {"tiny-0.6b": "0.6B", "tiny-1.7b": "1.7B"}[preset]
    for key, folder in (("parameters", path), ("codec_parameters", path / "speech_tokenizer")):
        expected = 0
        for file in safetensors_files(folder):
            with safe_open(str(file), framework="pt") as f:
                expected += sum(f.get_tensor(name).numel() for name in f.keys())  # loads them: tiny here
        assert info[key] == expected
    if kind == "custom_voice":
        assert {"ryan", "vivian", "eric", "dylan"} <= set(info["speakers"])
        assert info["dialects"] == {"eric": "sichuan_dialect", "dylan": "beijing_dialect"}
    else:
        assert info["speakers"] == [] and info["dialects"] == {}
    assert info["accepts_instruct"] == (kind == "voice_design" or (kind == "custom_voice" and preset == "tiny-1.7b"))
    assert info["languages"][0] == "auto" and "english" in info["languages"]
    gen = json.loads((path / "generation_config.json").read_text())
    assert info["sampling"] == {k: v for k, v in gen.items() if k != "max_new_tokens"}
    assert info["max_frames"] == gen["max_new_tokens"] - 1
    assert info["sample_rate"] == 24000 and info["frame_rate"] == 12.5


def test_jupyter_shows_the_player(cv):
    from IPython.core import formatters  # in [test]: a missing IPython fails here, it does not skip
    audio = cv.synthesize("Shown in a notebook.", speaker="ryan", greedy=True, max_frames=2)
    data, _ = formatters.DisplayFormatter().format(audio)
    assert "<audio controls" in data["text/html"] and data["text/plain"] == repr(audio)


def test_info_command_shows_sizes_dialects_and_defaults(ckpt_dir, tmp_path):
    path = ckpt_dir("custom_voice", "tiny-1.7b")
    info = omnitts.load(path, dtype="float32").info()
    result = CliRunner().invoke(app, ["info", str(path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    text = result.output
    assert "custom_voice" in text and "1.7B" in text and f"{info['parameters']:,}" in text
    assert f"{info['codec_parameters']:,}" in text
    assert "eric (sichuan dialect)" in text and "dylan (beijing dialect)" in text and "ryan," in text
    assert "temperature 0.9, top_k 50, top_p 1.0, repetition_penalty 1.05" in text
    assert "24000 Hz mono, 12.5 frames/s" in text and "english" in text
    missing = CliRunner().invoke(app, ["info", str(path.parent / "nope")])
    assert missing.exit_code == 2 and "checkpoint directory not found" in missing.output
    weights = path / "model.safetensors"  # a file of the checkpoint, not the checkpoint
    file = CliRunner().invoke(app, ["info", str(weights)])
    assert file.exit_code == 2 and file.output.strip() == (f"error: {weights}: is a file; a checkpoint is a directory "
                                                          f"(the folder holding config.json: {path}, which holds this "
                                                          "file)")
    stray = tmp_path / "notes.txt"  # a file beside no config.json: the folder is not named
    stray.write_text("x")
    other = CliRunner().invoke(app, ["info", str(stray)])
    assert other.output.strip() == f"error: {stray}: is a file; a checkpoint is a directory (the folder holding config.json)"


def test_the_library_prints_nothing(ckpt_dir, ref_wav, tmp_path, capfd):
    """The library never prints (the CLI owns the terminal): load, synthesize, stream, clone, save, info and
    read_results write nothing to stdout or stderr, at the file-descriptor level (C++ builds included)."""
    capfd.readouterr()
    tts = omnitts.load(ckpt_dir("custom_voice"), dtype="float32")
    tts.synthesize(["One.", "Two."], speaker="ryan", greedy=True, max_frames=2)[0].save(tmp_path / "a.flac")
    list(tts.stream([{"id": "s", "text": "Streamed.", "speaker": "ryan"}], max_frames=2))
    tts.info()
    base = omnitts.load(ckpt_dir("base"), dtype="float32")
    base.clone_voice(ref_wav, x_vector_only=True).save(tmp_path / "v.safetensors")
    omnitts.read_results(tmp_path)
    assert capfd.readouterr() == ("", "")


@pytest.mark.parametrize("keywords, error, message", [
    ({"max_frames": 0}, ValueError, "max_frames: must be >= 1, got 0"),
    ({"temperature": "x"}, TypeError, "temperature: expected a number, got str"),
    ({"top_p": 2}, ValueError, r"top_p: must be in \(0, 1\], got 2")])
def test_stream_checks_its_keywords_before_reading_an_item(cv, keywords, error, message):
    """A bad run-wide keyword was found only as the first item was read: that item was taken from the caller's
    iterable and lost, and an empty one ran without complaint."""
    read = []

    def source():
        read.append(0)
        yield {"id": "a", "text": "Fine.", "speaker": "ryan"}

    for requests in (source(), []):
        with pytest.raises(error, match=rf"^{message}$"):
            list(cv.stream(requests, **keywords))
    assert read == []
    with pytest.raises(error, match=rf"^{message}$"):  # an empty list returned [] without complaint
        cv.synthesize([], speaker="ryan", **keywords)


def test_a_list_seed_wraps_at_64_bits_past_the_largest(cv):
    """Item i uses seed + i: from the largest seed, item 1's was 2**63, refused with a ValueError naming a seed
    nobody gave. It wraps to -2**63, and that seed alone gives its audio."""
    largest = 2**63 - 1
    first, second = cv.synthesize(["One.", "Two."], speaker="ryan", seed=largest, max_frames=3)
    assert (first.seed, second.seed) == (largest, -(2**63))
    assert np.array_equal(second.codes, cv.synthesize("Two.", speaker="ryan", seed=-(2**63), max_frames=3).codes)
    lines = [{"id": "a", "text": "One.", "speaker": "ryan"}, {"id": "b", "text": "Two.", "speaker": "ryan"}]
    assert sorted(a.seed for a in cv.stream(lines, seed=largest, max_frames=3)) == [-(2**63), largest]


def test_a_pairs_dict_may_not_set_what_its_sampling_params_decide(cv):
    """In a (dict, SamplingParams) pair the parameters are used as given: the dict's seed or temperature was
    dropped without a word (the audio said the params' seed); now it is refused, naming the field."""
    params = cv.default_params(max_frames=2, seed=1)
    line = {"id": "a", "text": "Hi.", "speaker": "ryan"}
    for field, value in (("seed", 99), ("temperature", 0.3)):
        with pytest.raises(RequestError, match=rf"^requests\[0\]: {field}: the pair's SamplingParams decide how it "
                                               rf"samples; set {field} there, or give the dict alone$"):
            list(cv.stream([({**line, field: value}, params)]))
    assert [a.seed for a in cv.stream([(line, params)])] == [1]


def test_stream_yields_results_in_the_order_they_finish(cv):
    """README: `stream` yields results as they finish, not in input order: a short item given last comes first."""
    lines = [{"id": "long", "text": "A long one.", "speaker": "ryan", "max_seconds": 0.8},
             {"id": "short", "text": "A short one.", "speaker": "ryan", "max_seconds": 0.16}]
    assert [a.id for a in cv.stream(lines, greedy=True)] == ["short", "long"]


def test_synthesize_takes_a_budget_in_seconds_as_a_manifest_line_does(cv):
    """A manifest line and `stream`'s dicts have `max_seconds`; `synthesize` had only `max_frames`: 0.4 s is
    5 frames at 12.5 frames/s, for one text and each text of a list; a bad value is named, both is refused."""
    assert cv.synthesize("Hi there.", speaker="ryan", greedy=True, max_seconds=0.4).frames <= 5
    assert [a.frames for a in cv.synthesize(["One.", "Two."], speaker="ryan", max_seconds=0.16, seed=3)] == [2, 2]
    alone = cv.synthesize("Hi there.", speaker="ryan", seed=5, max_seconds=0.4)
    assert np.array_equal(alone.codes, cv.synthesize("Hi there.", speaker="ryan", seed=5, max_frames=5).codes)
    with pytest.raises(RequestError, match=r"^max_seconds: must be > 0, got -1$"):
        cv.synthesize("Hi.", speaker="ryan", max_seconds=-1)
    with pytest.raises(ValueError, match=r"^max_frames, max_seconds: give one budget, not both$"):
        cv.synthesize("Hi.", speaker="ryan", max_frames=2, max_seconds=0.16)


def test_synthesize_says_where_ids_go(cv):
    """An `id` keyword was called an unknown sampling parameter; synthesize names its results by position."""
    with pytest.raises(TypeError, match=r"^id: synthesize names its results by position .*stream instead$"):
        cv.synthesize("Hi.", speaker="ryan", id="x")


def test_arguments_of_the_wrong_type_are_type_errors_naming_them(cv):
    """Before any arithmetic on them: a seed of the wrong type is not "can only concatenate str"."""
    with pytest.raises(TypeError, match=r"^seed: expected an int, got str$"):
        cv.synthesize("Hi.", speaker="ryan", seed="7")
    with pytest.raises(TypeError, match=r"^seed: expected an int, got float$"):
        list(cv.stream([{"text": "Hi.", "speaker": "ryan"}], seed=1.5))
    with pytest.raises(TypeError, match=r"^text: expected a string or a list of strings, got NoneType$"):
        cv.synthesize(None, speaker="ryan")
    with pytest.raises(TypeError, match=r"^text\[1\]: expected a string, got int$"):
        cv.synthesize(["Hi.", 3], speaker="ryan")
    with pytest.raises(TypeError, match=r"^temperature: expected a number, got str$"):
        cv.synthesize("Hi.", speaker="ryan", temperature="hot")
    with pytest.raises(TypeError, match=r"^top_k: expected an int, got float$"):
        omnitts.SamplingParams(top_k=2.5)
    with pytest.raises(TypeError, match=r"^do_sample: expected a bool, got int$"):
        omnitts.SamplingParams(do_sample=1)
    assert omnitts.SamplingParams(seed=np.int64(3), temperature=np.float32(0.5), top_p=1).seed == 3  # numpy's too
    with pytest.raises(TypeError, match=r"^greedy: expected a bool, got str$"):  # "no" sampled greedily
        cv.synthesize("Hi.", speaker="ryan", greedy="no")
    with pytest.raises(TypeError, match=r"^greedy: expected a bool, got int$"):
        list(cv.stream([{"text": "Hi.", "speaker": "ryan"}], greedy=1))


def test_numpy_integers_are_taken_as_python_ints(cv):
    """A numpy int32 was taken and its arithmetic wrapped: max_frames=np.int32(3) was "OverflowError: Python integer
    4294967296 out of bounds for int32" (the cache budget's division), and a list's item 1 from seed=np.int32(2**31 - 1)
    sampled with seed -2**31, not seed + 1."""
    params = omnitts.SamplingParams(max_frames=np.int32(3), top_k=np.int16(5), temperature=np.float32(0.5))
    assert [type(v) for v in (params.max_frames, params.top_k, params.temperature)] == [int, int, float]
    assert cv.synthesize("Hi.", speaker="ryan", greedy=True, max_frames=np.int32(3)).frames == 3
    seed = np.int32(2**31 - 1)
    assert [a.seed for a in cv.synthesize(["Hi.", "Ho."], speaker="ryan", max_frames=2, seed=seed)] == [seed, 2**31]
    streamed = cv.stream([{"text": "Hi.", "speaker": "ryan"}, {"text": "Ho.", "speaker": "ryan"}], max_frames=2, seed=seed)
    assert sorted(a.seed for a in streamed) == [seed, 2**31]


def test_a_numpy_bool_is_named_as_numpy_s(cv):
    """numpy 2 names its bool type `bool`: a flag given one said "greedy: expected a bool, got bool". (numpy 1
    names it `bool_`, which says what it is.)"""
    named = re.escape("numpy.bool" if np.bool_.__name__ == "bool" else "bool_")
    with pytest.raises(TypeError, match=rf"^greedy: expected a bool, got {named}$"):
        cv.synthesize("Hi.", speaker="ryan", greedy=np.bool_(True))
    with pytest.raises(RequestError, match=rf"^non_streaming: expected bool, got {named}$"):
        cv.synthesize("Hi.", speaker="ryan", non_streaming=np.bool_(True))
    with pytest.raises(TypeError, match=rf"^do_sample: expected a bool, got {named}$"):
        omnitts.SamplingParams(do_sample=np.bool_(False))
    with pytest.raises(TypeError, match=rf"^seed: expected an int, got {named}$"):
        cv.synthesize("Hi.", speaker="ryan", seed=np.bool_(True))
    with pytest.raises(TypeError, match=rf"^eager: expected true or false, got {named}$"):
        omnitts.load(".", eager=np.bool_(True))


def test_a_stream_dict_takes_integer_ids_and_whole_floats_as_a_manifest_line_does(cv):
    """A dict is read as a JSON manifest line: {"id": 7} said "id: expected str, got int", {"seed": 3.0} (a pandas row
    with gaps) "seed: expected int, got float", and {"id": 0} was silently given its position as its id."""
    lines = [{"id": 7, "text": "Hi.", "speaker": "ryan"}, {"text": "Ho.", "speaker": "ryan", "seed": 3.0},
             {"id": 0, "text": "Ha.", "speaker": "ryan"}]
    assert sorted((a.id, a.seed) for a in cv.stream(lines, max_frames=2, seed=10)) == [("0", 12), ("1", 3), ("7", 10)]


@pytest.mark.parametrize("given,named", [(None, "NoneType"), (5, "int"), ({"text": "Hi.", "speaker": "ryan"}, "one dict"),
                                         (omnitts.Request("Hi.", speaker="ryan"), "one Request"), ("Hi.", "one str")])
def test_requests_that_are_not_an_iterable_of_them_are_named(cv, given, named):
    """stream(None) said only "'NoneType' object is not iterable", stream(a_dict) "requests[0]: expected a Request, a
    dict or a (request, SamplingParams) pair, got str" (its first key) and stream(a_request) "'Request' object is
    not iterable"."""
    with pytest.raises(TypeError, match=rf"^requests: expected an iterable of requests \(a list, a generator\), got {named}"):
        next(cv.stream(given, max_frames=2))
    with pytest.raises(TypeError, match=rf"^jobs: expected an iterable of requests \(a list, a generator\), got {named}"):
        next(cv.generate(given))


def test_samples_that_are_not_numbers_make_no_wav_bytes_nor_player():
    """`save` refused NaN samples, but `to_wav_bytes` (and the notebook's player) wrote them as full-scale noise."""
    audio = omnitts.Audio(np.array([0.0, np.nan, np.inf], np.float32), 24000)
    with pytest.raises(ValueError, match=r"^samples: some are not numbers \(NaN or infinity\); no WAV was made$"):
        audio.to_wav_bytes()
    page = audio._repr_html_()
    assert "<audio" not in page and "no WAV was made" in page


def test_a_rate_past_a_wav_header_makes_no_wav_bytes_nor_player():
    """`save` refused a rate past WAV's 32-bit header, but `to_wav_bytes` raised soundfile's OverflowError ("integer
    10000000000 does not fit 'int'"), and so did the notebook's display (`_repr_html_` catches ValueError)."""
    audio = omnitts.Audio(np.zeros(10, np.float32), 10**10)
    with pytest.raises(ValueError, match=r"^a sample rate of 10000000000 Hz is past what \.wav holds \(2,147,483,647 Hz "
                                         r"at most\); resample the audio; no WAV was made$"):
        audio.to_wav_bytes()
    page = audio._repr_html_()
    assert "<audio" not in page and "no WAV was made" in page


def test_samples_of_channels_by_time_are_refused_naming_the_shape(tmp_path):
    """An Audio of (channels, n) samples, as librosa keeps them, failed save with soundfile's "Error opening
    '.a.wav.omnitts-...tmp': Format not recognised" (n channels), naming a temporary file; `to_wav_bytes` (the
    notebook's player) likewise. Both name the shape and the fix; (n, channels) is written as before."""
    samples = (0.3 * np.sin(np.arange(4800) / 10)).astype(np.float32)
    audio = omnitts.Audio(np.stack([samples, samples]), 24000)
    shape = r"samples of shape \(2, 4800\) look like \(channels, n\); give mono samples, shape \(n,\), or \(n, channels\)"
    for ext in ("wav", "flac", "ogg"):
        with pytest.raises(ValueError, match=rf"a\.{ext}: {shape}: transpose them \(samples\.T\); nothing was written$"):
            audio.save(tmp_path / f"a.{ext}")
    with pytest.raises(ValueError, match=rf"^{shape}: transpose them \(samples\.T\); no WAV was made$"):
        audio.to_wav_bytes()
    assert "<audio" not in audio._repr_html_() and list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match=r"samples of shape \(1, 2, 4800\); give mono samples"):
        omnitts.Audio(audio.samples[None], 24000).save(tmp_path / "a.wav")
    stereo = omnitts.Audio(audio.samples.T, 24000).save(tmp_path / "a.wav")
    assert sf.info(stereo).channels == 2 and sf.info(stereo).frames == 4800


def test_a_path_argument_that_is_no_path_is_named(cv, tmp_path):
    """Audio.save(3), TTS.load_voice(3) and read_results(None) raised pathlib's "expected str, bytes or os.PathLike
    object, not int", naming no argument (and saying bytes, which it refuses)."""
    audio = omnitts.Audio(np.zeros(24, np.float32), 24000)
    for call, name, kind in ((lambda: audio.save(3), "path", "int"), (lambda: audio.save(b"a.wav"), "path", "bytes"),
                             (lambda: cv.load_voice(3), "path", "int"), (lambda: omnitts.read_results(None), "out", "NoneType"),
                             (lambda: omnitts.Voice(torch.zeros(4), None, None, "x").save(1.5), "path", "float")):
        with pytest.raises(TypeError, match=rf"^{name}: expected a path \(a string or os.PathLike\), got {kind}$"):
            call()


def test_stream_takes_a_dataframes_rows(cv):
    """pandas gives an empty cell as NaN: df.to_dict("records") of lines with and without a seed was "requests[1]: seed:
    expected int, got float" (a Parquet file of that DataFrame holds null, absent); stream(df) iterated over the column
    names ("requests[0]: expected a Request, a dict or a (request, SamplingParams) pair, got str")."""
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame([{"id": "a", "text": "Hi.", "speaker": "ryan", "seed": 3},
                          {"id": "b", "text": "Ho.", "speaker": "ryan", "language": "english"}])
    assert sorted((a.id, a.seed) for a in cv.stream(frame.to_dict("records"), max_frames=2, seed=10)) == [("a", 3), ("b", 11)]
    with pytest.raises(TypeError, match=r"^requests: a DataFrame iterates over its column names; give "
                                        r"its rows: df.to_dict\('records'\)$"):
        next(cv.stream(frame))


def test_stream_takes_the_rows_of_a_dataframe_of_nullable_columns(cv):
    """A DataFrame of pandas' nullable dtypes (`df.convert_dtypes()`, `read_parquet(..., dtype_backend=...)`) marks an
    empty cell pd.NA, not NaN, and pandas 2's `to_dict("records")` gives it as that: such rows were "requests[1]: seed:
    expected int, got NAType" (and "language: expected str, got NAType"), where a NaN cell is absent; pd.NA (and
    pd.NaT) is absent as well."""
    pd = pytest.importorskip("pandas")
    rows = [{"id": "a", "text": "Hi.", "speaker": "ryan", "seed": 3, "language": pd.NA},  # as pandas 2 gives them
            {"id": "b", "text": "Ho.", "speaker": "ryan", "seed": pd.NA, "language": "english", "instruct": pd.NaT}]
    assert sorted((a.id, a.seed) for a in cv.stream(rows, max_frames=2, seed=10)) == [("a", 3), ("b", 11)]


def test_a_stream_dict_takes_numpy_numbers(cv):
    """A seed from np.arange in a dict was "requests[0]: seed: expected int, got int64" (keywords took numpy's), a
    np.float32 max_seconds "max_seconds: expected number, got float32"."""
    lines = [{"text": "Hi.", "speaker": "ryan", "seed": seed, "max_seconds": np.float32(0.16)} for seed in np.arange(2)]
    assert sorted((a.id, a.seed, a.frames, type(a.seed)) for a in cv.stream(lines)) == [("0", 0, 2, int), ("1", 1, 2, int)]
    with pytest.raises(RequestError, match=r"^requests\[0\]: id: expected str, got ndarray$"):  # not "truth value of an
        list(cv.stream([{"id": np.array([1, 2]), "text": "Hi.", "speaker": "ryan"}]))  # array ... is ambiguous"
    request = omnitts.Request("Hi.", speaker="ryan", max_seconds=np.float32(0.16))  # a Request's too
    assert cv.run(request, cv.default_params()).frames == 2 and type(request.max_seconds) is float


def test_a_sampling_keyword_may_not_raise_the_checkpoints_frame_cap_and_a_typo_is_named(cv):
    """frame_cap=20000 was taken from synthesize's keywords: max_frames past the checkpoint's 8191-frame cap then
    ran (and was not cut), and a misspelt keyword listed frame_cap among the valid ones without a suggestion."""
    with pytest.raises(ValueError, match=r"^frame_cap: this checkpoint's \(8191 frames, from generation_config.json's "
                                         r"max_new_tokens\), not a request's; set max_frames"):
        cv.synthesize("Hi.", speaker="ryan", max_frames=9000, frame_cap=20000)
    with pytest.raises(ValueError, match=r"^unknown sampling parameter\(s\) \['tempreature'\] \(did you mean "
                                         r"'temperature'\?\); valid: \['do_sample', 'max_frames', 'repetition_penalty',"):
        cv.synthesize("Hi.", speaker="ryan", tempreature=0.5)
    assert cv.default_params(max_frames=3).frame_cap == 8191


def test_a_frame_cap_below_one_is_refused_naming_it():
    """frame_cap=0 was taken, then every budget was cut to 0 frames: "max_frames must be >= 1, got 0"."""
    with pytest.raises(ValueError, match=r"^frame_cap: must be >= 1 \(the most frames one utterance may take\), got 0$"):
        omnitts.SamplingParams(frame_cap=0)
    assert omnitts.SamplingParams(frame_cap=1).with_budget(5).max_frames == 1


def test_a_request_without_text_is_a_request_error_naming_the_field(cv):
    """`Request(text=None)` passed the field check (None is an absent optional field in a manifest) and failed in
    the splitter: "TypeError: expected string or bytes-like object"."""
    params = cv.default_params(True, max_frames=2)
    with pytest.raises(RequestError, match=r"^text: missing; give the words to speak$"):
        cv.run(omnitts.Request(None, speaker="ryan"), params)
    with pytest.raises(RequestError, match=r"^requests\[1\]: text: missing; give the words to speak$"):
        list(cv.stream([omnitts.Request("Hi.", speaker="ryan"), omnitts.Request(None, speaker="ryan")], max_frames=2))
    with pytest.raises(RequestError, match=r"^jobs\[0\]: text: missing"):
        list(cv.generate([(omnitts.Request(None, speaker="ryan"), params)]))


@pytest.mark.parametrize("max_seconds,message", [(-1, "must be > 0, got -1"), (float("nan"), "must be > 0, got nan"),
                                                 ("1", "expected number, got str")])
def test_a_request_object_is_checked_as_a_dict_is(cv, max_seconds, message):
    """A `Request` with a bad max_seconds ran (or crashed in the engine); the dict path's check refuses it."""
    request = omnitts.Request("Hi.", speaker="ryan", max_seconds=max_seconds)
    with pytest.raises(RequestError, match=rf"^requests\[1\]: max_seconds: {message}$"):
        list(cv.stream([{"text": "Fine.", "speaker": "ryan"}, request], max_frames=2))
    with pytest.raises(RequestError, match=r"^requests\[0\]: speaker: expected str, got int$"):
        list(cv.stream([omnitts.Request("Hi.", speaker=5)], max_frames=2))


@pytest.mark.parametrize("fields,message", [
    ({"speaker": 5}, "speaker: expected str, got int"),
    ({"max_seconds": -1}, "max_seconds: must be > 0, got -1"),
    ({"max_seconds": "1"}, "max_seconds: expected number, got str"),
    ({"text": "Half \ud800 of a pair."}, r"text: a lone surrogate '\\ud800' at character 6 is not text \(.*\)"),
    ({"id": 3}, "id: expected str, got int"),
    ({"voice": "v.safetensors", "ref_audio": "r.wav"}, "voice: give either ref_audio or voice, not both"),
])
def test_generate_and_run_check_a_request_as_stream_does(cv, fields, message):
    """`generate` and `run` took any Request: a bad field ran (a negative max_seconds, an int id) or failed late
    (AttributeError from the prompt, an error that named no job); now the manifest's check names it, and the job."""
    request = omnitts.Request(**{"text": "Hi.", "speaker": "ryan", **fields})
    params = cv.default_params(True, max_frames=2)
    with pytest.raises(RequestError, match=rf"^{message}$"):
        cv.run(request, params)
    with pytest.raises(RequestError, match=rf"^jobs\[1\]: {message}$"):
        list(cv.generate([(omnitts.Request("Fine.", speaker="ryan"), params), (request, params)]))


def test_generate_and_run_name_a_job_of_the_wrong_shape(cv):
    """Not a (Request, SamplingParams) pair: an AttributeError (or "cannot unpack") from deep in the pipeline."""
    request, params = omnitts.Request("Hi.", speaker="ryan"), cv.default_params(True, max_frames=2)
    with pytest.raises(RequestError, match=r"^request: expected a Request, got dict$"):
        cv.run({"text": "Hi.", "speaker": "ryan"}, params)
    with pytest.raises(RequestError, match=r"^params: expected SamplingParams \(see TTS\.default_params\), got dict$"):
        cv.run(request, {"top_k": 3})
    with pytest.raises(RequestError, match=r"^jobs\[0\]: expected a \(Request, SamplingParams\) pair, got Request$"):
        list(cv.generate([request]))
    with pytest.raises(RequestError, match=r"^jobs\[1\]: params: expected SamplingParams .*, got NoneType$"):
        list(cv.generate(iter([(request, params), (request, None)])))
    assert [a.frames for a in cv.generate([(request, params)])] == [2] and cv.run(request, params).frames == 2


def test_run_reference_and_prepare_check_their_arguments_as_run_does(cv):
    """`run_reference` took anything: an AttributeError from the prompt (a str, or an int language), an
    UnboundLocalError for a Request without text, a negative max_seconds ran; `prepare` likewise."""
    request, params = omnitts.Request("Hi.", speaker="ryan"), cv.default_params(True, max_frames=2)
    for bad, message in ((("Hi.", params), r"request: expected a Request, got str"),
                         ((request, None), r"params: expected SamplingParams \(see TTS\.default_params\), got NoneType"),
                         ((omnitts.Request(None, speaker="ryan"), params), "text: missing; give the words to speak"),
                         ((omnitts.Request("Hi.", speaker="ryan", language=5), params), "language: expected str, got int"),
                         ((omnitts.Request("Hi.", speaker="ryan", max_seconds=-1), params), "max_seconds: must be > 0, got -1")):
        with pytest.raises(RequestError, match=rf"^{message}$"):
            cv.run_reference(*bad)
    with pytest.raises(RequestError, match=r"^request: expected a Request, got str$"):
        cv.prepare("Hi.")
    with pytest.raises(RequestError, match=r"^text: missing; give the words to speak$"):
        cv.prepare(omnitts.Request(None, speaker="ryan"))
    assert cv.run_reference(request, params).frames == 2


def test_synthesize_names_the_text_of_a_list_at_fault(cv):
    with pytest.raises(RequestError, match=r"^text\[1\]: empty; give the words to speak$"):
        cv.synthesize(["ok", ""], speaker="ryan", max_frames=2)
    with pytest.raises(RequestError, match=r"^text\[2\]: a lone surrogate"):
        cv.synthesize(["ok", "fine", "half \ud800"], speaker="ryan", max_frames=2)
    with pytest.raises(RequestError, match=r"^text: empty; give the words to speak$"):
        cv.synthesize("", speaker="ryan", max_frames=2)


def test_synthesize_names_the_item_of_a_list_that_fails_later(cv):
    """Errors found while an item is prepared (its pieces, its budget) named no item: `text[i]` says which."""
    sentence = "This sentence is here to make the text long enough to be split into pieces. "
    with pytest.raises(RequestError, match=r"^text\[1\]: [\d,]+ characters make \d+ pieces; at most 256"):
        cv.synthesize(["ok", sentence * 1000], speaker="ryan", max_frames=2)
    with pytest.raises(RequestError, match=r"^text\[1\]: max_frames: the item's budget of 2 frames cannot be shared "
                                           r"by its \d+ pieces"):
        cv.synthesize(["ok", sentence * 10], speaker="ryan", max_frames=2)
    with pytest.raises(RequestError, match=r"^max_frames: the item's budget of 2 frames"):  # one text: as it was
        cv.synthesize(sentence * 10, speaker="ryan", max_frames=2)
    with pytest.raises(RequestError, match=r"^speaker: 'bob' is not known"):  # a keyword's error: no item named
        cv.synthesize(["ok", "fine"], speaker="bob", max_frames=2)


def test_an_unseeded_result_gives_the_seed_that_reproduces_it(cv):
    """`Audio.seed` is the seed drawn for an unseeded request (the reference path too), None for greedy."""
    request = omnitts.Request("Hi.", speaker="ryan")
    for run in (cv.run, cv.run_reference):
        first = run(request, cv.default_params(max_frames=3))
        assert first.seed is not None
        again = run(request, cv.default_params(max_frames=3, seed=first.seed))
        np.testing.assert_array_equal(again.codes, first.codes)
    assert cv.synthesize("Hi.", speaker="ryan", greedy=True, max_frames=2).seed is None
    assert cv.synthesize("Hi.", speaker="ryan", greedy=True, max_frames=2, seed=5).seed == 5


def test_stream_chains_an_items_error_to_the_one_it_names(cv, monkeypatch):
    """The error `stream` raises names the item and keeps the original as its cause; an exception whose type is
    not made from one message (it used to fail rebuilding, as a TypeError) is raised itself."""
    with pytest.raises(RequestError, match=r"^requests\[0\] \(id '0'\): speaker: 'bob'") as caught:
        list(cv.stream([{"text": "Hi.", "speaker": "bob"}], max_frames=2))
    assert isinstance(caught.value.__cause__, RequestError)
    assert str(caught.value.__cause__).startswith("speaker: 'bob' is not known")

    class Picky(Exception):
        def __init__(self, code: int, message: str):
            super().__init__(message)
            self.code = code

    def prepare(request):
        raise Picky(7, "no luck")

    monkeypatch.setattr(cv, "prepare", prepare)
    with pytest.raises(Picky, match="^no luck") as caught:
        list(cv.stream([{"text": "Hi.", "speaker": "ryan"}], max_frames=2))
    assert caught.value.code == 7
    if hasattr(caught.value, "add_note"):  # Python 3.11+
        assert caught.value.__notes__ == ["requests[0] (id '0')"]


@pytest.mark.parametrize("options,error,message", [
    ({"dtype": "bf16"}, ValueError, "dtype: 'bf16' is not one of auto, float32, bfloat16, float16"),
    ({"dtype": torch.float64}, ValueError, "dtype: 'float64' is not one of auto, float32, bfloat16, float16"),
    ({"dtype": 32}, TypeError, "dtype: expected a string, got an integer"),
    ({"codec_dtype": "float16"}, ValueError, "codec_dtype: 'float16' is not one of float32, bfloat16"),
    ({"max_batch": 0}, ValueError, "max_batch: must be > 0, got 0"),
    ({"max_batch": "8"}, TypeError, "max_batch: expected an integer, got a string"),
    ({"max_batch": 2.5}, TypeError, "max_batch: expected an integer, got a number"),
    ({"max_batch": True}, TypeError, "max_batch: expected an integer, got a boolean"),
    ({"graph_buckets": [4, 2]}, ValueError, "graph_buckets: list each size once, in increasing order, got [4, 2]"),
    ({"span_buckets": [0]}, ValueError, "span_buckets: expected a list of position counts >= 1, got [0]"),
    ({"codec_chunk_frames": -1}, ValueError, "codec_chunk_frames: must be > 0, got -1"),
    ({"max_prefill_tokens": 0}, ValueError, "max_prefill_tokens: must be > 0, got 0"),
    ({"eager": "no"}, TypeError, "eager: expected true or false, got a string"),
    ({"official_tokenizer": "x"}, TypeError, "official_tokenizer: expected true or false, got a string"),
    ({"max_batch": None}, TypeError, "max_batch: expected an integer, got None"),
    # OmniTTSError "device None: choose cpu, cuda or npu" (a wrong type, not a device this machine lacks)
    ({"device": None}, TypeError, "device: expected cpu, cuda or npu (a string or torch.device), got None"),
    ({"device": 0}, TypeError, "device: expected cpu, cuda or npu (a string or torch.device), got an integer"),
    ({"codec_chunk_frames": None}, TypeError, "codec_chunk_frames: expected an integer, got None"),
    ({"dtype": None}, TypeError, "dtype: expected a string, got None"),
    ({"codec_dtype": None}, TypeError, "codec_dtype: expected a string, got None"),
    ({"eager": None}, TypeError, "eager: expected true or false, got None"),
])
def test_load_refuses_engine_options_as_a_recipe_does(ckpt_dir, options, error, message):
    """Before the checkpoint loads, with the recipe's rule: `max_batch=0` used to fail in the first
    synthesize with a talker-cache message, `-3` with a negative tensor dimension; `dtype="bf16"` was a
    CheckpointError, not the ValueError the docstring promises. None, which a recipe reads as "not set", loaded with
    `max_batch=None` and failed the first synthesize with "unsupported operand type(s) for *: 'int' and 'NoneType'"
    (`dtype=None` was a CheckpointError); it is a setting only where the docstring says what it means."""
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        omnitts.load(ckpt_dir("custom_voice"), **options)


def test_load_on_a_device_this_machine_lacks_says_what_to_load_with(ckpt_dir, monkeypatch):
    """The library's user passes device=..., not --device (the message named the command's flag)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(omnitts.OmniTTSError, match=r"^device 'cuda': no CUDA device is visible to torch \(load with "
                                                   r"device='cpu'\)$"):
        omnitts.load(ckpt_dir("custom_voice"), device="cuda")


def test_load_takes_torch_dtypes_as_their_names(ckpt_dir):
    """`load(dtype=torch.float32)` (as transformers' torch_dtype takes it) was refused with "dtype: expected a
    string, got dtype"; a torch dtype is taken as the name it stands for, for the codec's too."""
    tts = omnitts.load(ckpt_dir("custom_voice"), dtype=torch.bfloat16, codec_dtype=torch.float32)
    assert tts.ckpt.model.talker.dtype == torch.bfloat16
    assert tts.synthesize("Hi.", speaker="ryan", max_frames=2).frames == 2


def test_load_reads_names_in_any_case_as_the_flags_and_recipes_do(ckpt_dir, monkeypatch):
    """`load(dtype="FLOAT32")` was refused ("'FLOAT32' is not one of ...") while `--dtype FLOAT32` and a recipe's
    `dtype = "FLOAT32"` were taken: device, dtype and codec dtype are read in any case, spaces around them dropped;
    a name that is no choice is still refused, named as written."""
    import torch

    tts = omnitts.load(ckpt_dir("custom_voice"), device=" CPU", dtype="FLOAT32", codec_dtype="BFloat16 ")
    assert repr(tts).endswith(", custom_voice, cpu, float32, codec bfloat16, max_batch=8)"), repr(tts)
    assert tts.ckpt.model.talker.dtype == torch.float32
    with pytest.raises(ValueError, match=r"^dtype: 'Float64' is not one of auto, float32, bfloat16, float16$"):
        omnitts.load(ckpt_dir("custom_voice"), dtype="Float64")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(omnitts.OmniTTSError, match=r"^device 'cuda': no CUDA device is visible to torch"):
        omnitts.load(ckpt_dir("custom_voice"), device="CUDA")
    with pytest.raises(omnitts.OmniTTSError, match=r"^device 'cuda:1': give the kind, 'cuda'"):
        omnitts.load(ckpt_dir("custom_voice"), device="CUDA:1")


def test_load_takes_a_torch_device_as_its_name(ckpt_dir, monkeypatch):
    """`load(device=torch.device("cpu"))` was refused with "device device(type='cpu'): choose cpu, cuda or npu",
    naming the device it was given as one to choose; a torch.device is taken as the name it stands for."""
    import torch

    tts = omnitts.load(ckpt_dir("custom_voice"), device=torch.device("cpu"))
    assert tts.ckpt.device == torch.device("cpu") and tts.synthesize("Hi.", speaker="ryan", max_frames=2).frames == 2
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(omnitts.OmniTTSError, match=r"^device 'cuda': no CUDA device is visible to torch"):
        omnitts.load(ckpt_dir("custom_voice"), device=torch.device("cuda"))
    with pytest.raises(omnitts.OmniTTSError, match=r"^device 'cuda:1': give the kind, 'cuda'"):
        omnitts.load(ckpt_dir("custom_voice"), device=torch.device("cuda", 1))


def test_load_names_a_path_that_is_not_one():
    with pytest.raises(TypeError, match=r"^path: expected the checkpoint directory \(a string or path\), got NoneType$"):
        omnitts.load(None)


def test_load_takes_numpy_sizes_and_tuples(ckpt_dir):
    tts = omnitts.load(ckpt_dir("custom_voice"), max_batch=np.int64(2), graph_buckets=(1, 2))
    assert [a.frames for a in tts.synthesize(["Hi.", "Ho."], speaker="ryan", greedy=True, max_frames=3)] == [3, 3]


def test_a_loaded_model_says_what_it_is_and_runs_on(ckpt_dir):
    """A notebook shows `repr(tts)`: the checkpoint, its kind, and device, dtypes and max batch as loaded."""
    tts = omnitts.load(ckpt_dir("base"), dtype="float32", max_batch=3)
    assert repr(tts) == f"TTS({str(ckpt_dir('base'))!r}, base, cpu, float32, codec float32, max_batch=3)"


@pytest.mark.parametrize("device,visible", [("cuda:1", "CUDA_VISIBLE_DEVICES=1"), ("npu:0", "ASCEND_RT_VISIBLE_DEVICES=0")])
def test_a_device_index_in_load_says_how_to_choose_the_device(ckpt_dir, device, visible):
    """`load(device="cuda:1")` runs nothing on a wrong device: it says how to make that device the current one."""
    kind, index = device.split(":")
    with pytest.raises(omnitts.OmniTTSError, match=re.escape(
            f"device {device!r}: give the kind, {kind!r}, which runs on the process's current device: choose it "
            f"first (torch.{kind}.set_device({index}) before loading, or {visible} before Python starts; on the "
            f"command line: --devices {device})")):
        omnitts.load(ckpt_dir("custom_voice"), device=device)


def test_importing_omnitts_is_light_and_its_names_load_on_first_use():
    """`import omnitts` and the command's quick paths (`--version`, `--help`, an argument refused) leave torch
    unimported (~2 s: every `omnitts --help` paid it, and a Ctrl-C in those seconds printed a traceback); the
    public names load on first use, once, and are the modules' own."""
    import subprocess
    import sys

    probe = """
import sys
import omnitts
from typer.testing import CliRunner
from omnitts.cli import app
runner = CliRunner()
for args in (["--version"], ["--help"], ["synth", "--help"], ["synth", "missing.jsonl", "-m", "nowhere"]):
    result = runner.invoke(app, args)
    assert result.exit_code in (0, 2), (args, result.output)
assert "torch" not in sys.modules, "a quick path imported torch"
assert {"TTS", "load", "Audio", "read_results"} <= set(dir(omnitts))
from omnitts import TTS, Audio, Request, SamplingParams, Voice, load, read_results
import omnitts.api, omnitts.result
assert omnitts.TTS is TTS is omnitts.api.TTS and omnitts.load is load is omnitts.api.load
assert omnitts.Audio is Audio is omnitts.result.Audio and "torch" in sys.modules
try:
    omnitts.no_such_name
except AttributeError as error:
    assert "no_such_name" in str(error)
else:
    raise AssertionError("an unknown name did not raise AttributeError")
namespace = {}
exec("from omnitts import *", namespace)
assert set(omnitts.__all__) <= set(namespace)
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr


@pytest.mark.parametrize("rate, kind, message", [
    (0, ValueError, r"sample_rate: must be > 0 \(samples per second\), got 0"),
    (-24000, ValueError, r"sample_rate: must be > 0 \(samples per second\), got -24000"),
    (24000.0, TypeError, r"sample_rate: expected an int \(samples per second\), got float"),
    (True, TypeError, r"sample_rate: expected an int \(samples per second\), got bool"),
    (None, TypeError, r"sample_rate: expected an int \(samples per second\), got NoneType"),
])
def test_an_audio_built_by_hand_with_a_bad_rate_is_refused_naming_it(rate, kind, message):
    """Audio(samples, 0) was built, and its repr (what a notebook shows) raised ZeroDivisionError."""
    with pytest.raises(kind, match=rf"^{message}$"):
        omnitts.Audio(np.zeros(240, np.float32), rate)
    audio = omnitts.Audio(np.zeros(240, np.float32), np.int64(24000))  # numpy's int, as from a file's header
    assert type(audio.sample_rate) is int and repr(audio) == "Audio(0.01 s @ 24000 Hz)"


@pytest.mark.parametrize("samples, given", [(np.float32(0), "one number (float32)"),
                                            (np.zeros(()), "one number (ndarray)"), (0.5, "one number (float)"),
                                            (object(), "object")])
def test_an_audio_built_by_hand_without_samples_is_refused_naming_them(samples, given):
    """Audio(0.5, 24000) was built, and its repr (what a notebook shows) raised "object of type 'float' has no
    len()". An array, a list of samples or no samples at all (an item without audio) is taken; None (samples that
    streamed to their file, a manifest run's results) shows as such, in repr and in a notebook (it raised
    "object of type 'NoneType' has no len()")."""
    with pytest.raises(TypeError, match=rf"^samples: expected an array of samples, shape \(n,\), got {re.escape(given)}$"):
        omnitts.Audio(samples, 24000)
    assert repr(omnitts.Audio([0.0] * 240, 24000)) == "Audio(0.01 s @ 24000 Hz)"
    assert repr(omnitts.Audio(np.zeros(0, np.float32), 24000)) == "Audio(0.00 s @ 24000 Hz)"
    kept_in_file = omnitts.Audio(None, 24000, id="a")
    assert repr(kept_in_file) == "Audio(id='a', samples not kept @ 24000 Hz)"
    assert "samples: not kept (they streamed to their file); no WAV was made" in kept_in_file._repr_html_()
