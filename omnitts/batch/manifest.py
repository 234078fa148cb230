"""Reading a manifest into requests, with errors that name the file, line (or row) and field.

The primary form is JSONL, one JSON object per line (blank lines are skipped):
    {"id": "intro", "text": "Hello.", "language": "english", "speaker": "ryan"}
CSV/TSV (a header line), Parquet, Arrow and folders saved with `datasets.Dataset.save_to_disk` work
too (readers in sources.py). Fields: id, text, language, speaker, instruct, ref_audio, ref_text,
x_vector_only, non_streaming, seed, max_seconds, voice (a saved .safetensors voice; only its path is
checked here, and its mode where a line gives x_vector_only) and the per-item sampling overrides
temperature, top_k, top_p, repetition_penalty.
Relative `ref_audio` / `voice` paths resolve against the manifest's folder.

Columns (JSON keys) name fields directly, or through `columns={field: column}`. In tables, other
columns are ignored, nulls and empty CSV cells count as absent, and CSV cells are converted to the
field's type. Errors read `file:line: field: problem` (`file:row N: ...` for Parquet, Arrow, datasets).

`iter_manifest` streams `Item | BadLine` in file order, each row checked against a checkpoint
(checker.py); memory grows only with the set of ids seen (duplicate detection). `check_manifest` is the
list form, `count_rows` a cheap total for a progress bar.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Iterator

from ..errors import OmniTTSError, RequestError, did_you_mean, type_label
from ..io import unreachable, user_path
from ..io.versioned import per_version
from ..params import LARGEST, seed_problem
from ..request import Request
from ..text import empty_text
from ..text.prompt import check_reference_paths, not_text
from .checker import LineChecker
from .clips import read_reference
from .sources import JsonlSource, open_source

NUMBER = (int, float)
FIELDS = {"id": str, "text": str, "language": str, "speaker": str, "instruct": str, "ref_audio": str,
          "ref_text": str, "x_vector_only": bool, "non_streaming": bool, "seed": int, "max_seconds": NUMBER,
          "voice": str, "temperature": NUMBER, "top_k": int, "top_p": NUMBER, "repetition_penalty": NUMBER}
FIELD_NAMES = frozenset(FIELDS)
# The types a field's value passes check_fields' type check by at once (the common case: no isinstance chain)
_EXACT = {name: (int, float) if kind == NUMBER else (kind,) for name, kind in FIELDS.items()}
INT_FIELDS = tuple(name for name, kind in FIELDS.items() if kind is int)
SAMPLING = ("temperature", "top_k", "top_p", "repetition_penalty")  # per-item SamplingParams overrides
MAX_ID = 200  # characters: with a suffix such as ".codes.npy" an id still fits a 255-byte file name
SAFE_ID = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_ID - 1}}}\Z")  # .match: \Z, not $ (which allows "id\n")
_TRUE, _FALSE = {"true", "1", "yes", "y", "t"}, {"false", "0", "no", "n", "f"}


@dataclass
class Item:
    line: int  # file line (JSONL, CSV) or 1-based row (Parquet, Arrow, datasets)
    request: Request
    seed: int | None
    voice_path: Path | None = None  # saved voice to load before synthesis (request.voice stays None)
    sampling: dict = field(default_factory=dict)  # overrides for SamplingParams, keys from SAMPLING


@dataclass
class BadLine:
    line: int  # 0 for a problem with the whole file
    id: str  # the line's id, or `placeholder(unit, line)` when it has no usable one
    message: str  # "file:line: field: problem" (or "file:row N: field: problem")


# Device names Windows reserves whatever follows their first dot ("NUL.tar.gz" is NUL): an id so named makes a file
# that cannot be created or copied there (CON.wav), though it is a file here
WINDOWS_DEVICES = re.compile(r"(CON|PRN|AUX|NUL|COM[0-9]|LPT[0-9])(\.|\Z)", re.IGNORECASE)


def id_problem(item_id: str) -> str | None:
    """Why `item_id` cannot name an output file (None when it can): what is wrong, with the id shortened."""
    if SAFE_ID.match(item_id):
        return None
    shown = repr(item_id if len(item_id) <= 60 else item_id[:40] + "..." + item_id[-10:])
    if len(item_id) > MAX_ID and SAFE_ID.match(item_id[:MAX_ID]):
        return f"{shown} is {len(item_id)} characters long; an id names a file: at most {MAX_ID}"
    return f"{shown} is not a safe file name (ASCII letters, digits, '.', '_', '-'; not starting with '.' or '-')"


def location(path, unit: str, number: int) -> str:
    """Where line (or row) `number` of manifest `path` is, as its messages begin: "m.jsonl:3", "t.parquet:row 3"."""
    return f"{path}:{number}" if unit == "line" else f"{path}:{unit} {number}"


def placeholder(unit: str, number: int) -> str:
    """The id a bad line without a usable one is recorded under: "line:N" (or "row:N"). SAFE_ID never
    allows ':', so it cannot be a real item's id (or a file name on any system)."""
    return f"{unit}:{number}"


