"""Where manifest rows come from: JSONL, CSV/TSV, Parquet, Arrow and saved Hugging Face datasets.

`open_source(path)` picks a reader from the path: a folder saved with `Dataset.save_to_disk`
(it holds dataset_info.json / state.json), `.csv` / `.tsv`, `.parquet` / `.pq`, `.arrow`; anything
else is JSONL. A file read as text that holds binary data or UTF-16 is refused whole (`_check_text`).
Every reader streams: JSONL and CSV one line at a time, Parquet by record batches, Arrow and datasets
from a memory map, so memory does not grow with the number of rows.

A source yields `(number, row)` pairs in file order, where `row` is a dict of the non-empty cells
(column -> value; CSV empty cells and table nulls/NaNs are left out) or, for a row that cannot be
read at all, the error text. `number` is the file line (JSONL; CSV counting the header as line 1)
or the 1-based row (Parquet, Arrow, datasets); `unit` says which. This module knows nothing about
fields or checkpoints (see manifest.py).
"""

from __future__ import annotations

import csv
import json
import math
import os
import stat
from collections import deque
from pathlib import Path
from typing import Iterator

from ..errors import OmniTTSError
from ..io import unreachable
from ..text import lone_surrogate

BATCH_ROWS = 1024  # rows per record batch for the columnar readers
CSV_CELL_LIMIT = 2**31 - 1  # characters: csv's own limit (128 Ki) stopped a long text's record, and the file, there
PARQUET_BUFFER = 1 << 20  # bytes of a column chunk read at a time


def _open_text(path: Path, **kwargs):
    """A text manifest, read as UTF-8 (a byte order mark, as Windows editors write, is dropped). Bytes that
    are not UTF-8 are kept as lone surrogates (`surrogateescape`), so that one bad line is reported as
    such (`_not_utf8`) and the lines after it are still read."""
    try:
        return open(path, encoding="utf-8-sig", errors="surrogateescape", **kwargs)
    except OSError as exc:
        raise OmniTTSError(f"{path}: cannot open manifest ({exc.strerror})") from None


def _not_utf8(text: str) -> str | None:
    """What is wrong with a line read by `_open_text` whose bytes were not all UTF-8 (None: nothing)."""
    at = lone_surrogate(text)
    if at is None:
        return None
    char = text[at]
    what = f"byte 0x{ord(char) - 0xDC00:02x}" if 0xDC80 <= ord(char) <= 0xDCFF else f"character {char!r}"
    return f"not UTF-8 text ({what} at column {at + 1}; save the file as UTF-8)"


def _nul_cell(columns: list[str], cells: list[str]) -> str | None:
    """What is wrong with a CSV record holding a NUL byte (None: nothing): `_check_text` refuses a file with one
    in its first 64 KiB as binary; one further on is refused on its line, naming the column, not read into a text."""
    for i, cell in enumerate(cells):
        if "\0" in cell:
            name = columns[i] if i < len(columns) and columns[i] else f"cell {i + 1}"
            return (f"{name}: a NUL byte at character {cell.index(chr(0)) + 1} is not text (the file may be damaged "
                    "or have binary data pasted in; remove it)")
    return None


class _TwiceGiven(Exception):
    """A JSON object naming a key twice (json.loads would keep the last value without a word)."""


def _unique_keys(pairs: list) -> dict:
    """json's `object_pairs_hook`: the object, or _TwiceGiven naming the first key given twice."""
    obj = dict(pairs)
    if len(obj) < len(pairs):
        seen: set = set()
        raise _TwiceGiven(next(key for key, _ in pairs if key in seen or seen.add(key)))
    return obj


_DECODER = json.JSONDecoder(object_pairs_hook=_unique_keys)  # one for every line: json.loads makes one a call


def _loads(text: str):
    """`json.loads(text, object_pairs_hook=_unique_keys)`, its errors included, with one decoder for all lines."""
    if text.startswith("\ufeff"):  # as json.loads says it (a second mark: the first was removed)
        raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
    return _DECODER.decode(text)


