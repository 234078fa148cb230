"""What an item's audio was made from, as one short digest kept in its record (`fingerprint`).

A re-run compares each item's fingerprint with its last record's: equal, the item is done and skipped;
different, it runs again and its file is replaced atomically (the record says why it was redone). In
it: everything the manifest line and the run's options ask for -
  - the request: text, language, speaker, instruct, ref_text, x_vector_only, non_streaming, max_seconds,
    and the *contents* of its reference clip or saved voice file (not their paths: a moved file is
    the same input, an edited one is not);
  - the sampling parameters after defaults, flags and the line's overrides (seed and frame budget
    included);
  - the output format, the loudness target and the long-text split limit;
  - the tokenizer, where it is the official package's (`--official-tokenizer`: other token ids for some
    texts, so other audio; left out otherwise, so the records made before it counted keep their prints);
  - the checkpoint's identity (voice.checkpoint_identity: its configs and encoders, not the talker's
    weights).
Not in it: device, dtype, batch size, threads and the omnitts version. They may move the last bits of
the audio, but not what the line asks for, so a directory can be finished on another machine. An
unseeded sampled item has seed None here, so it is not redone merely because its random seed differs.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from pathlib import Path

from ..io.versioned import per_version

VERSION = 1  # bump when what goes in changes: every record made before is redone once


def fingerprint(request, params, checkpoint: str, audio_format: str, loudness: float | None = None,
                split_chars: int | None = None, official_tokenizer: bool = False) -> str:
    """The digest of what `request` sampled with `params` asks for (see the module docstring)."""
    fields = {
        "version": VERSION, "text": request.text, "language": request.language, "speaker": request.speaker,
        "instruct": request.instruct, "ref_text": request.ref_text, "x_vector_only": request.x_vector_only,
        "non_streaming": request.non_streaming, "max_seconds": request.max_seconds,
        "ref_audio": _source(request.ref_audio), "voice": _source(request.voice),
        "sampling": {name: getattr(params, name) for name in _field_names(type(params))}, "checkpoint": checkpoint, "format": audio_format, "loudness": loudness,
        "split_chars": split_chars,
    }
    if official_tokenizer:  # only where on: every print made with the default tokenizer stays as it was
        fields["tokenizer"] = "official"
    text = json.dumps(fields, sort_keys=True, ensure_ascii=False, default=repr)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


@functools.cache
def _field_names(cls) -> tuple[str, ...]:
    """A dataclass's field names, in order: its fields as `dataclasses.asdict` gives them (scalars, which asdict
    would only copy), without asdict's deep copy per item."""
    return tuple(field.name for field in dataclasses.fields(cls))


def same_print(recorded: str | None, current: str, old: bool = True) -> bool:
    """Whether a record's fingerprint stands for `current`. A record from before fingerprints (None)
    counts as the same when `old` (good records: not redone merely because omnitts was upgraded), and
    as different otherwise (a failed record without one is a bad line, which a fixed line replaces)."""
    return recorded == current or (recorded is None and old)


def _source(value) -> str | None:
    """A reference clip or voice: the digest of a file's bytes; of samples and rate; of a Voice's tensors."""
    if value is None:
        return None
    if isinstance(value, (str, Path)):
        path = Path(value).expanduser().resolve()
        try:
            return file_digest(str(path))
        except OSError:
            return f"missing:{path}"  # it fails when it runs; a later fix of the file is a change
    digest = hashlib.sha256()
    if isinstance(value, tuple):  # (samples, rate)
        import numpy as np

        digest.update(np.ascontiguousarray(value[0], dtype=np.float32).tobytes())
        digest.update(str(int(value[1])).encode())
        return digest.hexdigest()[:16]
    for tensor in (value.x_vector, value.ref_codes):  # a Voice
        if tensor is not None:
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    digest.update(repr((value.ref_text, value.checkpoint)).encode())
    return digest.hexdigest()[:16]


@per_version()  # one clip or voice file is often named on many lines
def file_digest(path: str) -> str:
    """SHA-256 of a file's bytes (first 16 hex digits); cached while its size and mtime stay."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]
