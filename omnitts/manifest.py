"""Reading a JSONL manifest into requests, with errors that name the file, line and field.

One JSON object per line:
    {"id": "intro", "text": "Hello.", "language": "english", "speaker": "ryan"}
Fields: id, text, language, speaker, instruct, ref_audio, ref_text, x_vector_only, non_streaming,
seed, max_seconds, voice (a saved voice file). Relative `ref_audio` and `voice` paths resolve against
the manifest's folder. Blank lines are skipped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .errors import OmniTTSError, RequestError
from .prompt import resolve
from .request import Request

FIELDS = {"id": str, "text": str, "language": str, "speaker": str, "instruct": str, "ref_audio": str,
          "ref_text": str, "x_vector_only": bool, "non_streaming": bool, "seed": int, "max_seconds": (int, float),
          "voice": str}
SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


@dataclass
class Item:
    line: int
    request: Request
    seed: int | None


def read_lines(path: Path) -> Iterator[tuple[int, dict | str]]:
    """(line number, parsed object) per non-blank line, or (line number, error text)."""
    try:
        handle = open(path, encoding="utf-8")
    except OSError as exc:
        raise OmniTTSError(f"{path}: cannot open manifest ({exc.strerror})") from None
    with handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                yield number, f"malformed JSON ({exc.msg} at column {exc.colno})"
                continue
            yield number, obj if isinstance(obj, dict) else "expected a JSON object"


def parse_item(obj: dict, number: int, base: Path) -> Item:
    """Validate one manifest object's fields (not yet against a checkpoint)."""
    unknown = sorted(set(obj) - set(FIELDS))
    if unknown:
        raise RequestError(f"{unknown[0]}: unknown field; valid fields are {', '.join(FIELDS)}")
    for name, kind in FIELDS.items():
        value = obj.get(name)
        numeric = kind is int or kind == (int, float)
        if value is not None and (not isinstance(value, kind) or (numeric and isinstance(value, bool))):
            expected = "number" if kind == (int, float) else kind.__name__
            raise RequestError(f"{name}: expected {expected}, got {type(value).__name__}")
    if obj.get("max_seconds") is not None and not obj["max_seconds"] > 0:
        raise RequestError(f"max_seconds: must be > 0, got {obj['max_seconds']}")
    item_id = obj.get("id")
    if not item_id:
        raise RequestError("id: missing; every line needs an id (it names the output file)")
    if not SAFE_ID.match(item_id):
        raise RequestError(f"id: {item_id!r} is not a safe file name (letters, digits, '.', '_', '-'; "
                           "not starting with '.' or '-')")
    ref_audio = obj.get("ref_audio")
    if ref_audio is not None:
        ref_audio = Path(ref_audio) if Path(ref_audio).is_absolute() else base / ref_audio
        if not ref_audio.is_file():
            raise RequestError(f"ref_audio: file not found: {ref_audio}")
    request = Request(text=obj.get("text") or "", language=obj.get("language") or "auto",
                      speaker=obj.get("speaker"), instruct=obj.get("instruct"), ref_audio=ref_audio,
                      ref_text=obj.get("ref_text"), x_vector_only=bool(obj.get("x_vector_only", False)),
                      non_streaming=obj.get("non_streaming"), id=item_id, max_seconds=obj.get("max_seconds"),
                      voice=base / obj["voice"] if obj.get("voice") else None)  # a saved voice file
    return Item(number, request, obj.get("seed"))


@dataclass
class BadLine:
    line: int
    id: str  # the line's id, or "line-N" when it has no usable one
    message: str  # "file:line: field: problem"


def check_manifest(path, cfg) -> tuple[list[Item], list[BadLine]]:
    """Every good item of manifest `path` (checked against checkpoint config `cfg`), and the bad lines."""
    path = Path(path)
    items, bad, seen = [], [], {}
    for number, obj in read_lines(path):
        try:
            if isinstance(obj, str):
                raise RequestError(obj)
            item = parse_item(obj, number, path.parent)
            if item.request.id in seen:
                raise RequestError(f"id: {item.request.id!r} already used on line {seen[item.request.id]}")
            resolve(cfg, item.request)
        except RequestError as exc:
            raw_id = obj.get("id") if isinstance(obj, dict) else None
            usable = isinstance(raw_id, str) and SAFE_ID.match(raw_id) and raw_id not in seen
            bad.append(BadLine(number, raw_id if usable else f"line-{number}", f"{path}:{number}: {exc}"))
            continue
        seen[item.request.id] = number
        items.append(item)
    if not items and not bad:
        bad.append(BadLine(0, "line-0", f"{path}: no items (the manifest is empty)"))
    return items, bad
