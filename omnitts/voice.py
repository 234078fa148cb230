"""Saved voices: a cloned voice in one `.safetensors` file, tied to the checkpoint that encoded it.

A voice file (format version 1) holds
  tensors   `x_vector`   float32 (talker hidden,)  the speaker encoder's embedding of the reference;
            `ref_codes`  int64 (frames, 16)       the codec encoder's codes of the reference (ICL only);
  metadata  (safetensors string metadata)
            format          "omnitts-voice"
            format_version  "1"
            mode            "icl" | "x_vector_only"
            ref_text        the reference transcript ("" in x_vector_only mode)
            ref_audio       file name of the reference clip ("" when it came as samples)
            ref_seconds     its duration, e.g. "4.120"
            created         UTC time of writing, ISO 8601
            omnitts_version the version that wrote it
            checkpoint      identity of the checkpoint that encoded it (see below)
            checkpoint_name that checkpoint's folder name (for people; not checked)

The identity (`checkpoint_identity`) is "<kind>-<size>-<16 hex digits>", a SHA-256 over what shapes a
voice: config.json and speech_tokenizer/config.json (canonical JSON), the header of every weight file
(it lists every tensor's name, dtype, shape and offsets), and the bytes of the tensors that encode
the reference: `speaker_encoder.*` in model.safetensors and `encoder.*` (the codec encoder) in
speech_tokenizer/model.safetensors. The talker's weights are not read (they are most of the GBs), so
it takes a fraction of a second; a copy of the checkpoint in another folder has the same identity.
A voice is refused by a checkpoint whose identity differs (`check_voice`: `TTS.load_voice` at
synthesis, the manifest check in `omnitts validate` and `synth` before the weights load).

This module holds the `Voice` type and reads, writes and checks its files; it knows nothing of models
(the API encodes voices).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from .errors import CheckpointError, VoiceError
from .io import user_path
from .io.atomic import atomic_write, file_mode
from .models.safetensors_io import header_bytes, parse_header
from .version import __version__

FORMAT = "omnitts-voice"
FORMAT_VERSION = 1
MODES = ("icl", "x_vector_only")
READ_CHUNK = 16 * 2**20
NO_REF_TEXT = "an icl voice needs its ref_text, the transcript of its reference codes"
REPR_TEXT = 60  # characters of ref_text a Voice shows


@dataclass
class Voice:
    """A cloned voice (Base checkpoints): speaker embedding, plus reference codes and text for ICL.

    `ref_codes` is None in x-vector-only mode. Build one with `TTS.clone_voice` (or let a request's
    `ref_audio` build it); reuse it across requests to encode the reference only once. `save` writes
    it to a file that `TTS.load_voice` reads back (format in voice.py).
    """

    x_vector: torch.Tensor  # (talker hidden,) float32
    ref_codes: torch.Tensor | None  # (frames, 16) int64
    ref_text: str | None
    checkpoint: str | None = None  # identity of the checkpoint that encoded it (voice.checkpoint_identity)
    meta: dict[str, str] = field(default_factory=dict)  # ref_audio, ref_seconds, checkpoint_name, ...

    @property
    def icl(self) -> bool:
        return self.ref_codes is not None

    def __repr__(self) -> str:
        """One line (the tensors' values would fill a notebook cell, as a long transcript would: its first
        `REPR_TEXT` characters and its length): mode, reference, checkpoint."""
        if self.icl:
            text = self.ref_text
            if isinstance(text, str) and len(text) > REPR_TEXT:
                text = f"{text[:REPR_TEXT]!r}... ({len(text):,} characters)"
            else:
                text = repr(text)
            mode = f"in-context, {len(self.ref_codes)} reference frames, ref_text={text}"
        else:
            mode = "x-vector only"
        return f"Voice({mode}, checkpoint={self.checkpoint!r})"

    def __eq__(self, other) -> bool:
        """Voices are equal where they speak alike: the same embedding, reference codes, transcript and checkpoint
        (the dataclass's == compared the tensors with ==, "RuntimeError: Boolean value of Tensor with more than one
        value is ambiguous"); `meta` (the clip's name, when the file was saved) is not compared, so a voice equals
        itself saved and loaded."""
        if not isinstance(other, Voice):
            return NotImplemented
        return (self.ref_text == other.ref_text and self.checkpoint == other.checkpoint
                and _same_tensor(self.x_vector, other.x_vector) and _same_tensor(self.ref_codes, other.ref_codes))

    def save(self, path) -> Path:
        """Write this voice to `path` (.safetensors), atomically; see `save_voice`."""
        return save_voice(self, path)


def _same_tensor(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Both None, or tensors of one dtype and shape holding the same values (on any devices)."""
    if a is None or b is None:
        return a is b
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.cpu(), b.cpu())


