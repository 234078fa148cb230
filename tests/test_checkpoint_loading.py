"""Loading: strict tensor mapping and one clear error naming the file and tensor/field."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

import omnitts
from omnitts.errors import CheckpointError


@pytest.fixture
def cv_copy(ckpt_dir, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(ckpt_dir("custom_voice"), dst)
    return dst


def test_every_kind_and_size_loads(ckpt_dir):
    for kind in ("custom_voice", "voice_design", "base"):
        for preset in ("tiny-0.6b", "tiny-1.7b"):
            tts = omnitts.load(ckpt_dir(kind, preset), dtype="float32")
            assert tts.info()["kind"] == kind
            projection = tts.ckpt.model.talker.code_predictor.small_to_mtp_projection
            assert isinstance(projection, torch.nn.Identity) == (preset == "tiny-0.6b")
            assert (tts.ckpt.codec_encoder is not None) == (kind == "base")


def test_missing_config_file(cv_copy):
    (cv_copy / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"config\.json: file not found"):
        omnitts.load(cv_copy)


def test_missing_speech_tokenizer_weights(cv_copy):
    (cv_copy / "speech_tokenizer" / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"speech_tokenizer/model\.safetensors: file not found"):
        omnitts.load(cv_copy)


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "speech_tokenizer/model.safetensors", "vocab.json"])
def test_a_link_to_a_missing_blob_is_named_as_such(cv_copy, tmp_path, name):
    """A Hugging Face cache snapshot copied without its blobs/ (`cp -r snapshots/<hash> x`) holds links that lead
    nowhere: "file not found" named a file `ls` shows."""
    from omnitts.cli import app

    (cv_copy / name).unlink()
    (cv_copy / name).symlink_to("../../blobs/0123abcd")
    message = (f"{cv_copy / name}: is a symbolic link to ../../blobs/0123abcd, which does not exist (a Hugging Face "
               "cache snapshot copied without its blobs/? copy it with cp -rL, or give the snapshot folder in the cache)")
    with pytest.raises(CheckpointError) as caught:
        omnitts.load(cv_copy)
    assert str(caught.value) == message
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"id": "a", "text": "Hi.", "speaker": "ryan"}) + "\n")
    result = CliRunner().invoke(app, ["synth", str(manifest), "-m", str(cv_copy), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2 and result.output.endswith(f"error: {message}\n"), result.output


def test_a_hugging_face_cache_folder_names_its_snapshot(ckpt_dir, tmp_path):
    """`models--Qwen--X/` (what `huggingface-cli download` leaves in the hub cache) holds the checkpoint in
    snapshots/<commit>/: "config.json: file not found (is this a Qwen3-TTS-12Hz checkpoint directory?)" said nothing
    of where it was."""
    from omnitts.cli import app

    repo = tmp_path / "models--Qwen--Qwen3-TTS-12Hz-0.6B-CustomVoice"
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("b" * 40)
    shutil.copytree(ckpt_dir("custom_voice"), repo / "snapshots" / ("b" * 40))
    (repo / "snapshots" / ("a" * 40)).mkdir()  # an older revision
    message = (f"{repo}: is a Hugging Face cache folder; give the checkpoint inside it, its snapshot "
               f"({repo / 'snapshots' / ('b' * 40)})")
    with pytest.raises(CheckpointError) as caught:
        omnitts.load(repo)
    assert str(caught.value) == message
    info = CliRunner().invoke(app, ["info", str(repo)])
    assert info.exit_code == 2 and info.output == f"error: {message}\n", info.output
    assert CliRunner().invoke(app, ["info", str(repo / "snapshots" / ("b" * 40))]).exit_code == 0


@pytest.mark.parametrize("name", ["config.json", "generation_config.json", "speech_tokenizer/config.json"])
def test_an_unreadable_config_file_is_not_called_invalid_json(cv_copy, monkeypatch, name):
    """A config file the user may not read (another user's download of mode 0600; root reads any, so the open is
    made to fail) was "not valid JSON ([Errno 13] Permission denied: ...)"."""
    import pathlib

    read_text = pathlib.Path.read_text

    def refuse(self, *args, **kwargs):
        if self == cv_copy / name:
            raise PermissionError(13, "Permission denied", str(self))
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "read_text", refuse)
    with pytest.raises(CheckpointError) as caught:
        omnitts.load(cv_copy)
    assert str(caught.value) == f"{cv_copy / name}: cannot read (Permission denied)"


def _safetensors(header: bytes) -> bytes:
    return len(header).to_bytes(8, "little") + header


@pytest.mark.parametrize("content, problem", [
    (b"\xff" * 100, "header of 18446744073709551615 bytes"),  # a length field of garbage: no read of it
    (b"\x07\x00\x00\x00\x00\x00\x00\x00[1,2,3]", "header is not a JSON object"),
    (b"abc", "truncated: 3 bytes long, too short for a safetensors file; an interrupted copy or download?"),
    # a copy cut short (in the header, or in the tensors: info read the header alone and said nothing of it)
    (lambda whole: whole[:100], "truncated: the file ends 92 bytes into its {header:,}-byte header; an interrupted "
                                "copy or download?"),
    (lambda whole: whole[:-1], "truncated: its header needs a file of {size:,} bytes, this one holds {cut:,}; an "
                               "interrupted copy or download?"),
    # a tensor's entry that is not one (a TypeError traceback from info and loading)
    (_safetensors(b'{"a": 5}'), "tensor 'a': expected dtype, shape and data_offsets, got 5"),
    (_safetensors(b'{"a": {"dtype": "F32", "shape": "x", "data_offsets": [0, 4]}}'),
     "tensor 'a': expected dtype, shape and data_offsets, got {'dtype': 'F32', 'shape': 'x', 'data_offsets': [0, 4]}"),
], ids=["length", "not-an-object", "short", "cut-header", "cut-tensors", "entry", "shape"])
@pytest.mark.parametrize("name", ["model.safetensors", "speech_tokenizer/model.safetensors"])
def test_a_damaged_weights_file_is_one_checkpoint_error_from_the_cli_and_the_library(cv_copy, tmp_path, name, content,
                                                                                      problem):
    from typer.testing import CliRunner

    from omnitts.cli import app
    from omnitts.voice import checkpoint_identity

    whole = (cv_copy / name).read_bytes()
    if callable(content):
        content = content(whole)
        problem = problem.format(header=int.from_bytes(whole[:8], "little"), size=len(whole), cut=len(content))
    (cv_copy / name).write_bytes(content)
    message = f"{cv_copy / name}: not a readable safetensors file ({problem})"
    with pytest.raises(CheckpointError) as caught:
        checkpoint_identity(cv_copy)  # what synth reads first (every record's fingerprint holds it)
    assert str(caught.value) == message
    with pytest.raises(CheckpointError):
        omnitts.load(cv_copy)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"id": "a", "text": "Hi.", "speaker": "ryan"}) + "\n")
    result = CliRunner().invoke(app, ["synth", str(manifest), "-m", str(cv_copy), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2 and result.output == f"error: {message}\n", result.output
    info = CliRunner().invoke(app, ["info", str(cv_copy)])
    assert info.exit_code == 2 and info.output == f"error: {message}\n", info.output


def _rewrite_weights(path, change):
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path))


def test_missing_tensor_is_named(cv_copy):
    _rewrite_weights(cv_copy / "model.safetensors", lambda t: t.pop("talker.codec_head.weight"))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: missing tensor talker\.codec_head\.weight"):
        omnitts.load(cv_copy)


def test_misshaped_tensor_is_named(cv_copy):
    def shrink(t):
        t["talker.model.norm.weight"] = t["talker.model.norm.weight"][:-1].clone()
    _rewrite_weights(cv_copy / "model.safetensors", shrink)
    with pytest.raises(CheckpointError, match=r"tensor talker\.model\.norm\.weight has shape \(63,\), config\.json implies \(64,\)"):
        omnitts.load(cv_copy)


def test_unexpected_tensor_is_named(cv_copy):
    _rewrite_weights(cv_copy / "model.safetensors", lambda t: t.update({"speaker_encoder.fc.bias": torch.zeros(4)}))
    with pytest.raises(CheckpointError, match=r"unexpected tensor speaker_encoder\.fc\.bias"):
        omnitts.load(cv_copy)


@pytest.mark.parametrize("field,value,message", [
    ("tokenizer_type", "qwen3_tts_tokenizer_25hz", "tokenizer_type='qwen3_tts_tokenizer_25hz' is not supported"),
    ("tts_model_type", "dialogue", "tts_model_type='dialogue' is not one of"),
])
def test_unsupported_config_field(cv_copy, field, value, message):
    config = json.loads((cv_copy / "config.json").read_text())
    config[field] = value
    (cv_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=message):
        omnitts.load(cv_copy)


def test_a_checkpoints_codec_folder_is_named_as_such(ckpt_dir):
    """`-m CKPT/speech_tokenizer` (or `load` of it) said "tokenizer_type=None is not supported; omnitts runs
    'qwen3_tts_tokenizer_12hz' checkpoints", as if the checkpoint were of another kind: it names the folder above."""
    from omnitts.cli import app

    ckpt = ckpt_dir("custom_voice")
    codec = ckpt / "speech_tokenizer"
    message = f"{codec}: is a checkpoint's codec folder (its speech_tokenizer/); give the checkpoint directory that holds it"
    with pytest.raises(CheckpointError, match=re.escape(message)):
        omnitts.load(codec)
    result = CliRunner().invoke(app, ["info", str(codec)])
    assert result.exit_code == 2 and " ".join(result.output.split()) == f"error: {message} ({ckpt.resolve()})", result.output