class JsonlSource:
    """One JSON object per line; blank lines are skipped."""

    unit, typed, columns = "line", True, None  # columns unknown until every line is read

    def __init__(self, path: Path):
        self.path = path

    def _open(self):
        return _open_text(self.path)

    def rows(self, names=None) -> Iterator[tuple[int, dict | str]]:
        with self._open() as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                if (problem := _not_utf8(line)) is not None:
                    yield number, problem
                    continue
                try:
                    # A byte order mark opening a later line too: files saved with one, concatenated (`cat`).
                    # Without its newline, a line cut short is "at column" its end, not column 1 of a next line.
                    obj = _loads(line.removeprefix("\ufeff").removesuffix("\n"))
                except json.JSONDecodeError as exc:
                    yield number, f"malformed JSON ({exc.msg} at column {exc.colno})"
                    continue
                except _TwiceGiven as exc:
                    yield number, f"{exc.args[0]}: given twice in the line; which value counts is unclear, keep one"
                    continue
                except RecursionError:  # arrays or objects nested past Python's recursion limit: not a traceback
                    yield number, "JSON nested too deeply to read (no field takes arrays or objects)"
                    continue
                yield number, obj if isinstance(obj, dict) else f"expected a JSON object ({{...}}), got {_json_kind(obj)}"

    def count(self) -> int:
        with self._open() as handle:
            return sum(1 for line in handle if line.strip())


def _json_kind(value) -> str:
    """What a JSON value that is not an object is, in words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return {list: "an array", str: "a string"}.get(type(value), "a number")


_SEPARATORS = {",": ("commas", ".csv"), "\t": ("tabs", ".tsv")}  # delimiter -> (what it is, its suffix)


def _malformed(exc: csv.Error, delimiter: str) -> str:
    """What is wrong with a record csv's strict reader refused."""
    kind = "TSV" if delimiter == "\t" else "CSV"
    if "expected after" in str(exc):
        return (f"malformed {kind}: a cell opens with a quote and goes on after the quote that closes it; quote the "
                'whole cell and double the quotes inside it ("""Hi,"" he said.")')
    return f"malformed {kind} ({exc})"


class _Lines:
    """The lines of an open text file, for `csv.reader`, noting whether it asked for one past the last, and
    which line it gave last (`number`). The lines of the record being read are kept, so that those after its
    first can be given again (`again`) when the record cannot be read."""

    def __init__(self, handle):
        self.handle, self.ended = handle, False
        self.number = 0
        self.record: list[str] = []  # the lines given since `begin`
        self.pending: deque[str] = deque()  # lines to give again before reading on

    def __iter__(self):
        return self

    def __next__(self) -> str:
        if self.pending:
            line = self.pending.popleft()
        else:
            line = self.handle.readline()
            if not line:
                self.ended = True
                raise StopIteration
        self.number += 1
        self.record.append(line)
        return line

    def begin(self) -> None:
        self.record = []

    def again(self) -> None:
        """Give the current record's lines after its first again: a quote that ran over them belonged to the
        first line alone (`"Hi," he said.` closed by a quote lines later), so they are records of their own."""
        rest = self.record[1:]
        self.pending.extendleft(reversed(rest))
        self.number -= len(rest)
        self.record = []
        self.ended = self.ended and not rest  # (the end is behind the lines given again)