def read_lines(path: Path) -> Iterator[tuple[int, dict | str]]:
    """(line number, parsed object) per non-blank JSONL line, or (line number, error text)."""
    return JsonlSource(Path(path)).rows()


def column_map(specs=(), id_column: str | None = None, text_column: str | None = None) -> dict[str, str]:
    """{field: column} from "FIELD=COLUMN" strings and the id/text shortcuts; OmniTTSError if malformed."""
    pairs = [(spec, *spec.split("=", 1)) if "=" in spec else (spec, None, None) for spec in specs or ()]
    pairs += [(f"--{name}-column {col}", name, col) for name, col in (("id", id_column), ("text", text_column)) if col]
    mapping: dict[str, str] = {}
    for spec, name, column in pairs:
        name, column = (name or "").strip(), (column or "").strip()
        if not name or not column:
            raise OmniTTSError(f"--column {spec!r}: expected FIELD=COLUMN, e.g. text=sentence")
        if name not in FIELDS:
            raise OmniTTSError(f"--column {spec!r}: unknown field {name!r}{did_you_mean(name, FIELDS)}; valid "
                               f"fields are {', '.join(FIELDS)}")
        if mapping.get(name, column) != column:
            raise OmniTTSError(f"{name}: mapped to two columns, {mapping[name]!r} and {column!r}")
        other = next((f for f, c in mapping.items() if c == column and f != name), None)
        if other:
            raise OmniTTSError(f"column {column!r} is mapped to both {other} and {name}")
        mapping[name] = column
    return mapping


def parse_item(obj: dict, number: int, base: Path, columns: dict | None = None) -> Item:
    """Validate one row's fields (typed values, field names as keys; not yet against a checkpoint)."""
    columns = columns or {}
    unknown = sorted(obj.keys() - FIELD_NAMES)
    if unknown:
        raise RequestError(f"{unknown[0]}: unknown field{did_you_mean(unknown[0], FIELDS)}; valid fields are "
                           f"{', '.join(FIELDS)}")
    check_fields(obj)
    item_id = obj.get("id")
    if not item_id:
        raise RequestError(f"id: missing{_from(columns, 'id')}; every line needs an id (it names the output file)")
    if problem := id_problem(item_id):
        raise RequestError(f"id: {problem}")
    if obj.get("text") is None:
        raise RequestError(f"text: missing{_from(columns, 'text')}; give the words to speak")
    if problem := empty_text(obj["text"]):
        raise RequestError(f"text: {problem}; give the words to speak")
    check_reference_paths(obj.get)  # before the paths resolve against the manifest's folder
    if obj.get("ref_audio") is not None and obj.get("voice") is not None:
        raise RequestError("voice: give either ref_audio or voice, not both")
    ref_audio, voice = _path(obj.get("ref_audio"), base), _path(obj.get("voice"), base)
    for name, path in (("ref_audio", ref_audio), ("voice", voice)):
        if path is not None and (why := unreachable(path)):
            raise RequestError(f"{name}: cannot read {path} ({why})")
    if ref_audio is not None:
        problem = _audio_problem(str(ref_audio), icl=not obj.get("x_vector_only"))
        if problem:
            raise RequestError(f"ref_audio: {problem}")
    if voice is not None:
        if not voice.is_file():
            raise RequestError(f"voice: {'not a file' if voice.exists() else 'file not found'}: {voice}")
        if voice.suffix.lower() != ".safetensors":
            raise RequestError(f"voice: {voice} is not a .safetensors voice file (save one with voice-clone --save)")
    x_vector_only = bool(obj.get("x_vector_only", False))
    if voice is not None and isinstance(obj.get("x_vector_only"), bool):
        # The value that says the mode the voice was saved in runs (as false: it says nothing more), the other is a
        # bad line (`voice.mode_conflict`). One read of the file's header, per file version.
        from ..voice import mode_conflict  # (torch: only where a line names a voice)

        if problem := mode_conflict(x_vector_only, mode := _voice_mode(voice), f"voice {voice}"):
            raise RequestError(problem)
        x_vector_only = x_vector_only and mode is None
    request = Request(text=obj["text"], language=obj.get("language") or "auto",
                      speaker=obj.get("speaker"), instruct=obj.get("instruct"), ref_audio=ref_audio,
                      ref_text=obj.get("ref_text"), x_vector_only=x_vector_only,
                      non_streaming=obj.get("non_streaming"), id=item_id, max_seconds=obj.get("max_seconds"))
    sampling = {name: obj[name] for name in SAMPLING if obj.get(name) is not None}
    return Item(number, request, obj.get("seed"), voice, sampling)