def test_bfloat16_keeps_codec_float32(ckpt_dir):
    tts = omnitts.load(ckpt_dir("custom_voice"), dtype="bfloat16")
    assert tts.ckpt.model.talker.codec_head.weight.dtype == torch.bfloat16
    assert tts.ckpt.codec.pre_conv.conv.weight.dtype == torch.float32
    result = tts.synthesize("Half precision still speaks.", speaker="ryan", greedy=True, max_frames=6)
    assert result.frames == 6 and result.audio.dtype.name == "float32"


def test_codec_dtype_is_asked_for_and_checked(ckpt_dir):
    tts = omnitts.load(ckpt_dir("custom_voice"), dtype="float32", codec_dtype="bfloat16")
    assert tts.ckpt.model.talker.codec_head.weight.dtype == torch.float32
    assert {p.dtype for p in tts.ckpt.codec.parameters()} == {torch.bfloat16}
    result = tts.synthesize("A lighter codec.", speaker="ryan", greedy=True, max_frames=6)
    assert result.frames == 6 and result.audio.dtype.name == "float32" and result.audio.std() > 0
    with pytest.raises(ValueError, match="codec_dtype: 'float16' is not one of float32, bfloat16"):
        omnitts.load(ckpt_dir("custom_voice"), codec_dtype="float16")