def checkpoint_identity(folder) -> str:
    """The identity of checkpoint `folder` that voices are tied to (see the module docstring)."""
    from .models.loader import safetensors_files

    folder = Path(folder)
    digest = hashlib.sha256(b"omnitts voice identity v1\n")
    top = {}
    for name in ("config.json", "speech_tokenizer/config.json"):
        path = folder / name
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{path}: cannot read ({exc})") from None
        top = top or data
        digest.update(json.dumps(data, sort_keys=True, ensure_ascii=False).encode() + b"\n")
    for files, prefix in ((safetensors_files(folder), "speaker_encoder."),
                          (safetensors_files(folder / "speech_tokenizer"), "encoder.")):
        for path in files:
            _hash_file(digest, path, prefix)
    kind, size = top.get("tts_model_type", "unknown"), top.get("tts_model_size", "unknown")
    return f"{kind}-{size}-{digest.hexdigest()[:16]}"


def _hash_file(digest, path: Path, prefix: str) -> None:
    """Feed `path`'s safetensors header and the bytes of its tensors named `prefix`* into `digest`."""
    try:
        with open(path, "rb") as f:
            raw, header = parse_header(f)
            digest.update(path.name.encode() + b"\n" + raw)
            for name in sorted(k for k in header if k.startswith(prefix)):
                start, end = header[name]["data_offsets"]
                f.seek(8 + len(raw) + start)
                left = end - start
                while left > 0:
                    chunk = f.read(min(left, READ_CHUNK))
                    if not chunk:
                        raise ValueError(f"tensor {name} runs past the end of the file")
                    digest.update(chunk)
                    left -= len(chunk)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None