def check_fields(obj: dict) -> None:
    """The type and range of each field `obj` gives (None is absent): RequestError naming the field. The
    API checks its keyword arguments and `Request`s with it too."""
    for name, kind in FIELDS.items():
        value = obj.get(name)
        if value is None:
            continue
        if type(value) not in _EXACT[name]:  # a subclass (np.float64, a str subclass) or a wrong type
            numeric = kind is int or kind == NUMBER
            if not isinstance(value, kind) or (numeric and isinstance(value, bool)):
                expected = "number" if kind == NUMBER else kind.__name__
                raise RequestError(f"{name}: expected {expected}, got {type_label(type(value))}")
        if isinstance(value, str) and (problem := not_text(value)):
            raise RequestError(f"{name}: {problem}")
    _check_ranges(obj)


def _from(columns: dict, name: str) -> str:
    return f" (read from column {columns[name]!r})" if name in columns else ""


_RANGES = (("max_seconds", "> 0", lambda v: v > 0), ("temperature", "> 0", lambda v: v > 0),
           ("repetition_penalty", "> 0", lambda v: v > 0), ("top_p", "in (0, 1]", lambda v: 0 < v <= 1),
           ("top_k", ">= 0 (0 = off)", lambda v: v >= 0))  # (field, rule in words, whether a value keeps it)


def _check_ranges(obj: dict) -> None:
    if problem := seed_problem(obj.get("seed")):
        raise RequestError(f"seed: {problem}")
    for name, rule, ok in _RANGES:
        value = obj.get(name)
        if value is None:
            continue
        if value != value or not ok(value):  # NaN (math.isnan raised OverflowError for an int past a float's range)
            raise RequestError(f"{name}: must be {rule}, got {value}")
        if value > LARGEST[name]:  # infinity, or past what the engine's float32 / int64 tensors hold
            raise RequestError(f"{name}: must be at most {LARGEST[name]:.4g}, got {value}")


def _path(value: str | None, base: Path) -> Path | None:
    if value is None:
        return None
    path = user_path(value)  # "~/v.safetensors" is in the home folder, as the API takes it
    return path if path.is_absolute() else base / path


@per_version()  # as clips.read_reference: many lines name one voice
def _voice_mode(path: str) -> str | None:
    """The mode voice file `path` was saved in (`voice.saved_mode`), its header read once per file version."""
    from ..voice import saved_mode

    return saved_mode(path)


def _audio_problem(path: str, icl: bool = True) -> str | None:
    """Why reference audio `path` cannot be used, or None: what synthesis checks (the clip is read, at most
    30 s of it, once per file)."""
    from ..io.audio import not_a_file

    if not Path(path).is_file():
        return f"{not_a_file(Path(path)).removeprefix('is ')}: {path}"
    return read_reference(path, icl)[0]


def _from_text(row: dict) -> dict:
    """CSV cells (strings) -> the fields' types; RequestError naming the field."""
    out = {}
    for name, value in row.items():
        kind, text = FIELDS.get(name), value.strip()
        try:
            if kind is bool:
                if text.lower() not in _TRUE | _FALSE:
                    raise ValueError
                value = text.lower() in _TRUE
            elif kind is int:
                value = _whole(_json_number(text))
            elif kind == NUMBER:
                value = float(_json_number(text))
        except ValueError:
            expected = {bool: "true or false", int: "an integer"}.get(kind, "a number")
            raise RequestError(f"{name}: expected {expected}, got {value!r}") from None
        out[name] = value
    return out


def _json_number(text: str) -> str:
    """`text` where it is written as a JSON number may be, else ValueError: Python's int() and float() also read
    "1_000" and other scripts' digits ("\u0661\u0662", Arabic-Indic 12), which a JSON line refuses."""
    if "_" in text or not text.isascii():
        raise ValueError(text)
    return text