def test_float32_on_an_accelerator_turns_tf32_and_hf32_off(ckpt_dir, monkeypatch):
    """A float32 run on CUDA or an NPU computes in float32: TF32 (cuDNN convolutions allow it by default)
    and HF32 (torch_npu's convolutions allow it by default) are switched off; bfloat16 runs keep the defaults."""
    import types

    import torch

    from omnitts.device import prepare_weights
    from omnitts.models.loader import load_models

    models = load_models(ckpt_dir("custom_voice"), torch.device("cpu"), torch.float32, torch.float32)
    # Saved and restored by hand: these switches are served by the backends' __getattr__, which pytest's
    # monkeypatch (newer releases) cannot undo.
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
        prepare_weights(models, torch.device("cuda"), torch.bfloat16, torch.float32)
        assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32
        prepare_weights(load_models(ckpt_dir("custom_voice"), torch.device("cpu"), torch.float32, torch.float32),
                        torch.device("cuda"), torch.float32, torch.float32)
        assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved
    npu = types.SimpleNamespace(matmul=types.SimpleNamespace(allow_hf32=True),
                                conv=types.SimpleNamespace(allow_hf32=True))
    monkeypatch.setattr(torch, "npu", npu, raising=False)  # what torch_npu registers
    npu_device = types.SimpleNamespace(type="npu")  # torch.device("npu") exists only once torch_npu is imported
    prepare_weights(load_models(ckpt_dir("custom_voice"), torch.device("cpu"), torch.float32, torch.float32),
                    npu_device, torch.float32, torch.float32)
    assert not npu.matmul.allow_hf32 and not npu.conv.allow_hf32