def save_voice(voice: Voice, path, identity: str | None = None, meta: dict | None = None) -> Path:
    """Write `voice` to `path` (.safetensors), atomically: a temporary name in the folder, then rename.

    `identity` (default `voice.checkpoint`) is the checkpoint the voice belongs to; `meta` adds or
    overrides string metadata (default `voice.meta`: ref_audio, ref_seconds, checkpoint_name). `path` may
    start with `~`; the file gets the mode other outputs get (0666 less the umask). A voice `load_voice`
    would refuse (an in-context voice without its ref_text, tensors that are not tensors) is refused here, as is
    a `path` that holds something else than a voice file (`check_replaceable`).
    """
    path = user_path(path)
    identity = identity or voice.checkpoint
    if not identity:
        raise VoiceError(f"{path}: the voice has no checkpoint identity; make it with TTS.clone_voice")
    if path.suffix.lower() != ".safetensors":  # V.SAFETENSORS too, as a manifest's `voice` and load_voice take it
        raise VoiceError(f"{path}: voice files end in .safetensors")
    check_parts(voice, str(path))
    check_replaceable(path)
    tensors = {"x_vector": voice.x_vector.detach().float().cpu().contiguous()}
    if voice.icl:
        tensors["ref_codes"] = voice.ref_codes.detach().long().cpu().contiguous()
    # What load_voice refuses, refused before writing (a file it cannot read back), float codes before `long`
    # would cut them
    x_vector, codes = tensors["x_vector"], voice.ref_codes
    if x_vector.dim() != 1 or not torch.isfinite(x_vector).all():
        raise VoiceError(f"{path}: x_vector must be a vector of finite float32 values; got {voice.x_vector.dtype} "
                         f"{tuple(voice.x_vector.shape)}")
    if codes is not None and (codes.dim() != 2 or codes.shape[0] == 0 or not _integer(codes)):
        raise VoiceError(f"{path}: ref_codes must be integer (frames, groups), one frame at least; got {codes.dtype} "
                         f"{tuple(codes.shape)}")
    info = {"ref_audio": "", "ref_seconds": "", "checkpoint_name": "", **voice.meta, **(meta or {})}
    info.update(format=FORMAT, format_version=str(FORMAT_VERSION), mode="icl" if voice.icl else "x_vector_only",
                ref_text=(voice.ref_text or "") if voice.icl else "", checkpoint=identity,
                created=datetime.now(timezone.utc).isoformat(timespec="seconds"), omnitts_version=__version__)
    from safetensors.torch import save_file

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):  # a file where a folder would be ("File exists" named neither)
        in_way = next((folder for folder in path.parents if folder.exists() and not folder.is_dir()), path.parent)
        raise VoiceError(f"{path}: {in_way} is a file, not a directory; nothing was written") from None
    except OSError as exc:
        raise VoiceError(f"{path}: cannot write the voice file ({exc.strerror or exc})") from None
    try:
        with atomic_write(path) as tmp:
            save_file(tensors, tmp, metadata={k: str(v) for k, v in info.items()})
            os.chmod(tmp, file_mode())  # safetensors writes a new file of mode 0600
    except OSError as exc:
        raise VoiceError(f"{path}: cannot write the voice file ({exc.strerror or exc})") from None
    return path


def check_replaceable(path: Path) -> None:
    """Raise VoiceError if `path` holds a safetensors file of tensors no voice has: a voice saved by mistake as a
    checkpoint's model.safetensors would destroy it; or an audio file (`--ref-audio clip.safetensors --save
    clip.safetensors` wrote the voice over its own reference clip). A voice file, and one that is neither a
    readable safetensors file nor audio (a damaged voice being replaced), may be written over."""
    if not path.is_file():  # absent, or a folder (refused where it is written)
        return
    try:
        with open(path, "rb") as f:
            header = json.loads(header_bytes(f))
    except (OSError, ValueError):  # (a header past MAX_HEADER, or cut short, too)
        if _is_audio(path):  # after the header: a voice's 8-byte header length may begin as an MP3 frame does
            raise VoiceError(f"{path}: is an audio file (a reference clip?), which a voice is not written over; give "
                             "the voice file another name") from None
        return  # no safetensors file
    others = sorted(set(header) - {"__metadata__", "x_vector", "ref_codes"}) if isinstance(header, dict) else []
    if others:
        listed = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        raise VoiceError(f"{path}: holds other tensors than a voice's ({listed}: a checkpoint's weights?), which a "
                         "voice is not written over; give another file name, or remove that file first")


_AUDIO_MAGIC = (b"RIFF", b"RF64", b"fLaC", b"OggS", b"ID3", b"FORM", b"\xff\xfb", b"\xff\xf3", b"\xff\xf2")


def _is_audio(path: Path) -> bool:
    """Whether `path` starts as an audio file does (WAV, FLAC, Ogg, MP3, AIFF): a reference clip, not a voice."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(4)
    except OSError:
        return False
    return head.startswith(_AUDIO_MAGIC)


def saved_mode(path) -> str | None:
    """The mode ("icl" or "x_vector_only") voice file `path` was saved in, from its header's metadata alone (no
    tensor is read); None where it is no readable voice file (`load_voice` says what is wrong with it)."""
    try:
        with open(path, "rb") as handle:
            meta = json.loads(header_bytes(handle)).get("__metadata__") or {}
        return meta["mode"] if meta.get("format") == FORMAT and meta.get("mode") in MODES else None
    except (OSError, ValueError, AttributeError, TypeError):  # unreadable, no JSON, JSON that is no object
        return None


def voice_mode(voice) -> str | None:
    """The mode ("icl" or "x_vector_only") of `voice`, a Voice or a voice file's path (`saved_mode`: None where
    the file's mode cannot be read)."""
    if isinstance(voice, Voice):
        return "icl" if voice.icl else "x_vector_only"
    return saved_mode(user_path(voice))