class CsvSource:
    """A header line, then one row per record (quoted cells may span lines); every cell is a string."""

    unit, typed = "line", False

    def __init__(self, path: Path, delimiter: str = ","):
        self.path, self.delimiter = path, delimiter
        with self._open() as handle:
            header = next(csv.reader(handle, delimiter=delimiter), None)
        if not header:
            raise OmniTTSError(f"{path}: empty CSV file (the first line must name the columns)")
        if (problem := _not_utf8(delimiter.join(header))) is not None:
            raise OmniTTSError(f"{path}:1: the header line is {problem}")
        self.columns = [name.strip() for name in header]
        other = "\t" if delimiter == "," else ","
        if len(self.columns) == 1 and other in self.columns[0]:
            (mine, _), (theirs, suffix) = _SEPARATORS[delimiter], _SEPARATORS[other]
            raise OmniTTSError(f"{path}:1: the header is one column, {self.columns[0]!r}, holding {theirs}: a "
                               f"{path.suffix} file is read with {mine}; give the file a {suffix} name")
        twice = next((name for i, name in enumerate(self.columns) if name and name in self.columns[:i]), None)
        if twice is not None:
            raise OmniTTSError(f"{path}:1: the header names column {twice!r} twice; which one to read is unclear")

    def _open(self):
        # A cell over csv's limit raises an error the reader cannot read past: lifted (process-wide), so a long
        # text is one cell as in JSONL, judged by its field's checks (the piece cap), and the lines after it run.
        csv.field_size_limit(max(csv.field_size_limit(), CSV_CELL_LIMIT))
        return _open_text(self.path, newline="")

    def _records(self, handle) -> Iterator[tuple[int, list[str] | str]]:
        """(first line of the record, cells) for every non-blank record after the header; (line, problem)
        for one that cannot be read: the reader goes on at the line after its first (the lines a quote ran
        over are read again), except after a quote never closed, which takes the rest of the file.

        Strict: in a CSV, a cell that opens with a quote and goes on after its closing quote (`"Hi," he said.`) is
        a bad line; the lenient reader dropped the quotes without a word (`Hi, he said.`). A TSV line that cannot
        be read so is read as it is, split at its tabs: TSV (IANA's) has no quoting, Common Voice's sentences
        open with quotes, and a spreadsheet's quoted cells are still read as spreadsheets write them."""
        lines = _Lines(handle)
        reader = csv.reader(lines, delimiter=self.delimiter, strict=True)
        next(reader, None)
        end = lines.number
        while True:
            start = end + 1
            lines.begin()
            try:
                cells = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                # TSV has no quoting of its own: a line not quoted as spreadsheets quote is read as it is, as
                # Common Voice's loader reads its files (`"Hi," he said.`, `"Hello, he said.`); in a CSV it is bad
                tsv = self.delimiter == "\t"
                if tsv or not lines.ended:
                    first = lines.record[0] if lines.record else ""
                    lines.again()
                    end = lines.number
                    yield start, first.rstrip("\r\n").split("\t") if tsv else _malformed(exc, self.delimiter)
                    continue
                cells = None  # strict: "unexpected end of data", inside quotes
            end = lines.number
            if lines.ended:  # a record ends past the last line only inside quotes
                yield start, (f"a quoted cell opened on this line is never closed: lines {start}-{end}, the rest "
                              "of the file, read as one record (close the quote, or double a quote inside a cell)")
                return
            if cells:
                yield start, cells

    def rows(self, names=None) -> Iterator[tuple[int, dict | str]]:
        width = len(self.columns)
        with self._open() as handle:
            for number, cells in self._records(handle):
                if isinstance(cells, str):
                    yield number, cells
                elif (problem := _not_utf8(self.delimiter.join(cells))) is not None:
                    yield number, problem
                elif (problem := _nul_cell(self.columns, cells)) is not None:
                    yield number, problem
                elif len(cells) > width:
                    yield number, (f"{len(cells)} cells but the header names {width} columns "
                                   "(quote cells that contain the delimiter)")
                else:  # "a, Hello., ryan": the spaces after the delimiters are not the values' (as for the header)
                    yield number, {name: cell.strip() for name, cell in zip(self.columns, cells) if cell.strip()}

    def count(self) -> int:
        with self._open() as handle:
            return sum(1 for _ in self._records(handle))


def _read(batches, path: Path, kind: str):
    """The record batches of a columnar file, with a read error past its header (a damaged page, a file cut short)
    as OmniTTSError naming the file, as one at opening it is: pyarrow raises OSError or ArrowInvalid (a ValueError)."""
    try:
        yield from batches
    except (OSError, ValueError) as exc:
        raise OmniTTSError(f"{path}: cannot read {kind} file ({' '.join(str(exc).split())})") from None


def _clean(batch) -> Iterator[dict]:
    """Rows of an Arrow record batch or table, without nulls and NaNs."""
    for row in batch.to_pylist():
        yield {k: v for k, v in row.items() if v is not None and not (isinstance(v, float) and math.isnan(v))}


class ParquetSource:
    """A Parquet file, read one record batch at a time (only the columns asked for)."""

    unit, typed = "row", True

    def __init__(self, path: Path):
        import pyarrow.parquet as pq

        self.path = path
        try:
            # pyarrow's defaults (pre_buffer on, buffer_size 0) read whole column chunks into memory: a
            # 60 MB file peaked at 76-91 MB of Arrow memory (one row group, as pyarrow writes any file
            # under a million rows, or four). Buffered reads of 1 MiB kept it at ~17 MB, flat in the size.
            self.file = pq.ParquetFile(path, pre_buffer=False, buffer_size=PARQUET_BUFFER)
        except (OSError, ValueError) as exc:  # pyarrow raises ArrowInvalid (a ValueError) on bad files
            raise OmniTTSError(f"{path}: cannot read Parquet file ({exc})") from None
        self.columns = list(self.file.schema_arrow.names)

    def rows(self, names=None) -> Iterator[tuple[int, dict | str]]:
        number = 0
        for batch in _read(self.file.iter_batches(batch_size=BATCH_ROWS, columns=names), self.path, "Parquet"):
            for row in _clean(batch):
                number += 1
                yield number, row

    def count(self) -> int:
        return self.file.metadata.num_rows


