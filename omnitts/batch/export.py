"""Exporting an output directory's finished items as a Hugging Face `datasets` dataset.

The dataset is built in a temporary sibling of the target (`.<name>.omnitts-<random>.tmp`) and
renamed into place when complete, so a fault part-way (a full disk) leaves the target as it was:
absent, or the previous export. An existing target is replaced only if it is a saved dataset (or
empty): a folder of other files is never deleted. The sibling holds a lock file, locked while its export
runs: an export first deletes the siblings of its target whose lock is free (a killed export's, which
held a copy of the audio), never a live one's.
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterable

from ..errors import OmniTTSError
from ..io import unreachable
from ..io.atomic import TEMP_MARK
from .claims import open_locked
from .folder import check_out
from .ledger import Ledger

DATASET_FILES = ("dataset_info.json", "state.json")  # what save_to_disk writes beside the Arrow files
# An export's columns: the only saved dataset an export replaces is one with these (an earlier export)
COLUMNS = ("id", "text", "language", "speaker", "instruct", "audio", "seconds", "frames", "seed")
WORK_LOCK = ".omnitts-export.lock"  # in the temporary sibling: locked while its export runs


class ExportError(OmniTTSError):
    """The export target cannot be used (it is a file, or a folder of something else)."""


def check_target(target: Path, out: Path | None = None, manifest: Path | None = None) -> None:
    """Raise ExportError unless `target` is absent, an empty folder, or a dataset an export may replace,
    and (given the output directory `out`) neither `out` nor a folder holding it, and (given the `manifest`)
    neither the manifest nor a folder holding it: a saved dataset read as the manifest is one an export would
    replace, deleting the input (its other columns too)."""
    target = Path(target)
    if out is not None:
        where, out = target.resolve(), Path(out).resolve()
        if where == out or where in out.parents:
            raise ExportError(f"--export-dataset {target}: is the output directory or holds it; an export replaces "
                              "its target, so choose a folder outside --out")
        if out in where.parents:  # OUT holds its items' files and nothing else (a later run sweeps, --strict checks)
            raise ExportError(f"--export-dataset {target}: is inside the output directory {out}; choose a folder "
                              "outside --out")
    if manifest is not None:
        where, source = target.resolve(), Path(manifest).resolve()
        if where == source or where in source.parents:
            raise ExportError(f"--export-dataset {target}: is the manifest or holds it; an export replaces its "
                              "target, so choose another folder")
    if why := unreachable(target, follow=False):
        raise ExportError(f"--export-dataset {target}: {why}")
    # Built beside the target, then renamed into place: its folder must take new files (not under a file, not
    # read-only), or the export fails once every item is synthesized
    check_out(target.parent, "--export-dataset", target)
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise ExportError(f"--export-dataset {target}: is not a folder (choose a folder; omnitts creates it)")
    if target.is_dir() and any(target.iterdir()):  # replaced only if it is an earlier export
        if not all((target / f).is_file() for f in DATASET_FILES):
            raise ExportError(f"--export-dataset {target}: is a folder that holds something else than a saved "
                              "dataset; an export replaces its target, so choose an empty or new folder")
        if (columns := _columns(target)) != set(COLUMNS):
            shown = ", ".join(sorted(columns)) if columns else "unreadable dataset_info.json"
            raise ExportError(f"--export-dataset {target}: is a saved dataset that is not an omnitts export (its "
                              f"columns: {shown}); an export replaces its target, so choose an empty or new folder")


def _columns(folder: Path) -> set[str] | None:
    """The column names of the saved dataset `folder` (its dataset_info.json's features), None if unreadable."""
    import json

    try:
        features = json.loads((folder / "dataset_info.json").read_text(encoding="utf-8")).get("features")
    except (OSError, ValueError, AttributeError):
        return None
    return set(features) if isinstance(features, dict) else None


def sf_rate(path: Path) -> int:
    import soundfile as sf

    return sf.info(str(path)).samplerate


def export_dataset(out: Path, items: Iterable, target: Path) -> int:
    """Write the done items of `items` (manifest order) as a `datasets` dataset with an Audio column.

    A row per item whose last record is good and whose file is intact (`Ledger.is_done`), with that
    record's seconds, frames and seed. Rows are appended one at a time to an Arrow file (then
    memory-mapped and saved with `save_to_disk`), so memory stays flat; returns the row count.

    The audio column is `Audio(decode=False)`: each row holds the file's encoded bytes and name, so
    `load_from_disk(target)[0]` works on any install. (datasets 4 decodes `Audio` with torchcodec,
    which needs a torch and FFmpeg libraries that match; omnitts does not depend on it.) Decode a row
    with `soundfile.read(io.BytesIO(row["audio"]["bytes"]))`, or, where torchcodec works,
    `dataset.cast_column("audio", datasets.Audio())`.
    """
    import datasets
    from datasets.arrow_writer import ArrowWriter

    check_target(target)
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    _sweep_work(target)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}{TEMP_MARK}", suffix=".tmp", dir=target.parent))
    lock = None
    try:
        lock = open_locked(work / WORK_LOCK, create=True)  # held until the export ends, however it ends
        count, dataset = _write(out, items, work, datasets, ArrowWriter)
        dataset.save_to_disk(str(work / "dataset"))
        del dataset  # (its memory map of rows.arrow)
        previous = work / "previous"
        if target.exists():  # the previous export: out of the way, then the new one in (two renames)
            os.rename(target, previous)
        try:
            os.rename(work / "dataset", target)
        except BaseException:
            if previous.exists():
                os.rename(previous, target)
            raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if lock is not None:
            os.close(lock)
    return count