def _whole(text: str) -> int:
    """An integer cell: digits, or a whole number written as a float ("7.0": pandas writes an integer column
    with gaps so); ValueError for anything else (a fraction, nan, inf)."""
    try:
        return int(text)
    except ValueError:
        number = float(text)
        if not number.is_integer():
            raise ValueError(text) from None
        return int(number)


def _typed_values(row: dict) -> dict:
    """Typed values (JSON, Parquet, Arrow): integer ids become strings (a whole float too: an id column of
    integers with gaps, as pandas stores it), whole floats in integer fields become ints, as pandas writes them
    (an integer column with gaps is stored as floats, `to_json` writes 7.0), and decimals are numbers."""
    out = dict(row)
    for name, value in out.items():  # a SQL or Spark DECIMAL column (Parquet's decimal128) holds numbers too
        if isinstance(value, Decimal) and (name == "id" or FIELDS.get(name) in (int, NUMBER)):
            whole = value.is_finite() and value == value.to_integral_value()  # exact: a float would round a seed
            # (a signalling NaN, which float() refuses, is NaN: refused by the range check, naming the field)
            out[name] = (int(value) if whole and FIELDS[name] is not NUMBER
                         else float("nan") if value.is_snan() else float(value))
    if isinstance(out.get("id"), float) and out["id"].is_integer():
        out["id"] = int(out["id"])  # 7.0 is the id 7, "7", not "7.0"
    if isinstance(out.get("id"), int) and not isinstance(out["id"], bool):
        out["id"] = str(out["id"])
    for name in INT_FIELDS:
        value = out.get(name)
        if isinstance(value, float) and value.is_integer():
            out[name] = int(value)  # pandas stores an integer column with gaps as floats
    return out


def _rename(obj: dict, columns: dict) -> dict:
    """A JSON object's keys -> field names under the column mapping."""
    if not columns:
        return obj
    fields_of = {column: name for name, column in columns.items()}
    out = {}
    for key, value in obj.items():
        if key in fields_of:
            out[fields_of[key]] = value
        elif key in columns:
            raise RequestError(f"{key}: this key is ignored because {key} is read from {columns[key]!r}; remove it")
        else:
            out[key] = value
    return out


def _table_plan(available: list[str], columns: dict) -> tuple[dict[str, str], str | None]:
    """{field: column} to read from a table, or a problem with the whole file."""
    listing = ", ".join(repr(c) for c in available)
    for name, column in columns.items():
        if column not in available:
            return {}, f"column {column!r} (mapped to {name}) not found; the columns are {listing}"
    taken = set(columns.values())
    plan = {name: columns.get(name, name) for name in FIELDS if name in columns or name not in taken}
    plan = {name: column for name, column in plan.items() if column in available}
    # Parquet and Arrow allow one name on two columns (a CSV header too is refused so, sources.py): pyarrow read
    # the last of them without a word, or raised a KeyError while the rows were read.
    twice = next((column for column in plan.values() if available.count(column) > 1), None)
    if twice is not None:
        return {}, f"column {twice!r} is in the table {available.count(twice)} times; which one to read is unclear"
    for name in ("id", "text"):
        if name not in plan and name in available:  # its own column is read as another field
            other = next(field for field, column in columns.items() if column == name)
            return {}, (f"the {name!r} column is read as {other} (--column {other}={name}), so no column gives "
                        f"{name}; map one with --{name}-column NAME")
        if name not in plan:
            return {}, f"no {name!r} column; the columns are {listing}; map one with --{name}-column NAME"
    return plan, None