class ArrowSource:
    """An Arrow IPC file or stream (as `datasets` writes them), memory-mapped, batch by batch."""

    unit, typed = "row", True

    def __init__(self, path: Path):
        import pyarrow as pa

        self.path = path
        try:
            self.columns = list(self._reader().schema.names)
        except (OSError, pa.ArrowInvalid) as exc:
            raise OmniTTSError(f"{path}: cannot read Arrow file ({exc})") from None

    def _reader(self):
        import pyarrow as pa

        source = pa.memory_map(str(self.path))
        try:
            return pa.ipc.open_file(source)
        except pa.ArrowInvalid:  # not the file format: the stream format `datasets` uses
            source.seek(0)
            return pa.ipc.open_stream(source)

    def _batches(self):
        reader = self._reader()
        if hasattr(reader, "num_record_batches"):
            return _read((reader.get_batch(i) for i in range(reader.num_record_batches)), self.path, "Arrow")
        return _read(iter(reader), self.path, "Arrow")

    def rows(self, names=None) -> Iterator[tuple[int, dict | str]]:
        number = 0
        for batch in self._batches():
            if names is not None:
                batch = batch.select(names)
            for start in range(0, batch.num_rows, BATCH_ROWS):
                for row in _clean(batch.slice(start, BATCH_ROWS)):
                    number += 1
                    yield number, row

    def count(self) -> int:
        return sum(batch.num_rows for batch in self._batches())


class DatasetSource:
    """A folder written by `datasets.Dataset.save_to_disk` (its Arrow files are memory-mapped)."""

    unit, typed = "row", True

    def __init__(self, path: Path):
        import datasets

        self.path = path
        try:
            dataset = datasets.load_from_disk(str(path))
        except Exception as exc:  # datasets raises many types for a damaged folder
            raise OmniTTSError(f"{path}: cannot load saved dataset ({type(exc).__name__}: {exc})") from None
        if isinstance(dataset, datasets.DatasetDict):
            raise OmniTTSError(f"{path}: a DatasetDict with splits {', '.join(dataset)}; give one split's "
                               f"folder, e.g. {path / next(iter(dataset))}")
        self.dataset = dataset
        self.columns = list(dataset.column_names)

    def rows(self, names=None) -> Iterator[tuple[int, dict | str]]:
        # Arrow format: no feature decoding (an audio column is never decoded) and no copies.
        dataset = self.dataset.select_columns(names) if names is not None else self.dataset
        number = 0
        for table in dataset.with_format("arrow").iter(batch_size=BATCH_ROWS):
            for row in _clean(table):
                number += 1
                yield number, row

    def count(self) -> int:
        return self.dataset.num_rows


def is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and ((path / "state.json").is_file() or (path / "dataset_info.json").is_file()
                              or (path / "dataset_dict.json").is_file())


def _check_reachable(path: Path) -> None:
    """OmniTTSError where `path` cannot even be looked up (a name too long for the filesystem; for a user, a
    folder above it without search permission): pathlib's checks raise that OSError before Python 3.12, and
    say "not found" after. A missing path is the caller's to report."""
    if why := unreachable(path):
        raise OmniTTSError(f"{path}: cannot open manifest ({why})")


TEXT_PROBE = 1 << 16  # bytes of a text manifest looked at for binary data
# A binary file's opening bytes -> what it likely is (for the message)
MAGIC = {b"RIFF": "a WAV file", b"fLaC": "a FLAC file", b"OggS": "an Ogg file", b"ID3": "an MP3 file",
         b"PAR1": "a Parquet file; name it .parquet", b"ARROW1": "an Arrow file; name it .arrow",
         b"PK\x03\x04": "a zip archive", b"\x1f\x8b": "a gzip file; unpack it first"}