def _sweep_work(target: Path) -> None:
    """Delete the temporary siblings of `target` that no running export holds (their lock file is there and
    free: a killed export's); best effort."""
    for work in target.parent.glob(f".{glob.escape(target.name)}{TEMP_MARK}*.tmp"):
        if work.is_symlink() or not work.is_dir():
            continue
        try:  # no lock file yet: an export that starts now (or that died as it started, leaving an empty folder)
            lock = open_locked(work / WORK_LOCK, create=False)
        except OSError:
            continue
        if lock is None:
            continue  # a live export's, or one that has not made its lock yet
        try:
            shutil.rmtree(work, ignore_errors=True)
        finally:
            os.close(lock)


def _write(out: Path, items: Iterable, work: Path, datasets, ArrowWriter):
    """The rows of the done items, appended one at a time to `work`/rows.arrow -> (count, dataset)."""
    datasets.disable_progress_bars()
    ledger = Ledger(out)
    features = datasets.Features({
        "id": datasets.Value("string"), "text": datasets.Value("string"), "language": datasets.Value("string"),
        "speaker": datasets.Value("string"), "instruct": datasets.Value("string"),
        "audio": {"bytes": datasets.Value("binary"), "path": datasets.Value("string")},
        "seconds": datasets.Value("float32"), "frames": datasets.Value("int32"), "seed": datasets.Value("int64"),
    })
    assert tuple(features) == COLUMNS, tuple(features)  # check_target knows an earlier export by them
    count, rate = 0, None
    with ArrowWriter(features=features, path=str(work / "rows.arrow")) as writer:
        for item in items:
            r = item.request
            if not ledger.is_done(r.id, out):
                continue
            rec = ledger.done[r.id]
            path = Path(out) / rec.path
            if rate is None and rec.samples != 0:  # (an empty flac or ogg file has no header)
                rate = sf_rate(path)
            writer.write({"id": r.id, "text": r.text, "language": r.language, "speaker": r.speaker,
                          "instruct": r.instruct, "audio": {"bytes": path.read_bytes(), "path": path.name},
                          "seconds": float(rec.seconds), "frames": int(rec.frames), "seed": _seed(rec.seed)})
            count += 1
        writer.finalize()
    dataset = datasets.Dataset.from_file(str(work / "rows.arrow"))
    return count, dataset.cast_column("audio", datasets.Audio(sampling_rate=rate, decode=False))


def _seed(seed: int | None) -> int | None:
    """A record's seed as the int64 column holds it: records made before seeds were held to 64 bits may hold a
    larger one, which keyed the noise by its low 64 bits; that word (`sampling.seed_word`) is the same seed."""
    from ..params import SEEDS
    from ..sampling import seed_word

    return seed if seed is None or SEEDS[0] <= seed <= SEEDS[1] else seed_word(seed)