def iter_manifest(path, cfg=None, columns: dict | None = None, split_chars: int | None = None,
                  fold_case: Path | None = None, max_frames: int | None = None,
                  official_tokenizer: bool = False) -> Iterator[Item | BadLine]:
    """Every row of manifest `path`, in file order, as a good `Item` or a `BadLine`, read lazily.

    `cfg` (from `omnitts.config.load_config`) adds the checkpoint checks, saved voices included
    (made with this checkpoint, see `Voices`); None checks fields only. An id belongs to the first
    line that uses it, good or bad: a later line with that id is a bad line (a duplicate).
    `columns` maps fields to columns (JSON keys), see `column_map`; `split_chars` is synth's
    `--split-chars` (the piece count a line may make), `max_frames` its `--max-frames` and `official_tokenizer` its
    `--official-tokenizer` (a piece's talker positions, see `checker.LineChecker`). `fold_case`: the output folder when
    its filesystem folds case (`outdir.folds_case`): there an id equal to an earlier one ignoring case names
    the same file, so it is a duplicate too. A problem with the whole file (a
    mapped column that is missing, an empty manifest) is one `BadLine` with line 0; a file that cannot
    be opened raises OmniTTSError. Items keep only their id in memory after they are yielded.
    """
    path, columns = Path(path), dict(columns or {})
    source = open_source(path)
    unit = source.unit
    if source.columns is None:
        rows = source.rows()
    else:
        plan, problem = _table_plan(source.columns, columns)
        if problem:
            yield BadLine(0, placeholder(unit, 0), f"{path}: {problem}")
            return
        rows = ((n, r if isinstance(r, str) else {f: r[c] for f, c in plan.items() if c in r})
                for n, r in source.rows(sorted(set(plan.values()))))
    key = str.lower if fold_case else str  # what makes two ids one file name (ids are ASCII: SAFE_ID)
    seen: dict[str, int] = {}  # key(id) -> the line that took it
    spelled: dict[str, str] = {}  # key(id) -> that line's id where it differs (upper-case letters, fold_case)
    taken_by_bad: set[str] = set()  # keys of bad lines' ids (they run under that id only once fixed)
    checker = LineChecker(cfg, split_chars, max_frames, official_tokenizer) if cfg is not None else None
    empty, base = True, path.parent  # (relative ref_audio and voice paths resolve against base)
    for number, row in rows:
        empty = False
        try:
            if isinstance(row, str):
                raise RequestError(row)
            if source.columns is None:
                obj = _typed_values(_rename(row, columns))
            else:
                obj = _typed_values(row) if source.typed else _from_text(row)
            item = parse_item(obj, number, base, columns)
            item_id = item.request.id
            name = key(item_id)
            if name in seen:
                line, first = seen[name], spelled.get(name, name)
                bad = " (a bad line: fix that one, or give this line another id)" if name in taken_by_bad else ""
                if first == item_id:
                    raise RequestError(f"id: {item_id!r} already used on {unit} {line}{bad}")
                raise RequestError(f"id: {item_id!r} names the same file as {unit} {line}'s {first!r} on this "
                                   f"case-insensitive filesystem ({fold_case}){bad}")
            if checker is not None:
                checker.check(item)
        except RequestError as exc:
            raw_id = _id_of(row, columns if source.columns is None else {})
            usable = isinstance(raw_id, str) and SAFE_ID.match(raw_id) and key(raw_id) not in seen
            if usable:  # the id is taken: a later line with it must not run in its place
                _take(seen, spelled, key, raw_id, number)
                taken_by_bad.add(key(raw_id))
            yield BadLine(number, raw_id if usable else placeholder(unit, number), f"{location(path, unit, number)}: {exc}")
            continue
        _take(seen, spelled, key, item.request.id, number)
        yield item
    if empty:
        yield BadLine(0, placeholder(unit, 0), f"{path}: no items (the manifest is empty)")


def _id_of(row, columns: dict) -> str | None:
    """The id a bad line names, as a good line's is read: from the column mapped to id (`columns`: a JSON line's
    mapping; a table's rows are keyed by field already), an integer or a whole float as its digits. Not the key
    "id" that a mapping ignores, and 7.0 is the id "7" here too: the id is taken by this line."""
    if not isinstance(row, dict):
        return None
    return _typed_values({"id": row.get(columns.get("id", "id"))})["id"]


def _take(seen: dict, spelled: dict, key, item_id: str, number: int) -> None:
    """Line `number` takes `item_id`; its spelling is kept where it is not its key (for the message)."""
    seen[key(item_id)] = number
    if key(item_id) != item_id:
        spelled[key(item_id)] = item_id


def check_manifest(path, cfg, columns: dict | None = None) -> tuple[list[Item], list[BadLine]]:
    """Every good item of manifest `path` (checked against checkpoint config `cfg`), and the bad lines."""
    items, bad = [], []
    for entry in iter_manifest(path, cfg, columns):
        (bad if isinstance(entry, BadLine) else items).append(entry)
    return items, bad


def count_rows(path) -> int:
    """How many rows `iter_manifest(path)` will yield (non-blank lines, records, rows), without parsing them.

    Free for Parquet, Arrow and datasets (metadata); one streaming pass for JSONL and CSV.
    """
    return open_source(path).count()