def _check_text(path: Path) -> bytes:
    """OmniTTSError where a manifest read as text (JSONL, CSV/TSV) is not text: UTF-16, or binary data (an audio
    file given by mistake). Read as lines, such a file is hundreds of bad lines, each recorded in OUT; JSON and
    CSV text never hold a NUL byte. Only a regular file is looked at (a pipe that validate reads is read once).
    Returns the file's first bytes that it looked at (b"" where it looked at none)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return b""
        with open(path, "rb") as handle:
            head = handle.read(TEXT_PROBE)
    except OSError as exc:
        raise OmniTTSError(f"{path}: cannot open manifest ({exc.strerror})") from None
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise OmniTTSError(f"{path}: UTF-16 text; manifests are UTF-8: save it as UTF-8")
    if b"\0" in head:
        kind = next((f" (it looks like {what})" for magic, what in MAGIC.items() if head.startswith(magic)), "")
        raise OmniTTSError(f"{path}: not a text manifest: it holds binary data{kind}; give a .jsonl, .csv or .tsv "
                           "file, a .parquet or .arrow file, or a Dataset.save_to_disk folder")
    return head


def _check_json_lines(path: Path, head: bytes) -> None:
    """OmniTTSError where a JSON manifest is one JSON document spread over lines (a JSON array, a pretty-printed
    object), not one object per line: read line by line it was a bad line per line, with no word of why, and the
    one line that happened to hold a whole object (an array's last item) ran alone. Told by its first line, from
    `head`, the first bytes `_check_text` read."""
    text = head.decode("utf-8", errors="replace").removeprefix("\ufeff")
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if first == "{" or (first.startswith("[") and not _whole_json(first)):
        what = "a JSON array" if first.startswith("[") else "one JSON object spread over lines"
        fix = f"jq -c '.[]' {path}" if first.startswith("[") else f"jq -c . {path}"
        raise OmniTTSError(f"{path}: {what}, not JSON Lines; a manifest holds one JSON object per line: write it "
                           f"so ({fix} > lines.jsonl)")


def _whole_json(line: str) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def check_rereadable(path) -> None:
    """OmniTTSError unless manifest `path` can be read more than once (synth checks it, counts it, runs it):
    a regular file or a folder. A pipe (`cat ... |` into /dev/stdin, `<(...)`, a FIFO) is empty the second
    time, so it is refused rather than silently running nothing; a missing path is open_source's to report."""
    path = Path(path)
    _check_reachable(path)
    what = ("standard input" if str(path) == "-" else None if not path.exists() or path.is_file() or path.is_dir()
            else "a pipe" if path.is_fifo() else "a device" if path.is_char_device() or path.is_block_device()
            else "a socket" if path.is_socket() else "a special file")
    if what is not None:
        raise OmniTTSError(f"{path}: a manifest is read more than once (checked, counted, run), so it is a file, not "
                           f"{what}: save it first (... > lines.jsonl)")


def state(path) -> tuple | None:
    """What changes when manifest `path` is written to: a file's size, modification time and inode; a folder's
    (a saved dataset) those of its files. None where it cannot be looked at. synth compares the state before its
    first pass with the state at its end: lines added or edited in between were not all checked."""
    path = Path(path)
    try:
        if path.is_dir():
            return tuple(sorted((entry.name, (info := entry.stat()).st_size, info.st_mtime_ns) for entry in
                                os.scandir(path) if entry.is_file()))
        info = os.stat(path)
    except OSError:
        return None
    return info.st_size, info.st_mtime_ns, info.st_ino, info.st_dev


def open_source(path) -> JsonlSource | CsvSource | ParquetSource | ArrowSource | DatasetSource:
    """The reader for `path`, picked from its suffix, or a saved dataset for a folder."""
    path = Path(path)
    _check_reachable(path)
    if path.is_dir():
        if is_saved_dataset(path):
            return DatasetSource(path)
        raise OmniTTSError(f"{path}: a folder but not a saved dataset (no state.json or dataset_info.json); "
                           "give a .jsonl, .csv, .tsv, .parquet or .arrow file or a Dataset.save_to_disk folder")
    if not path.exists():
        if str(path) == "-":
            raise OmniTTSError("-: a manifest is a file, not standard input: save it first (... > lines.jsonl)")
        raise OmniTTSError(f"{path}: cannot open manifest (No such file or directory)")
    suffix = path.suffix.lower()
    head = _check_text(path) if suffix not in (".parquet", ".pq", ".arrow") else b""
    if suffix in (".csv", ".tsv"):
        return CsvSource(path, "\t" if suffix == ".tsv" else ",")
    if suffix in (".parquet", ".pq"):
        return ParquetSource(path)
    if suffix == ".arrow":
        return ArrowSource(path)
    _check_json_lines(path, head)
    return JsonlSource(path)