def mode_conflict(x_vector_only: bool, mode: str | None, named: str) -> str | None:
    """What is wrong with `x_vector_only` given beside a saved voice of `mode` (`named`: how the message names
    the voice), or None. A saved voice keeps the mode it was saved in: the value that says that mode says nothing
    more (a table's boolean column has one on every row), the other asks for what the voice cannot do. None too
    where the mode is unknown (None: `load_voice` says what is wrong with the file)."""
    if mode is None or x_vector_only == (mode == "x_vector_only"):
        return None
    asks, saved = (("x-vector-only cloning", "in context (it holds reference codes)") if x_vector_only
                   else ("in-context cloning", "x-vector only (it holds no reference codes)"))
    return (f"x_vector_only: {str(x_vector_only).lower()} asks for {asks}, which {named} does not do: it was "
            f"saved {saved}, and a saved voice keeps the mode it was saved with; remove x_vector_only (or clone "
            "from ref_audio)")


def load_voice(path) -> tuple[Voice, dict]:
    """Read a voice file -> (Voice, its metadata). Raises VoiceError naming the file if it is not one.

    The checkpoint is not checked here (see `TTS.load_voice`). `path` may start with `~`.
    """
    from safetensors import safe_open

    path = user_path(path)
    if not path.is_file():  # a folder is there, not "not found"
        what = ("is a directory" if path.is_dir() else "is not a regular file") if path.exists() else "not found"
        raise VoiceError(f"{path}: voice file {what}")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = dict(f.metadata() or {})
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except Exception as exc:  # safetensors raises its own error types for corrupt files
        if _is_audio(path):  # the reference clip itself ("header too large" said nothing of that)
            raise VoiceError(f"{path}: is an audio file, not a saved voice: give it as ref_audio (a reference "
                             "clip), or clone it once and give the saved voice (TTS.clone_voice(ref_audio)"
                             ".save('v.safetensors'); command line: omnitts voice-clone --ref-audio CLIP --save "
                             "v.safetensors)") from None
        raise VoiceError(f"{path}: not a saved voice (unreadable safetensors file: {exc})") from None
    if meta.get("format") != FORMAT:
        raise VoiceError(f"{path}: not a saved voice (no format={FORMAT} metadata); "
                         "make one with `omnitts voice-clone --save`")
    version = meta.get("format_version", "")
    if not version.isdigit() or int(version) > FORMAT_VERSION:
        raise VoiceError(f"{path}: voice format version {version!r} is not supported (this omnitts reads "
                         f"up to {FORMAT_VERSION}); upgrade omnitts or re-create the voice")
    mode = meta.get("mode")
    if mode not in MODES:
        raise VoiceError(f"{path}: mode {mode!r} is not one of {', '.join(MODES)}")
    if not meta.get("checkpoint"):
        raise VoiceError(f"{path}: no checkpoint identity in the metadata")
    expected = {"x_vector", "ref_codes"} if mode == "icl" else {"x_vector"}
    if set(tensors) != expected:
        raise VoiceError(f"{path}: a voice of mode {mode} holds tensors {', '.join(sorted(expected))}; "
                         f"this file holds {', '.join(sorted(tensors)) or 'none'}")
    x_vector, ref_codes = tensors["x_vector"], tensors.get("ref_codes")
    if x_vector.dim() != 1 or x_vector.dtype != torch.float32 or not torch.isfinite(x_vector).all():
        raise VoiceError(f"{path}: x_vector must be a finite float32 vector; got {x_vector.dtype} "
                         f"{tuple(x_vector.shape)}")
    if ref_codes is not None:
        if ref_codes.dim() != 2 or ref_codes.dtype != torch.int64 or ref_codes.shape[0] == 0:
            raise VoiceError(f"{path}: ref_codes must be int64 (frames, groups); got {ref_codes.dtype} "
                             f"{tuple(ref_codes.shape)}")
        if not meta.get("ref_text", "").strip():
            raise VoiceError(f"{path}: {NO_REF_TEXT}")
    voice = Voice(x_vector, ref_codes, meta.get("ref_text") if mode == "icl" else None,
                  checkpoint=meta["checkpoint"], meta=meta)
    return voice, meta