def test_cuda_turns_cudnn_attention_off_unless_asked(ckpt_dir, monkeypatch):
    """On CUDA omnitts' sdpa calls stop taking cuDNN attention (a host-side plan per new shape: 1.3 ms a call
    over a run's eager frames on an H200); OMNITTS_CUDNN_ATTENTION=1 keeps it; the CPU leaves it alone."""
    import torch

    from omnitts.device import prepare_weights
    from omnitts.models.loader import load_models

    def prepared(device):
        models = load_models(ckpt_dir("custom_voice"), torch.device("cpu"), torch.float32, torch.float32)
        prepare_weights(models, torch.device(device), torch.bfloat16, torch.float32)
        return torch.backends.cuda.cudnn_sdp_enabled()

    if not hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        pytest.skip("this torch has no cuDNN attention switch")
    saved = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        assert prepared("cpu")
        assert not prepared("cuda")
        torch.backends.cuda.enable_cudnn_sdp(True)
        monkeypatch.setenv("OMNITTS_CUDNN_ATTENTION", "1")
        assert prepared("cuda")
    finally:
        torch.backends.cuda.enable_cudnn_sdp(saved)


@pytest.mark.parametrize("generation,message", [
    ({"top_k": -3, "temperature": 0}, "temperature: must be > 0, got 0"),
    ({"top_k": -3}, r"top_k: must be >= 0 \(0 = off\), got -3"),
    ({"max_new_tokens": "x"}, "max_new_tokens: must be an integer >= 1, got 'x'"),
    ({"do_sample": "yes"}, "do_sample: expected a bool, got str"),
])
def test_bad_sampling_defaults_are_refused_at_load(cv_copy, generation, message):
    """They used to load, then fail every synthesize with a bare ValueError naming neither file nor field."""
    (cv_copy / "generation_config.json").write_text(json.dumps(generation))
    with pytest.raises(CheckpointError, match=rf"generation_config\.json: {message}; correct the field or remove it"):
        omnitts.load(cv_copy)


@pytest.mark.parametrize("change,message", [
    (lambda t: t["spk_id"].update(ryan=1000000000), r"spk_id\['ryan'\]=1000000000 is not a codec id: "
                                                    r"the codec embedding has vocab_size=3072 rows \(ids 0\.\.3071\)"),
    (lambda t: t["spk_id"].update(ryan=-1), r"spk_id\['ryan'\]=-1 is not a codec id"),
    (lambda t: t["spk_id"].update(ryan="3061"), r"spk_id\['ryan'\]='3061' is not a codec id"),
    (lambda t: t["codec_language_id"].update(english=3072), r"codec_language_id\['english'\]=3072 is not a codec id"),
    (lambda t: t.update(codec_pad_id=5000), r"codec_pad_id=5000 is not a codec id"),
    (lambda t: t["spk_is_dialect"].update(eric="klingon_dialect"),
     r"spk_is_dialect\['eric'\]='klingon_dialect' is not a language of codec_language_id"),
])
def test_ids_outside_the_codec_embedding_are_refused_at_load(cv_copy, change, message):
    """A speaker, language or special id the codec embedding has no row for was an IndexError at synthesis."""
    config = json.loads((cv_copy / "config.json").read_text())
    change(config["talker_config"])
    (cv_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=rf"config\.json: talker_config: {message}"):
        omnitts.load(cv_copy)



@pytest.mark.parametrize("file, where, value", [
    ("config.json", "talker_config.hidden_size", "96"),
    ("config.json", "talker_config.num_hidden_layers", -1),
    ("config.json", "talker_config.num_attention_heads", 0),
    ("config.json", "talker_config.vocab_size", 3072.0),
    ("config.json", "talker_config.code_predictor_config.num_hidden_layers", True),
    ("speech_tokenizer/config.json", "decoder_config.num_hidden_layers", "8"),
    ("speech_tokenizer/config.json", "output_sample_rate", -24000),
])
def test_a_size_or_count_that_is_not_a_positive_integer_is_refused_naming_file_and_field(cv_copy, file, where,
                                                                                          value):
    """A string "96" was a torch TypeError traceback at synthesis; a -1 was shown by `omnitts info` as is."""
    _refused_after_setting(cv_copy, file, where, value, "a positive integer")


@pytest.mark.parametrize("file, where, value, expected", [
    ("config.json", "talker_config.spk_id", ["ryan"], "a JSON object"),
    ("config.json", "talker_config.codec_language_id", "english", "a JSON object"),
    ("config.json", "talker_config.rope_scaling", [1], "a JSON object"),
    ("config.json", "talker_config.code_predictor_config", [1], "a JSON object"),
    ("config.json", "talker_config.rms_norm_eps", "1e-6", "a number"),
    ("config.json", "talker_config.attention_bias", "no", "true or false"),
    ("speech_tokenizer/config.json", "decoder_config", [1], "a JSON object"),
    ("speech_tokenizer/config.json", "encoder_config", [1], "a JSON object"),
    ("speech_tokenizer/config.json", "decoder_config.upsample_rates", 8, "a JSON array"),
])
def test_a_config_field_of_another_json_kind_is_refused_naming_file_and_field(cv_copy, file, where, value, expected):
    """An array where an object belongs (`"spk_id": [...]`) was an AttributeError traceback from `info` and load; a
    string where a number belongs passed `info` and failed inside torch at the first synthesis."""
    _refused_after_setting(cv_copy, file, where, value, expected)


@pytest.mark.parametrize("name, value", [("tts_pad_token_id", 10**7), ("tts_bos_token_id", -1),
                                         ("tts_eos_token_id", "151673"), ("tts_pad_token_id", 151936)])
def test_a_tts_token_id_outside_the_text_embedding_is_refused_at_load(cv_copy, name, value):
    """config.json's tts_pad/bos/eos_token_id index the text embedding in every prompt: one outside it loaded and
    failed the first synthesis with torch's bare "IndexError: index out of range in self" (a string, with
    "'str' object cannot be interpreted as an integer"), naming neither file nor field."""
    config = json.loads((cv_copy / "config.json").read_text())
    config[name] = value
    (cv_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=rf"config\.json: {name}={value!r} is not a text token id: the text "
                                              r"embedding has text_vocab_size=151936 rows \(ids 0\.\.151935\)$"):
        omnitts.load(cv_copy)


@pytest.mark.parametrize("file, where, value", [
    ("config.json", "talker_config.rope_theta", -1),
    ("config.json", "talker_config.rope_theta", 0),
    ("config.json", "talker_config.code_predictor_config.rope_theta", float("nan")),
    ("config.json", "talker_config.rms_norm_eps", -1e-6),
    ("speech_tokenizer/config.json", "decoder_config.rope_theta", float("-inf")),
    ("speech_tokenizer/config.json", "decoder_config.rms_norm_eps", 0),
])
def test_a_rope_base_or_norm_epsilon_that_is_not_a_positive_number_is_refused(cv_copy, file, where, value):
    """A negative or zero rope_theta (or a NaN: Python's JSON reads NaN) loaded and synthesized NaN rotations into
    every attention, codes from NaN logits without a word; a negative rms_norm_eps NaN norms alike."""
    _refused_after_setting(cv_copy, file, where, value, "a positive number")


def _refused_after_setting(ckpt, file: str, where: str, value, expected: str) -> None:
    """Set field `where` (dotted) of `file` in checkpoint `ckpt` to `value`: `load` and `omnitts info` refuse it
    with one message naming the file and field ("expected EXPECTED, got VALUE"), info with exit 2."""
    from typer.testing import CliRunner

    from omnitts.cli import app

    path = ckpt / file
    config = json.loads(path.read_text())
    *parents, field = where.split(".")
    section = config
    for key in parents:
        section = section[key]
    section[field] = value
    path.write_text(json.dumps(config))
    message = f"{path}: {where}: expected {expected}, got {value!r}"
    with pytest.raises(CheckpointError) as raised:
        omnitts.load(ckpt)
    assert str(raised.value) == message
    result = CliRunner().invoke(app, ["info", str(ckpt)])
    assert result.exit_code == 2 and result.output == f"error: {message}\n", result.output


def test_a_checkpoint_path_that_cannot_be_looked_up_is_one_error(ckpt_dir, tmp_path):
    """A name too long for the filesystem (or, for a user, a folder above it without search permission): pathlib
    raises the OSError before Python 3.12; info and validate showed its traceback, synth said "cannot write
    CKPT: ... 0 items done" and exited 1."""
    from typer.testing import CliRunner

    from omnitts.cli import app

    model = tmp_path / ("c" * 300)
    message = f"{model}: cannot read checkpoint directory (File name too long)"
    with pytest.raises(CheckpointError, match=re.escape(message)):
        omnitts.load(model)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"id": "a", "text": "Hi.", "speaker": "ryan"}) + "\n")
    for command in (["info", str(model)], ["validate", str(manifest), "-m", str(model)],
                    ["synth", str(manifest), "-m", str(model), "-o", str(tmp_path / "out")]):
        result = CliRunner().invoke(app, command)
        assert result.exit_code == 2 and result.output == f"error: {message}\n", (command[0], result.output)