def check_voice(voice: Voice, meta: dict, path, identity: str, cfg) -> None:
    """Raise VoiceError naming `path` unless `voice` fits the checkpoint of `identity` and config `cfg`.

    The voice must have been made with that checkpoint (same identity) and have its shapes (x_vector of
    the talker's hidden size, ref_codes of its code groups).
    """
    where = cfg.path if cfg.path is not None else "this checkpoint"
    if voice.checkpoint != identity:
        made_with = voice.checkpoint + (f" ({meta['checkpoint_name']})" if meta.get("checkpoint_name") else "")
        raise VoiceError(f"{path}: this voice was made with checkpoint {made_with}, not with {where} ({identity}); "
                         f"re-create it with `omnitts voice-clone --model {where} --save ...`")
    check_fits(voice, cfg, str(path))


def _integer(codes: torch.Tensor) -> bool:
    """Whether `codes` are of an integer dtype (bool is none: True and False are no codes)."""
    return not (codes.is_floating_point() or codes.is_complex() or codes.dtype == torch.bool)


def check_parts(voice: Voice, where: str) -> None:
    """Raise VoiceError (naming `where` and the field) unless `voice` holds what every voice file holds: tensors
    (a numpy array would fail deep inside), and for an in-context voice its transcript (without it the voice
    would speak from an empty one, and its file would be refused when read)."""
    for name in ("x_vector", "ref_codes"):
        value = getattr(voice, name)
        if not isinstance(value, torch.Tensor) and (value is not None or name == "x_vector"):
            raise VoiceError(f"{where}: {name} must be a torch.Tensor, got {type(value).__name__} "
                             f"(torch.from_numpy converts an array)")
    if voice.ref_codes is not None and not (isinstance(voice.ref_text, str) and voice.ref_text.strip()):
        raise VoiceError(f"{where}: {NO_REF_TEXT} (got {voice.ref_text!r})")


def check_fits(voice: Voice, cfg, where: str) -> None:
    """Raise VoiceError (naming `where`) unless `voice` is whole (`check_parts`) and its tensors fit config
    `cfg`: an x_vector of the talker's width, finite; reference codes of its code groups, each inside its
    codebook (a crafted or damaged file would otherwise index past an embedding table)."""
    check_parts(voice, where)
    hidden, groups = cfg.talker.hidden_size, cfg.talker.num_code_groups
    codebook = cfg.codec.decoder.codebook_size
    x_vector, codes = voice.x_vector, voice.ref_codes
    if x_vector.dim() != 1 or x_vector.shape[0] != hidden or not torch.isfinite(x_vector).all():
        raise VoiceError(f"{where}: x_vector must be {hidden} finite values for this checkpoint; got "
                         f"{x_vector.dtype} {tuple(x_vector.shape)}")
    if codes is None:
        return
    if codes.dim() != 2 or codes.shape[0] == 0 or codes.shape[1] != groups or not _integer(codes):
        raise VoiceError(f"{where}: ref_codes must be integer (frames, {groups}) for this checkpoint; got "
                         f"{codes.dtype} {tuple(codes.shape)}")
    low, high = int(codes.min()), int(codes.max())
    if low < 0 or high >= codebook:
        raise VoiceError(f"{where}: ref_codes hold values from {low} to {high}; codes of this checkpoint lie "
                         f"in 0..{codebook - 1} (the file is damaged or not made by omnitts)")
